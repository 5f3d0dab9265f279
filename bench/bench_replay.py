"""Replay speed: wall time (compile excluded), peak RSS and the numba/reference ratio, in one run.

    python bench/bench_replay.py            # all three benchmarks
    python bench/bench_replay.py --quick    # skip the million-request run

Machines are shared and noisy: every figure is the median of several repeats, and the
numba-vs-reference ratio is measured in the same process on the same trace.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import subprocess
import sys
import time

from replay.fleet.cluster import build_inputs, make_engine, plan_pools
from replay.fleet.split import assign_pools
from replay.config import AutoscalerConfig, EngineArgs, FleetConfig, PoolConfig, SplitConfig
from replay.run import replay_trace
from traces import load_trace
from traces.synthetic import poisson_trace


def fleet(model: str, replicas: int, tp: int = 1, autoscaler: str | None = None) -> FleetConfig:
    """A one-pool fleet; with `autoscaler`, `replicas` is its maximum and it starts at one."""
    scaler = None if autoscaler is None else AutoscalerConfig(policy=autoscaler, min_replicas=1, max_replicas=replicas)
    pool = PoolConfig(name="default", replicas=1 if scaler else replicas, tensor_parallel_size=tp,
                      engine=EngineArgs(), autoscaler=scaler)
    return FleetConfig(model=model, gpu="h100-sxm-80gb", pools=(pool,))


def timed(trace, cfg, engine: str, repeats: int) -> tuple[float, dict]:
    times = []
    summary = {}
    for _ in range(repeats):
        started = time.perf_counter()
        summary = replay_trace(trace, cfg, engine=engine).summary
        times.append(time.perf_counter() - started)
    return statistics.median(times), summary


def engine_only(trace, cfg, engine: str) -> float:
    """Seconds inside the engine (construction + every advance), the ticks' Python work excluded.
    The garbage collector is off while timing, as timeit does, so a collection triggered by
    earlier work does not land in one engine's time."""
    plans = plan_pools(cfg)
    inputs = build_inputs(trace.frame, trace.prefix_block_tokens, plans, assign_pools(trace.frame["workload"], plans))
    return engine_seconds(inputs, engine)


def engine_seconds(inputs, engine: str = "numba") -> float:
    """`engine_only` on engine inputs already built (bench_user_policy.py times user policies so)."""
    return engine_run(inputs, engine)[0]


def engine_run(inputs, engine: str = "numba"):
    """`engine_seconds`, and the engine at the end (bench_quiet.py reads its step counters)."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        eng = make_engine(engine, inputs)
        t = 0
        while not eng.done:
            t += 1_000_000
            eng.advance(t)
        return time.perf_counter() - started, eng
    finally:
        gc.enable()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the million-request benchmark")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--only-million", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--autoscaler", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only-engine", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only_engine:
        conv = load_trace("azure-conv-2023")
        cfg = fleet("llama-3.1-8b", replicas=4)
        if args.only_engine == "numba":
            engine_only(conv, cfg, "numba")  # load the kernels from numba's cache: not timed
        print(statistics.median(engine_only(conv, cfg, args.only_engine) for _ in range(args.repeats)))
        return 0
    if args.only_million:
        return million(args.requests, args.autoscaler)

    conv = load_trace("azure-conv-2023")
    cfg = fleet("llama-3.1-8b", replicas=4)
    replay_trace(conv, cfg)  # compile or load the kernels from the cache: not timed

    wall, summary = timed(conv, cfg, "numba", args.repeats)
    print(f"azure-conv-2023 ({conv.frame.height:,} requests) on 4 x llama-3.1-8b / h100-sxm-80gb, numba engine:")
    print(f"  wall {wall:.3f} s median of {args.repeats} (whole replay: engine, ticks, metrics; no file I/O)")
    print(f"  simulated {summary['sim_span_s']:,.0f} s -> {summary['sim_span_s'] / wall:,.0f}x real time; "
          f"TTFT p99 {summary['ttft_p99_ms']} ms")

    ref_wall, ref_summary = timed(conv, cfg, "reference", 1)
    same = {k: summary[k] for k in ("finished", "ttft_p99_ms", "tpot_p99_ms")} == \
        {k: ref_summary[k] for k in ("finished", "ttft_p99_ms", "tpot_p99_ms")}
    print(f"  whole replay with the reference engine {ref_wall:.2f} s: numba {ref_wall / wall:.0f}x faster "
          f"(same summary: {same})")
    scaled = fleet("llama-3.1-8b", replicas=4, autoscaler="kpa")
    replay_trace(conv, scaled)
    scaled_wall, scaled_summary = timed(conv, scaled, "numba", args.repeats)
    print(f"  with KPA autoscaling (1 to 4 replicas): wall {scaled_wall:.3f} s median of {args.repeats}; "
          f"GPU-hours {scaled_summary['gpu_hours']}")
    pd = FleetConfig(model="llama-3.1-8b", gpu="h100-sxm-80gb", split=SplitConfig(policy="prefill-decode"),
                     pools=(PoolConfig(name="prefill", replicas=1), PoolConfig(name="decode", replicas=3)))
    replay_trace(conv, pd)
    pd_wall, pd_summary = timed(conv, pd, "numba", args.repeats)
    print(f"  prefill/decode (1 prefill + 3 decode, ib-ndr): wall {pd_wall:.3f} s median of {args.repeats}; "
          f"TTFT p99 {pd_summary['ttft_p99_ms']} ms, KV transfer p99 "
          f"{pd_summary['prefill_decode']['kv_transfer_p99_ms']} ms")
    # Each engine alone, in a fresh process of its own, so neither inherits the other's heap.
    nb, ref = (float(subprocess.run([sys.executable, __file__, "--only-engine", name, "--repeats", str(n)],
                                    check=True, capture_output=True, text=True).stdout)
               for name, n in (("numba", max(args.repeats, 9)), ("reference", 1)))
    print(f"  engines alone, each in its own process: numba {nb:.3f} s (median of {max(args.repeats, 9)}), "
          f"reference {ref:.2f} s: numba {ref / nb:.0f}x faster")

    if not args.quick:
        # In its own process, so its peak RSS is its own.
        for extra in ([], ["--autoscaler", "kpa"]):
            subprocess.run([sys.executable, __file__, "--only-million", "--requests", str(args.requests), *extra],
                           check=True)
    return 0


def million(requests: int, autoscaler: str | None = None) -> int:
    conv = load_trace("azure-conv-2023")
    big = fleet("llama-3.1-8b", replicas=64, autoscaler=autoscaler)
    replay_trace(poisson_trace(conv, requests=1000, rate_rps=250.0, seed=1), big)  # kernels: not timed
    synth = poisson_trace(conv, requests=requests, rate_rps=250.0, seed=1)
    started = time.perf_counter()
    s = replay_trace(synth, big).summary
    wall = time.perf_counter() - started
    how = "KPA-autoscaled 1 to 64 x" if autoscaler else "64 x"
    print(f"{requests:,} Poisson requests at 250 req/s (Azure conv lengths) on {how} llama-3.1-8b:")
    print(f"  wall {wall:.1f} s for {s['sim_span_s']:,.0f} s simulated; finished {s['finished']:,}; "
          f"peak RSS of that process {peak_rss_mb():,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
