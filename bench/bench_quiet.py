"""Where the numba engine's time goes once steady decoders are lazy (engine/lazy.py) and all-lazy
replicas advance in quiet runs (engine/quiet.py): the share of steps made in quiet runs, and the
replay core with prefix caching on and off, against `numba-eager` in the same process.

    python bench/bench_quiet.py                   # bundled conv trace on 4 replicas, 100k Poisson on 64
    python bench/bench_quiet.py --requests 1000000

Each figure is the median of --repeats runs of the engine alone (construction and every advance
at 1 s ticks, the garbage collector off); machines are shared and noisy, so quote ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench_replay import engine_run
from replay.config import EngineArgs, FleetConfig, PoolConfig
from replay.engine.state import C_STEPS
from replay.fleet.cluster import build_inputs, plan_pools
from replay.fleet.split import assign_pools
from traces import load_trace
from traces.synthetic import poisson_trace


def inputs_for(trace, replicas: int, caching: bool):
    pool = PoolConfig(name="default", replicas=replicas, tensor_parallel_size=1,
                      engine=EngineArgs(enable_prefix_caching=caching))
    plans = plan_pools(FleetConfig(model="llama-3.1-8b", gpu="h100-sxm-80gb", pools=(pool,)))
    return build_inputs(trace.frame, trace.prefix_block_tokens, plans, assign_pools(trace.frame["workload"], plans))


def core(inputs, engine: str) -> tuple[float, int, int]:
    """One replay core: (seconds, steps, steps made in quiet runs)."""
    wall, eng = engine_run(inputs, engine)
    return wall, int(eng.reps.counters[:, C_STEPS].sum()), int(eng.reps.qr_steps.sum())


def report(label: str, trace, replicas: int, repeats: int) -> None:
    for caching in (True, False):
        inputs = inputs_for(trace, replicas, caching)
        core(inputs, "numba")  # kernels from numba's cache: not timed
        lazy = [core(inputs, "numba") for _ in range(repeats)]
        eager = statistics.median(core(inputs, "numba-eager")[0] for _ in range(repeats))
        wall = statistics.median(w for w, _, _ in lazy)
        _, steps, quiet = lazy[0]
        print(f"{label}, prefix caching {'on ' if caching else 'off'}: {steps:,} steps, {quiet / steps:.1%} in quiet "
              f"runs; lazy {wall:.3f} s ({wall / steps * 1e9:.0f} ns a step), eager {eager:.3f} s: "
              f"{eager / wall:.2f}x (medians of {repeats})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    conv = load_trace("azure-conv-2023")
    report(f"azure-conv-2023 ({conv.frame.height:,} requests) on 4 replicas", conv, 4, args.repeats)
    synth = poisson_trace(conv, requests=args.requests, rate_rps=250.0, seed=1)
    report(f"{args.requests:,} Poisson requests at 250 req/s on 64 replicas", synth, 64, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
