"""`llm-replay synth SPEC.yaml --out trace.parquet`: a synthetic workload (README "Workloads")
written as a canonical Parquet trace, which `run`, `trace inspect` and `trace: {path: ...}` read
like any other. Seeded: the same spec and seed give the same file. The file appears whole or not
at all (traces/canonical.py writes it under a temporary name, then renames it).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from common.errors import UserError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("synth", help="generate a synthetic trace from a workload spec (Parquet)")
    p.add_argument("spec", metavar="SPEC.yaml", help="the workload spec (README \"Workloads\")")
    p.add_argument("--out", "-o", required=True, help="the Parquet file to write")
    p.add_argument("--seed", type=int, default=None, help="replace the spec's seed")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def run(args: argparse.Namespace) -> int:
    from common.bounds import out_of_bounds
    from traces.canonical import write_canonical
    from traces.synth import load_spec, synthesize

    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; expected a file name")
    if out.exists() and not args.force:
        raise UserError(f"--out {out}: already exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: no folder {out.parent}; create it first")
    spec, folder, name = load_spec(args.spec)
    if args.seed is not None:
        problem = out_of_bounds(None, "seed", args.seed)
        if problem is not None:
            raise UserError(f"--seed {args.seed}: expected {problem}")
        spec = dataclasses.replace(spec, seed=args.seed)
    began = time.perf_counter()
    trace = synthesize(spec, folder, name)
    write_canonical(trace.frame, out, trace.prefix_block_tokens)
    frame = trace.frame
    span = (int(frame["arrival_us"][-1]) - int(frame["arrival_us"][0])) / 1e6
    sessions = frame["session_id"].n_unique() - int(frame["session_id"].null_count() > 0)
    print(f"{out}: {frame.height:,} requests over {span:,.1f} s, {frame['workload'].n_unique()} workloads, "
          f"{frame['tenant'].n_unique()} tenants, {sessions:,} sessions ({time.perf_counter() - began:.1f} s)")
    return 0
