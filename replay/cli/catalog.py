"""`llm-replay catalog`: the models and GPUs llm-replay knows, or what is known of one model."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    cat = sub.add_parser("catalog", help="the models and GPUs llm-replay knows")
    cat.add_argument("--model", metavar="ID|PATH",
                     help="show what is known of one model: a catalog id, or a Hugging Face config.json (or its folder)")
    cat.add_argument("--json", action="store_true", help="print the catalog as JSON instead of the tables")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.outputs.report import print_catalog, print_model_details
    from replay.model.specs import catalog_rows, get_model, model_details

    if args.model is not None:
        details = model_details(get_model(args.model))
        if args.json:
            print(json.dumps(details, indent=2))
        else:
            print_model_details(Console(), details)
        return 0
    rows = catalog_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_catalog(Console(), rows)
    return 0
