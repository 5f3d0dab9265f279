"""The ticks' windowed TTFT percentiles (tick_frame, replay/fleet/metrics.py): the Fenwick-tree
kernel against the kernel it replaced (every window sorted afresh), in the same run.

    python bench/bench_ticks.py                          # 1M and 5M requests at 100 req/s
    python bench/bench_ticks.py --rows 17000000 --rate 400 --old-repeats 0

Each row is a request of a Poisson stream at `--rate` (bench_memory.py's synthesized traces run at
100 req/s) with a log-normal TTFT (median 300 ms, a tail past 10 s), in whole microseconds as
the engine gives them; the ticks are a 1 s grid over the span, the window the config's default
(FleetConfig.metrics_window_s); the p50 and p99 that tick_frame asks for. The arrays are the
ones tick_frame passes (first tokens sorted, TTFT in ms). Both kernels are compiled before the
clock starts; wall is the median of the repeats. "peak +MB" is the process's high-water mark
over its RSS before the call (VmHWM reset through /proc/self/clear_refs). The outputs are checked
bit for bit.

Measured (issue 15, this project's 2-core machine at a load of 1.8-2.0, `nice -n 5`): 1M rows at
100 req/s 0.047 s new vs 3.02 s old (64x), 5M 0.401 s vs 15.3 s (38x), 1M at 400 req/s 0.038 s vs
3.44 s (90x); 17M at 400 req/s 2.25-2.41 s new vs 64.7 s old (27x), peak +213 MB: the ranks
(int32), the count tree (int8 a value, ~1/16 int32) and numpy's argsort (int64), 13 bytes a row.
Of the 17M figure, numpy's argsort is ~1.5 s. A Fenwick tree in place of the count tree took
4.75 s there (its ~log2 n scattered updates miss the cache), 0.895 s at 5M.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.config import FleetConfig  # noqa: E402
from replay.fleet.metrics import _window_percentiles  # noqa: E402
from replay.memory import return_freed_memory  # noqa: E402
from tests.unit.test_window_percentiles import _window_percentiles_slow  # noqa: E402

QS = np.array([0.5, 0.99])  # tick_frame's ttft_p50_ms and ttft_p99_ms


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1)) / 1024


def rows(n: int, rate: float, seed: int = 15) -> tuple[np.ndarray, np.ndarray]:
    """first_token_us (sorted) and ttft_ms of `n` requests, as tick_frame reads them."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1e6 / rate, n)).astype(np.int64)
    ttft = np.maximum(np.round(rng.lognormal(np.log(300_000), 1.0, n)), 1).astype(np.int64)
    first = arrival + ttft
    order = np.argsort(first, kind="stable")
    return first[order], ttft[order] / 1000.0


def timed(kernel, args: tuple, repeats: int) -> tuple[float, float, np.ndarray]:
    """Median wall, the largest peak over the RSS before a call, and the output."""
    walls, peak = [], 0.0
    for _ in range(repeats):
        return_freed_memory()  # else the heap's free pages hide what the call allocates
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        before = _status_mb("VmRSS")
        began = time.perf_counter()
        out = kernel(*args)
        walls.append(time.perf_counter() - began)
        peak = max(peak, _status_mb("VmHWM") - before)
    return statistics.median(walls), peak, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000])
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    ap.add_argument("--repeats", type=int, default=3, help="of the new kernel (default 3)")
    ap.add_argument("--old-repeats", type=int, default=1, help="of the old kernel; 0 skips it (default 1)")
    args = ap.parse_args()
    window_s = next(f.default for f in dataclasses.fields(FleetConfig) if f.name == "metrics_window_s")
    window_us = np.int64(round(window_s * 1e6))
    tick_us = 1_000_000
    small = rows(1000, args.rate)
    for kernel in (_window_percentiles, _window_percentiles_slow):  # compile before any clock
        kernel(*small, np.arange(0, 10 * tick_us, tick_us), window_us, QS)
    print(f"window {window_us / 1e6:g} s, tick {tick_us / 1e6:g} s, {args.rate:g} req/s, q {QS.tolist()}")
    for n in args.rows:
        first, ttft = rows(n, args.rate)
        t_us = np.arange(tick_us, int(first[-1]) + tick_us + 1, tick_us, dtype=np.int64)
        call = (first, ttft, t_us, window_us, QS)
        new_s, new_mb, new = timed(_window_percentiles, call, args.repeats)
        line = f"{n:>12,} rows {len(t_us):>8,} ticks  new {new_s:8.3f} s (peak +{new_mb:5.0f} MB)"
        if args.old_repeats:
            old_s, old_mb, old = timed(_window_percentiles_slow, call, args.old_repeats)
            same = np.array_equal(new.view(np.int64), old.view(np.int64))
            line += f"  old {old_s:8.3f} s (peak +{old_mb:5.0f} MB)  old/new {old_s / new_s:7.1f}x  " \
                    f"{'bit-identical' if same else 'OUTPUTS DIFFER'}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
