"""`llm-replay trace inspect`: rows, span, rates, token percentiles and prefix reuse of a trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from replay.cli.parsing import OneLineParser
from replay.cli.trace_options import add_trace_options


def add_parser(sub: Any) -> None:
    tr = sub.add_parser("trace", help="look at a trace")
    trsub = tr.add_subparsers(dest="trace_command", required=True, metavar="SUBCOMMAND", parser_class=OneLineParser)
    ins = trsub.add_parser("inspect", help="rows, span, rates, token percentiles, prefix reuse")
    ins.add_argument("trace", nargs="?", default=None,
                     help="trace file or bundled trace name (default: the --config's trace)")
    ins.add_argument("--config", "-c", help="take the trace: section of this fleet config")
    ins.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    add_trace_options(ins)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.cli.trace_options import effective_trace, trace_limits
    from replay.config import load_config
    from replay.outputs.report import print_inspect
    from traces import inspect_trace, load_from_config

    base = load_config(args.config).trace if args.config else None
    base_dir = Path(args.config).resolve().parent if args.config else None
    trace = load_from_config(effective_trace(base, args, base_dir), strict=args.strict, limits=trace_limits(args))
    info = inspect_trace(trace)
    info = {"source": str(trace.source), "format": trace.format, "sha256": trace.sha256,
            "dropped": dict(trace.dropped), "reordered": trace.reordered, **info, "notes": list(trace.notes)}
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print_inspect(Console(), info)
    return 0
