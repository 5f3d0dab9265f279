"""`llm-replay validate RUN --observed FILE...`: score a run directory already written against an
observed export, as `run --observed` scores the run it makes, without replaying and without
writing anything. The `observed:` section comes from the run's config.yaml, or from --config."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.errors import UserError

NEEDED = ("summary.json", "config.yaml", "ticks.parquet", "requests.parquet")


def _run_dir(path: str) -> Path:
    run = Path(path)
    missing = [name for name in NEEDED if not (run / name).is_file()]
    if not run.is_dir() or missing:
        what = "no such directory" if not run.exists() else "not a directory" if not run.is_dir() \
            else f"lacks {', '.join(missing)}"
        raise UserError(f"{path}: {what}; with --observed, validate scores a run directory (expected one "
                        f"that `llm-replay run` wrote: {', '.join(NEEDED)})")
    return run


def _section(run: Path, config: str | None):
    """(the run's config.yaml as read, the `observed:` section to apply, the file it came from)."""
    from common.yamlfile import read_yaml
    from replay.config import load_config
    from traces.observed import ObservedConfig

    data = read_yaml(run / "config.yaml")
    if not isinstance(data, dict):
        raise UserError(f"{run / 'config.yaml'}: not a run's config (expected a mapping)")
    if config is not None:
        return data, load_config(config).observed, config
    source = str(run / "config.yaml")
    return data, ObservedConfig.from_mapping(data.get("observed"), "observed", source), source


def run(args: argparse.Namespace) -> int:
    import polars as pl
    from rich.console import Console

    from replay.cli.observed import print_divergence, print_notes, read_observed_files
    from replay.outputs.observed import score_run

    for flag, value in (("only", args.only), ("data", args.data), ("models", args.models)):
        if value:
            raise UserError(f"--{flag}: applies to a scenario file, not to a run scored with --observed")
    run_dir = _run_dir(args.scenarios)
    data, section, source = _section(run_dir, args.config)
    ticks = pl.read_parquet(run_dir / "ticks.parquet")
    requests = pl.read_parquet(run_dir / "requests.parquet")
    pools = [p.get("name", "default") for p in data.get("pools") or [] if isinstance(p, dict)] \
        or ticks["pool"].unique(maintain_order=True).to_list()
    config, observed = read_observed_files(args.observed, section, source, pools)
    tick_s = float(data.get("tick_s", 1.0))
    result, notes = score_run(observed, config, ticks, requests, pools, tick_s)
    print_notes(Console(stderr=True), notes)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_divergence(Console(), result)
    return 0
