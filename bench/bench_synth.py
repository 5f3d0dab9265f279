"""Synthesizing a day of ServeGen's m-large language mix: all 162 clients' 10-minute rate
windows (Gamma/Weibull gaps as fitted, ServeGen's count per window), lengths resampled from the
bundled Azure conversation trace (ServeGen's language folders hold no length PMFs). Prints the
rows, the generation time, the time to write the Parquet, and the process's peak RSS.

    python bench/bench_synth.py [--servegen ../shared/traces/servegen] [--hours 24] [--start-day 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traces.canonical import write_canonical  # noqa: E402
from traces.synth import parse_spec, synthesize  # noqa: E402

DEFAULT_SERVEGEN = Path(__file__).resolve().parents[2] / "shared" / "traces" / "servegen"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servegen", type=Path, default=DEFAULT_SERVEGEN)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--start-day", type=int, default=0, help="which of the data's 14 days")
    p.add_argument("--out", type=Path, default=None, help="keep the Parquet here (default: a temporary file)")
    args = p.parse_args()
    folder = args.servegen / "language" / "m-large"
    if not folder.is_dir():
        sys.exit(f"bench_synth: no ServeGen m-large folder at {folder} (pass --servegen)")
    spec = parse_spec({
        "seed": 0, "duration_s": args.hours * 3600,
        "workloads": [{"name": "m-large", "servegen": {"path": str(folder), "start_s": args.start_day * 86400},
                       "prompt": {"dist": "empirical", "trace": "azure-conv-2023", "column": "prompt_tokens"},
                       "output": {"dist": "empirical", "trace": "azure-conv-2023", "column": "output_tokens"}}],
    }, "bench")
    began = time.perf_counter()
    trace = synthesize(spec)
    generated = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "m-large.parquet"
        began = time.perf_counter()
        write_canonical(trace.frame, out, trace.prefix_block_tokens)
        written = time.perf_counter() - began
        size = out.stat().st_size
    frame = trace.frame
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rows            {frame.height:,}")
    print(f"clients         {frame['tenant'].n_unique()}")
    print(f"span            {frame['arrival_us'].max() / 3.6e9:.2f} h")
    print(f"mean rate       {frame.height / (args.hours * 3600):,.1f} req/s")
    print(f"generate        {generated:.1f} s")
    print(f"write parquet   {written:.1f} s ({size / 2**20:,.0f} MiB)")
    print(f"peak RSS        {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
