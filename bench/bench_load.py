"""Loading a big trace: wall time and peak RSS of `load_trace`, per format, 1M and 5M rows.

    python bench/bench_load.py                                  # this checkout, vs each file's size
    python bench/bench_load.py --baseline /tmp/base             # and vs another checkout's loaders
    git archive BASE traces common | tar -x -C /tmp/base        # (how to make one)

The traces are written once to /tmp/llm-replay-bench-load from a Poisson trace of Azure conv
lengths (bench/bench_memory.py's generator, `llm-replay synth`): the canonical Parquet itself, a
generic Parquet and a generic JSON-lines file with a column map (arrival in seconds), and a
Splitwise CSV (detected from its header), plain and gzipped (a gzip's text is held: its bytes). Each load runs in a fresh process of its own, so its
peak is its own: `peak` is the process's high-water mark (VmHWM) after the load, `over` the growth
over the RSS after the imports (interpreter, polars), the figure that scales with the trace. Every
case runs `--repeat` times; medians are printed, and the ratio new / baseline where there is one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CMAP = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
MB = 1 << 20


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1)) / 1024


def one(path: str, root: str, column_map: bool) -> dict:
    """Load `path` with the loaders of checkout `root`, in this process."""
    sys.path.insert(0, root)
    import polars  # noqa: F401  (in the baseline, like the interpreter)

    from traces import load_trace

    base = _status_mb("VmRSS")
    began = time.perf_counter()
    trace = load_trace(path, column_map=CMAP) if column_map else load_trace(path)
    wall = time.perf_counter() - began
    return {"wall_s": wall, "peak_mb": _status_mb("VmHWM"), "base_mb": base, "rows": trace.frame.height,
            "frame_mb": trace.frame.estimated_size() / MB}


def build(requests: int, folder: Path) -> dict[str, tuple[Path, bool]]:
    """name -> (file, needs the column map), written once."""
    sys.path.insert(0, str(ROOT))
    import polars as pl

    from bench.bench_memory import synthesize

    canonical = synthesize(requests, folder)
    cases = {"canonical parquet": (canonical, False)}
    out = {name: folder / f"load-{requests}.{ext}" for name, ext in
           (("generic parquet", "parquet"), ("splitwise csv", "csv"), ("generic jsonl", "jsonl"))}
    gz = folder / f"load-{requests}.csv.gz"
    if not all(p.exists() for p in [*out.values(), gz]):
        frame = pl.read_parquet(canonical, columns=["arrival_us", "prompt_tokens", "output_tokens"])
        generic = frame.select((pl.col("arrival_us") / 1e6).alias("t"), pl.col("prompt_tokens").alias("p"),
                               pl.col("output_tokens").alias("o"))
        generic.write_parquet(out["generic parquet"])
        generic.write_ndjson(out["generic jsonl"])
        generic.rename({"t": "arrived_at", "p": "num_prefill_tokens", "o": "num_decode_tokens"}) \
            .write_csv(out["splitwise csv"])
        gz.write_bytes(gzip.compress(out["splitwise csv"].read_bytes(), compresslevel=1))
    cases["generic parquet"] = (out["generic parquet"], True)
    cases["splitwise csv"] = (out["splitwise csv"], False)
    cases["splitwise csv.gz"] = (gz, False)
    cases["generic jsonl"] = (out["generic jsonl"], True)
    return cases


def measure(path: Path, root: Path, column_map: bool, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        child = [sys.executable, __file__, "--one", str(path), "--root", str(root)] + (["--cmap"] if column_map else [])
        out = subprocess.run(child, check=True, capture_output=True, text=True, cwd="/tmp").stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "peak_mb", "base_mb")}
    med["over_mb"] = statistics.median(r["peak_mb"] - r["base_mb"] for r in runs)
    med["rows"], med["frame_mb"] = runs[0]["rows"], runs[0]["frame_mb"]
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="*", default=[1_000_000, 5_000_000])
    ap.add_argument("--baseline", type=Path, help="another checkout (its traces/ and common/) to compare with")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--formats", nargs="*", help="only these cases (e.g. 'splitwise csv')")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--cmap", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.root, args.cmap)))
        return 0
    folder = Path(tempfile.gettempdir()) / "llm-replay-bench-load"
    folder.mkdir(exist_ok=True)
    print(f"medians of {args.repeat}; peak = process high-water mark, over = peak - RSS after imports")
    for requests in args.requests:
        for name, (path, cmap) in build(requests, folder).items():
            if args.formats and name not in args.formats:
                continue
            new = measure(path, ROOT, cmap, args.repeat)
            line = (f"{requests / 1e6:g}M {name:<18} file {path.stat().st_size / MB:7.1f} MB  frame "
                    f"{new['frame_mb']:6.1f} MB | new {new['wall_s']:6.2f} s peak {new['peak_mb']:6.0f} MB "
                    f"over {new['over_mb']:6.0f} MB ({new['over_mb'] * MB / path.stat().st_size:4.1f}x file)")
            if args.baseline:
                old = measure(path, args.baseline, cmap, args.repeat)
                line += (f" | old {old['wall_s']:6.2f} s peak {old['peak_mb']:6.0f} MB over {old['over_mb']:6.0f} MB"
                         f" | new/old time {new['wall_s'] / old['wall_s']:.2f} over {new['over_mb'] / old['over_mb']:.2f}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
