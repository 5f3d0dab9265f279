"""A 64-cell sweep of the bundled trace (4 replica counts x 4 routers x 4 rate scales, on a
window of it): the wall time with 1 local worker, with 2, the speed-up, and the Ray backend's
overhead per cell over the local one at the same number of workers. Ray's own start (ray.init)
is timed apart: the sweep then reuses the cluster, as a user's sweeps on a running cluster do.

    python bench/bench_sweep.py [--window-s SECONDS] [--workers 2] [--no-ray]

Each measurement replays every cell (a fresh --out); the engine's kernels come from numba's
cache (a first run compiles them once, before the timings).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_replay.app import main  # noqa: E402

BASE = """\
model: llama-3.1-8b
gpu: h100-sxm-80gb
trace: {trace}
pools:
  - {{name: default, replicas: 1, tensor_parallel_size: 1}}
"""
SWEEP = """\
base: base.yaml
grid:
  pools.0.replicas: [1, 2, 3, 4]
  router: [least-outstanding, round-robin, random, least-kv]
  trace.rate_scale: [1.0, 2.0, 4.0, 8.0]
"""


def timed_sweep(folder: Path, name: str, *flags: str) -> float:
    began = time.perf_counter()
    code = main(["sweep", str(folder / "sweep.yaml"), "--out", str(folder / name), "--quiet", *flags])
    if code != 0:
        raise SystemExit(f"sweep {name} exited {code}")
    return time.perf_counter() - began


def main_bench() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=None,
                   help="replay only the first seconds of the bundled trace (default: all of it, an hour)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    args = p.parse_args()
    from replay.run import warm_up

    warm_up()  # compile once if the cache is cold, so that no timing below holds the compiler
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        window = f", window: {{start_s: 0, end_s: {args.window_s}}}" if args.window_s else ""
        (folder / "base.yaml").write_text(BASE.format(trace=f"{{path: azure-conv-2023{window}}}"))
        (folder / "sweep.yaml").write_text(SWEEP)
        cells = 64
        one = timed_sweep(folder, "w1", "--workers", "1")
        many = timed_sweep(folder, "wN", "--workers", str(args.workers))
        span = f"{args.window_s:g} s of" if args.window_s else "all of"
        print(f"64-cell sweep, {span} azure-conv-2023 per cell, {os.cpu_count()} cores "
              f"(load average before: {os.getloadavg()[0]:.1f}):")
        print(f"  1 worker : {one:7.1f} s  ({one / cells:.3f} s per cell)")
        print(f"  {args.workers} workers: {many:7.1f} s  ({many / cells:.3f} s per cell); "
              f"speed-up {one / many:.2f}x")
        if args.no_ray:
            return
        import ray

        began = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        start = time.perf_counter() - began
        try:
            on_ray = timed_sweep(folder, "ray", "--backend", "ray")
        finally:
            ray.shutdown()
        overhead = (on_ray - many) / cells
        print(f"  ray, {args.workers} CPUs: {on_ray:7.1f} s  ({on_ray / cells:.3f} s per cell); overhead per cell "
              f"{overhead * 1000:+.0f} ms ({(on_ray / many - 1) * 100:+.1f}% over local); ray.init {start:.1f} s apart")


if __name__ == "__main__":
    main_bench()
