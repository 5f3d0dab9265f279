"""A user's numba router against the same logic built in, and what its first and second use cost.

    python bench/bench_user_policy.py                  # 1,000,000 requests, 3 alternating repeats
    python bench/bench_user_policy.py --requests 100000

`policies.examples:least_outstanding` is the built-in `least-outstanding` written as a user's
router (tests/differential/test_user_policies.py checks that both replay identically), so the
ratio of their engine times is the cost of calling a user's kernel by address instead of
inlining a built-in one. Engine time is construction plus every advance (the ticks' Python work
excluded), the garbage collector off, runs alternated and the median taken: the machine is
shared. The compile figures come from two fresh processes with a fresh user-module cache: the
first compiles the user's router (the engine's own kernels are already cached), the second
loads it from numba's cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

# The probe each fresh process runs: import a user's router module and resolve it as a config would.
PROBE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {folder!r})
    started = time.perf_counter()
    import bench_router
    from policies.user_config import user_policy
    from policies.plugins import load_plugins
    load_plugins(["bench_router"])
    user_policy("bench_router:least_outstanding", "router")
    print(time.perf_counter() - started, sum(bench_router.least_outstanding.kernel.stats.cache_hits.values()))
""")


def engine_seconds(inputs, policy=None) -> float:
    """Engine time (bench_replay.engine_seconds) of `inputs`, with `policy` as every pool's router."""
    from bench_replay import engine_seconds as timed
    from replay.testing import with_user_policies

    return timed(with_user_policies(inputs, policy) if policy is not None else inputs)


def compile_figures() -> tuple[float, float, int]:
    """(first process s, second process s, cache hits in the second) for a user's router module."""
    import policies.examples

    folder = tempfile.mkdtemp(prefix="bench-user-policy-")
    try:
        shutil.copy(policies.examples.__file__, os.path.join(folder, "bench_router.py"))
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(folder, "cache"))
        # The engine's kernels stay in their usual cache; only the user module's cache is fresh.
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", PROBE.format(folder=folder)], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            runs.append((float(out[0]), int(out[1]) if len(out) > 1 else 0))
        return runs[0][0], runs[1][0], runs[1][1]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from policies import examples
    from replay.config import FleetConfig, PoolConfig
    from replay.fleet.cluster import build_inputs, plan_pools
    from replay.fleet.split import assign_pools
    from traces import load_trace
    from traces.synthetic import poisson_trace

    cfg = FleetConfig(model="llama-3.1-8b", gpu="h100-sxm-80gb", pools=(PoolConfig(name="default", replicas=64),))
    plans = plan_pools(cfg)
    conv = load_trace("azure-conv-2023")

    def inputs_for(n: int):
        trace = poisson_trace(conv, requests=n, rate_rps=250.0, seed=1)
        return build_inputs(trace.frame, trace.prefix_block_tokens, plans, assign_pools(trace.frame["workload"], plans))

    warm = inputs_for(1000)
    engine_seconds(warm)
    engine_seconds(warm, examples.least_outstanding)  # kernels and the user's router: not timed
    inputs = inputs_for(args.requests)
    built_in, user = [], []
    for _ in range(args.repeats):
        built_in.append(engine_seconds(inputs))
        user.append(engine_seconds(inputs, examples.least_outstanding))
    b, u = statistics.median(built_in), statistics.median(user)
    print(f"{args.requests:,} Poisson requests at 250 req/s (Azure conv lengths) on 64 x llama-3.1-8b, engine time, "
          f"median of {args.repeats}:")
    print(f"  built-in least-outstanding        {b:7.2f} s")
    print(f"  user's least_outstanding (numba)  {u:7.2f} s   ratio user / built-in {u / b:.2f}")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    first, second, hits = compile_figures()
    print(f"user router module, import + check + compile: first process {first:.2f} s, second process {second:.2f} s "
          f"({hits} cache hit{'s' if hits != 1 else ''}; the engine is not recompiled for it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
