"""Pools that share nothing, replayed in parallel (replay/fleet/parallel.py) against the whole
fleet in one engine, measured in the same run, with the outputs compared.

    python bench/bench_pools.py                    # (a) and (b)
    python bench/bench_pools.py --quick            # (a) only
    python bench/bench_pools.py --requests 400000  # (b) smaller

(a) the bundled azure-conv-2023 and azure-code-2023 traces merged, split by workload over a
    chat pool (4 x llama-3.1-8b) and a code pool (2 x llama-3.1-8b);
(b) a synthetic 4-pool trace: Poisson arrivals at 250 req/s with Azure-conv lengths, a quarter
    of them to each pool of 16 x llama-3.1-8b (by workload), `--requests` in all.

Each replay runs in a process of its own, so its peak RSS is its own: the parent's (trace,
inputs, merged outputs) and the largest worker's (forked: it shares the parent's pages until
it writes them, so worker RSS double-counts what both hold). Serial is `--jobs 1`; parallel is
`--jobs N` with the pay-off rule off (parallel.PAYS_OFF = 0.0), so the figures show what
the parallel path costs even where the rule would keep the fleet in one engine (it says which).
The outputs (requests, ticks, events frames and summary.json) are digested in each process and
compared. Wall times are medians of repeats; machines are shared and noisy, so quote ratios.

CPU seconds are printed beside wall seconds: Linux shares the CPUs between sessions, not between
processes (sched_autogroup), so on a machine other sessions keep busy the workers only split this
run's share and the wall time cannot fall; the serial run's CPU over the parent's plus the
slowest worker's is the speed-up on idle cores (each worker on a core of its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from replay.config import AutoscalerConfig, FleetConfig, PoolConfig, SplitConfig

WALL_FIELDS = ("wall_s", "replay_wall_s")


def bundled_case():
    import polars as pl

    from traces import LoadedTrace, load_trace

    conv, code = load_trace("azure-conv-2023"), load_trace("azure-code-2023")
    frame = pl.concat([conv.frame.with_columns(workload=pl.lit("chat")),
                       code.frame.with_columns(workload=pl.lit("code"))]).sort("arrival_us", maintain_order=True)
    frame = frame.with_columns(request_id=pl.int_range(frame.height, dtype=frame["request_id"].dtype))
    trace = LoadedTrace(frame, "azure-conv-2023 + azure-code-2023", "merged", None,
                        hashlib.sha256(b"conv+code").hexdigest(), {}, 0)
    pools = (PoolConfig(name="chat", replicas=4, workloads=("chat",)),
             PoolConfig(name="code", replicas=2, workloads=("code",)))
    return trace, FleetConfig(model="llama-3.1-8b", gpu="h100-sxm-80gb", pools=pools, split=SplitConfig())


def synthetic_case(requests: int, autoscaled: bool = False):
    import numpy as np
    import polars as pl

    from traces import load_trace
    from traces.synthetic import poisson_trace

    trace = poisson_trace(load_trace("azure-conv-2023"), requests=requests, rate_rps=250.0, seed=1)
    labels = np.array(["w0", "w1", "w2", "w3"])[np.random.default_rng(2).integers(0, 4, requests)]
    trace = dataclasses.replace(trace, frame=trace.frame.with_columns(workload=pl.Series(labels)))
    scaler = AutoscalerConfig(policy="hpa", min_replicas=2, max_replicas=16) if autoscaled else None
    pools = tuple(PoolConfig(name=f"w{i}", replicas=16, workloads=(f"w{i}",), autoscaler=scaler) for i in range(4))
    return trace, FleetConfig(model="llama-3.1-8b", gpu="h100-sxm-80gb", pools=pools, split=SplitConfig())


def digest(run) -> str:
    h = hashlib.sha256()
    for frame in (run.requests, run.ticks, run.events):
        h.update(frame.hash_rows(seed=0).to_numpy().tobytes())
    summary = {k: v for k, v in run.summary.items() if k not in WALL_FIELDS}
    h.update(json.dumps(summary, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def one(case: str, jobs: int, requests: int) -> None:
    """One replay in this process; prints a JSON line."""
    from replay.fleet import parallel
    from replay.run import replay_trace, warm_up

    warm_up()
    trace, cfg = bundled_case() if case == "bundled" else synthetic_case(requests)
    rule = parallel.serial_reason(cfg, *_plans_inputs(trace, cfg), "numba", jobs)  # what `run` would choose
    parallel.PAYS_OFF = 0.0
    work = parallel._work

    def timed_work(*args):  # each worker's CPU seconds, on stderr for `measure`
        work(*args)
        os.write(2, f"worker_cpu_s {time.process_time()}\n".encode())  # one write: workers interleave

    parallel._work = timed_work
    started, cpu = time.perf_counter(), time.process_time()
    run = replay_trace(trace, cfg, jobs=jobs)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "workers_cpu_s": children.ru_utime + children.ru_stime,
                      "parent_mb": _rss(resource.RUSAGE_SELF), "worker_mb": _rss(resource.RUSAGE_CHILDREN),
                      "digest": digest(run), "requests": run.requests.height, "execution": run.execution,
                      "rule": rule}))


def _plans_inputs(trace, cfg):
    from replay.fleet.cluster import build_inputs, plan_pools
    from replay.fleet.split import split_requests

    plans = plan_pools(cfg)
    return plans, build_inputs(trace.frame, trace.prefix_block_tokens, plans, split_requests(trace.frame, cfg, plans))


def _rss(who) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def measure(case: str, jobs: int, requests: int, repeats: int) -> dict:
    """Medians over `repeats` fresh processes."""
    rows = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, __file__, "--one", case, "--jobs", str(jobs), "--requests",
                               str(requests)], capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        workers = [float(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("worker_cpu_s ")]
        row["max_worker_cpu_s"] = max(workers, default=0.0)
        rows.append(row)
    keys = ("wall_s", "cpu_s", "workers_cpu_s", "max_worker_cpu_s", "parent_mb", "worker_mb")
    out = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["digests"] = {r["digest"] for r in rows}
    out.update({k: rows[0][k] for k in ("requests", "execution", "rule")})
    return out


def report(title: str, case: str, jobs: int, requests: int, repeats: int) -> None:
    serial = measure(case, 1, requests, repeats)
    par = measure(case, jobs, requests, repeats)
    same = len(serial["digests"] | par["digests"]) == 1
    print(f"{title} ({serial['requests']:,} requests), median of {repeats}:")
    path = par["cpu_s"] + par["max_worker_cpu_s"]  # the parent's CPU, then the slowest worker's
    print(f"  serial   (--jobs 1): {serial['wall_s']:.2f} s wall, {serial['cpu_s']:.2f} s CPU, peak RSS "
          f"{serial['parent_mb']:.0f} MB")
    print(f"  parallel (--jobs {jobs}): {par['wall_s']:.2f} s wall, CPU parent {par['cpu_s']:.2f} s + workers "
          f"{par['workers_cpu_s']:.2f} s (slowest {par['max_worker_cpu_s']:.2f} s), peak RSS parent "
          f"{par['parent_mb']:.0f} MB + largest worker {par['worker_mb']:.0f} MB; {par['execution']}")
    print(f"  wall speed-up {serial['wall_s'] / par['wall_s']:.2f}x; on idle cores (serial CPU / parent + slowest "
          f"worker CPU) {serial['cpu_s'] / path:.2f}x; outputs identical: {same}; "
          f"the default rule: {par['rule'] or 'parallel'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the bundled traces")
    p.add_argument("--requests", type=int, default=1_000_000, help="requests of the synthetic 4-pool trace")
    p.add_argument("--jobs", type=int, default=2, help="worker processes of the parallel replays")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one(args.one, args.jobs, args.requests)
        return
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    report("(a) azure-conv-2023 + azure-code-2023 on chat 4 x + code 2 x llama-3.1-8b", "bundled", args.jobs,
           args.requests, args.repeats)
    if not args.quick:
        report(f"(b) 4 pools x 16 x llama-3.1-8b, Poisson 250 req/s, Azure-conv lengths", "synthetic", args.jobs,
               args.requests, max(1, args.repeats - 2))
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
