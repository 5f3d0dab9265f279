"""What a trace's prefix hashes cost in memory: read whole, or read in batches as a replay reads them.

    python bench/bench_stream_hashes.py                      # 3M rows, ~30 hashes a row
    python bench/bench_stream_hashes.py --requests 1000000 --hashes 15

A canonical Parquet trace (bench/bench_memory.py's Poisson generator, Azure conv lengths) is given
prefix hashes (`--hashes` a row on average, lengths uniform in 0..2x, a quarter of the rows none),
and written again without them. Each case runs in a fresh process, its peak its own (VmHWM):

  whole     load_trace, then the engine's hash columns of the whole frame (replay/fleet/split.py
            prefix_hash_columns, what cluster.build_inputs makes)
  batches   load_trace(stream=True), then every request's fields read in window-sized ranges
            (replay/fleet/streamed.py StreamedRequests.read, as the engine's window fills)

`over` is the peak less the RSS after the imports; `per hash` divides the hashed trace's `over`
less the unhashed one's by the hashes the trace holds (whole) or one batch holds (batches): the
figures replay/memory.py's estimate uses.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 1 << 20
FLEET = {"model": "llama-3.1-8b", "pools": [{"name": "p", "replicas": 4}]}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1)) / 1024


def one(path: str, mode: str) -> dict:
    import polars as pl  # noqa: F401  (in the baseline, like the interpreter)

    from replay.config import build_config
    from replay.fleet.cluster import plan_pools
    from replay.fleet.split import prefix_hash_columns
    from replay.fleet.streamed import StreamedRequests
    from traces import load_trace

    base = _status_mb("VmRSS")
    began = time.perf_counter()
    if mode == "whole":
        trace = load_trace(path)
        _, _, flat = prefix_hash_columns(trace.frame["prefix_hashes"])
        held = len(flat)
    else:
        trace = load_trace(path, stream=True)
        cfg = build_config(FLEET, "bench", Path("."))
        requests = StreamedRequests(trace.stream, cfg, plan_pools(cfg))
        held = 0
        for lo in range(0, requests.total, 1 << 16):
            held = max(held, len(requests.read(lo, min(requests.total, lo + (1 << 16)))["hashes"]))
    return {"wall_s": time.perf_counter() - began, "over_mb": _status_mb("VmHWM") - base, "rows": trace.rows}


def build(requests: int, hashes: int, folder: Path) -> tuple[Path, Path, int, int]:
    """(hashed trace, the same without hashes, hashes in all, most hashes in one batch)."""
    import numpy as np
    import polars as pl

    from bench.bench_memory import synthesize
    from traces.canonical import write_canonical
    from traces.stream import batch_rows_for

    plain = synthesize(requests, folder)
    hashed = folder / f"hashed-{requests}-{hashes}.parquet"
    frame = pl.read_parquet(plain)
    rng = np.random.default_rng(1)
    lens = rng.integers(0, 2 * hashes + 1, frame.height)
    lens[rng.random(frame.height) < 0.25] = 0
    if not hashed.exists():
        starts = np.concatenate(([0], np.cumsum(lens)[:-1])) % 50_000  # shared prefixes, as a cache sees them
        lists = pl.int_ranges(pl.Series(starts), pl.Series(starts + lens), dtype=pl.UInt64)
        write_canonical(frame.with_columns(prefix_hashes=pl.select(lists).to_series()), hashed, 512)
    rows = batch_rows_for(float(lens[:1 << 16].mean()))  # (as traces/stream.py samples it)
    batch = max(int(lens[i:i + rows].sum()) for i in range(0, len(lens), rows))
    return hashed, plain, int(lens.sum()), batch


def measure(path: Path, mode: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--one", str(path), "--mode", mode], check=True,
                             capture_output=True, text=True, cwd="/tmp").stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "over_mb")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3_000_000)
    ap.add_argument("--hashes", type=int, default=30, help="prefix hashes a row, on average")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.mode)))
        return 0
    folder = Path(tempfile.gettempdir()) / "llm-replay-bench-hashes"
    folder.mkdir(exist_ok=True)
    hashed, plain, total, batch = build(args.requests, args.hashes, folder)
    print(f"{args.requests / 1e6:g}M rows, {total / 1e6:.1f}M hashes ({batch / 1e6:.1f}M in the largest batch); "
          f"medians of {args.repeat}; over = peak - RSS after imports")
    for mode, held in (("whole", total), ("batches", batch)):
        a, b = measure(hashed, mode, args.repeat), measure(plain, mode, args.repeat)
        per = (a["over_mb"] - b["over_mb"]) * MB / held
        print(f"{mode:<8} hashed {a['wall_s']:6.2f} s over {a['over_mb']:7.0f} MB | without hashes "
              f"{b['wall_s']:6.2f} s over {b['over_mb']:7.0f} MB | {per:5.1f} B per hash held", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
