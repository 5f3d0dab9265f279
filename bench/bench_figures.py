"""A spilled run's figures (tick windows, then summary.json's blocks) two ways: from one narrow
frame of the figures' columns read whole from its Parquet parts (as replay/run.py did before the
summary's percentiles were found by external selection, replay/fleet/selection.py), and from the
parts themselves, a batch of rows at a time (as it does now). Wall time and the phase's peak RSS
over what the process held before it, each mode in a fresh child process after the same replay
(bench_day.py's fleet and cached ServeGen trace), same summary and ticks.

    python bench/bench_figures.py                 # the 4-hour trace (3.1 M requests)
    python bench/bench_figures.py --hours 24      # the day (~24 M)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """The process's largest RSS while in the block, sampled every 2 ms."""

    def __enter__(self):
        self.before = self.peak = rss_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._done.wait(0.002):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def child(trace_path: str, mode: str) -> dict:
    import yaml

    from bench.bench_day import FLEET_YAML
    from replay.config import build_config
    from replay.fleet.cluster import simulate
    from replay.fleet.metrics import read, summarize, tick_frame
    from replay.memory import return_freed_memory
    from replay.outputs.rows import RequestRows
    from replay.run import request_rows
    from traces import load_trace

    cfg = build_config(yaml.safe_load(FLEET_YAML), "bench", Path("."))
    trace = load_trace(trace_path)
    rows = RequestRows()
    raw = simulate(trace.frame, trace.prefix_block_tokens, cfg, rows=rows)
    return_freed_memory()
    if raw.requests is not None:
        request_rows(trace.frame, raw, cfg, rows)
        raw.requests = None
    rows.settle()
    return_freed_memory()
    with PeakRss() as rss:
        began = time.perf_counter()
        requests = rows.lazy()
        ticks = tick_frame(raw, requests, cfg)
        if mode == "narrow-frame":
            requests = narrow_frame(requests, [p.name for p in raw.plans], read)
        summary = summarize(requests, ticks, raw, raw.end_us / 1e6)
        wall = time.perf_counter() - began
    return {"wall_s": wall, "rss_before_mb": rss.before, "rss_peak_mb": rss.peak, "spilled": rows.spilled,
            "rows": rows.height, "summary": json.dumps(summary, sort_keys=True), "ticks": ticks.hash_rows().sum()}


def narrow_frame(requests, pools: list[str], read):
    """The figures' columns of every row in one frame, strings of known names as enums (the frame
    replay/run.py read before: ~40 bytes a request)."""
    import polars as pl

    from replay.engine.common import REJECT_NAMES
    from replay.fleet.request_rows import STATUS_NAMES

    names = {"pool": pools, "prefill_pool": pools, "status": STATUS_NAMES, "reject_reason": REJECT_NAMES}
    columns = ("workload", "pool", "prompt_tokens", "ttft_us", "tpot_us", "e2e_us", "preemptions", "status",
               "reject_reason", "slo_met", "prefill_pool")
    return read(requests.select(pl.col(c).cast(pl.Enum(names[c])) if c in names else
                                pl.col(c).cast(pl.Categorical) if c == "workload" else pl.col(c) for c in columns))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    trace = Path(tempfile.gettempdir(), "llm-replay-bench", f"m-large-{args.hours:g}h-day0.parquet")
    if not trace.exists():
        sys.exit(f"bench_figures: no {trace}: run bench/bench_day.py --hours {args.hours:g} first")
    results = {}
    for mode in ("narrow-frame", "parts"):
        out = subprocess.run([sys.executable, __file__, "--child", str(trace), mode], check=True,
                             capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    old, new = results["narrow-frame"], results["parts"]
    assert old["summary"] == new["summary"] and old["ticks"] == new["ticks"], "the two modes' figures differ"
    print(f"{trace.name}: {old['rows']:,} request rows (spilled: {old['spilled']}); load {os.getloadavg()[0]:.1f}")
    for mode, r in results.items():
        print(f"  {mode:12s} tick windows + summary: {r['wall_s']:6.2f} s, RSS {r['rss_before_mb']:,.0f} -> "
              f"peak {r['rss_peak_mb']:,.0f} MB (+{r['rss_peak_mb'] - r['rss_before_mb']:,.0f})")
    print(f"  ratio narrow-frame / parts: {old['wall_s'] / new['wall_s']:.2f}x wall, "
          f"{(old['rss_peak_mb'] - old['rss_before_mb']) / max(1, new['rss_peak_mb'] - new['rss_before_mb']):.2f}x "
          "the phase's RSS growth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
