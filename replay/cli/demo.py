"""`llm-replay demo incident`: the incident scenario replayed before and after its fix."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from replay.cli.parsing import OneLineParser


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="replay a built-in scenario")
    demosub = demo.add_subparsers(dest="demo_command", required=True, metavar="SCENARIO", parser_class=OneLineParser)
    inc = demosub.add_parser("incident", help="TTFT p99 past 30 s on a shared GPU-Util-scaled pool, and the fix")
    inc.add_argument("--out", "-o", default="runs/incident", help="writes OUT/before and OUT/after")
    inc.add_argument("--force", action="store_true", help="replace existing runs")
    inc.add_argument("--engine", choices=("numba", "reference"), default="numba",
                     help="numba (fast) or reference (slow pure Python, same outputs)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.demo import comparison, demo_config_path, incident_variants, run_incident
    from replay.outputs.report import engine_ready, print_comparison

    err = Console(stderr=True)
    if args.engine == "numba":
        for variant in incident_variants():
            engine_ready(err, terminal=err.is_terminal, variant=variant)
    with err.status("replaying the incident twice (before and after the fix)...", spinner="dots") \
            if err.is_terminal else contextlib.nullcontext():
        runs = run_incident(Path(args.out), force=args.force, engine=args.engine)
    print_comparison(Console(), comparison(runs), Path(args.out),
                     [demo_config_path("before"), demo_config_path("after")])
    return 0
