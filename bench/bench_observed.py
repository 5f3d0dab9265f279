"""Aligning and scoring a day of observed metrics: 1 s scrapes of 8 pools x 16 replicas, every
metric traces/observed knows (gauges, counters, histograms with vLLM's buckets, replica counts),
synthetic and built in memory (no file is parsed), then `align` onto a 1 s grid and `score_all`
against a replayed copy. Only that is timed (the data is generated first, untimed). Prints the
wall time of a first run (which also loads the compiled kernels from numba's
cache, or compiles them into it: about 20 s on a cold cache) and of `--repeat` more, their
median and fastest (wall time, and the CPU time, which the machine's other load does not
inflate as much), the RSS the input alone takes and the process's peak RSS. The samples are
held as align reads them (traces/observed/layout.py: 8 bytes a sample and a target's times
once, where the long frame of series, t and value took 20); the same script of the commit
before that layout, run at the same scale beside it, gives the ratio.

    python bench/bench_observed.py [--pools 8] [--replicas 16] [--seconds 86400] [--no-histograms]

The histograms are most of the data (65 bucket series per replica against 8 other series), so
`--no-histograms` times the rest alone.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traces.observed import Grid, ObservedConfig, Scrapes, align, score_all  # noqa: E402
from traces.observed.mapping import Mapped  # noqa: E402
from traces.observed.metrics import KNOWN  # noqa: E402

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), +Inf added as Prometheus exposes it.
BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                         50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
}
PER_REPLICA = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
               "DCGM_FI_DEV_GPU_UTIL", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
               "vllm:generation_tokens_total", "vllm:request_success_total")


def synthetic(pools: int, replicas: int, seconds: int, histograms: bool, seed: int = 0) -> Mapped:
    """Series rows and their samples: each target (a replica; the pool's kube-state-metrics)
    scraped every second at its own phase, all its series at the same instants (layout.Scrapes:
    the target's times once, each series' values)."""
    rng = np.random.default_rng(seed)
    per_replica = len(PER_REPLICA) + (sum(len(b) + 1 for b in BUCKETS.values()) if histograms else 0)
    n_series, n_targets = pools * (1 + replicas * per_replica), pools * (1 + replicas)
    # filled in place: lists of arrays and a concatenation would hold every sample twice
    values, times = np.empty(n_series * seconds), np.empty(n_targets * seconds)
    target = np.empty(n_series, np.int64)
    rows: list[tuple] = []
    base = np.arange(seconds, dtype=np.float64)
    targets = [0]

    def scraped() -> int:
        g = targets[0]
        times[g * seconds:(g + 1) * seconds] = base + rng.uniform(0, 1)
        targets[0] += 1
        return g

    def add(name: str, pool: str, replica: str, v: np.ndarray, g: int, le: float | None = None) -> None:
        metric = KNOWN[name]
        sid = len(rows)
        rows.append((sid, name, metric.signal, metric.kind, metric.combine, metric.scale, pool, replica, le, "bench"))
        values[sid * seconds:(sid + 1) * seconds], target[sid] = v, g

    load = 0.5 + 0.5 * np.sin(base / 3600.0) ** 2
    for p in range(pools):
        pool = f"pool{p}"
        add("kube_deployment_status_replicas", pool, "", np.full(seconds, float(replicas)), scraped())
        for r in range(replicas):
            replica, g = f"{pool}-r{r}", scraped()
            noise = rng.uniform(0.8, 1.2, seconds)
            for name in PER_REPLICA:
                metric = KNOWN[name]
                if metric.kind == "counter":
                    add(name, pool, replica, np.cumsum(load * noise * 100.0), g)
                else:
                    add(name, pool, replica, load * noise * (100.0 if name.startswith("DCGM") else 10.0), g)
            if histograms:
                arrivals = np.cumsum(load * noise)
                for name, bounds in BUCKETS.items():
                    shares = np.linspace(0.05, 1.0, len(bounds) + 1)
                    for le, share in zip([*bounds, float("inf")], shares):
                        add(name, pool, replica, arrivals * share, g, le)
    series = pl.DataFrame(rows, orient="row", schema={
        "series": pl.UInt32, "metric": pl.String, "signal": pl.String, "kind": pl.String, "combine": pl.String,
        "scale": pl.Float64, "pool": pl.String, "replica": pl.String, "le": pl.Float64, "file": pl.String})
    scrapes = Scrapes(times, seconds * np.arange(n_targets + 1), values, seconds * np.arange(n_series + 1), target)
    return Mapped(series, scrapes, {}, 0, (), ())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=86_400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-histograms", action="store_true")
    args = parser.parse_args()
    mapped = synthetic(args.pools, args.replicas, args.seconds, not args.no_histograms)
    with open("/proc/self/statm") as statm:  # resident pages now: the input frames
        resident = int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    config = ObservedConfig()
    grid = Grid(60.0, 1.0, args.seconds - 60)
    print(f"{mapped.series.height:,} series, {mapped.samples.height:,} samples; grid of {grid.n:,} ticks")
    walls, cpus = [], []
    for _ in range(args.repeat + 1):
        start, cpu = time.perf_counter(), time.process_time()
        aligned = align(mapped, grid, config)
        replayed = {k: v * 1.05 for k, v in aligned.values.items()}
        scores = score_all(aligned.values, replayed, grid, config.window_s)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        first = " (first: kernels loaded or compiled)" if len(walls) == 1 else ""
        print(f"align + score: {walls[-1]:.2f} s, {cpus[-1]:.2f} s of CPU ({len(scores)} signal-pool pairs){first}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    warm = walls[1:]
    print(f"median of {len(warm)} after the first: {statistics.median(warm):.2f} s, fastest {min(warm):.2f} s "
          f"(CPU time: median {statistics.median(cpus[1:]):.2f} s); "
          f"input {resident:,.0f} MiB resident, peak RSS {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
