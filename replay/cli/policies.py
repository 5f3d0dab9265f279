"""`llm-replay policies`: every policy by family, with its parameters, defaults and upstream source."""

from __future__ import annotations

import argparse
import json
from typing import Any

from replay.cli.parsing import add_plugin_option


def add_parser(sub: Any) -> None:
    pol = sub.add_parser("policies", help="every policy by family: parameters, defaults, upstream source")
    pol.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    add_plugin_option(pol, "also list the functions of MODULE that fit an autoscaler or a pool split")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from policies.plugins import load_plugins
    from policies.registry import policy_rows
    from replay.outputs.report import print_policies

    load_plugins(args.plugin)
    rows = policy_rows()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_policies(Console(), rows)
    return 0
