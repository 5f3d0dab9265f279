"""Run directories, written atomically: everything goes to a temp dir beside the target, then one
rename, so a reader (or the dashboard following a run) never sees a half-written run.

Contents (a contract the dashboard and outside scripts read; see README "Run outputs"):
requests.parquet, ticks.parquet, events.parquet, summary.json, config.yaml.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from traces.errors import UserError

RUN_FILES = ("requests.parquet", "ticks.parquet", "events.parquet", "summary.json", "config.yaml")


@dataclass(frozen=True)
class RunOutputs:
    requests: pl.DataFrame
    ticks: pl.DataFrame
    events: pl.DataFrame
    summary: dict
    config: dict


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Refuse to overwrite an existing run unless forced, before any work is done."""
    if out_dir.exists() and not force:
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise UserError(f"{out_dir}: already exists; choose another --out or pass --force to replace it")


def write_run(out_dir: Path, run: RunOutputs, force: bool = False) -> Path:
    out_dir = Path(out_dir)
    check_out_dir(out_dir, force)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        meta = {
            "llm_replay.version": str(run.summary.get("version", "")),
            "llm_replay.config_sha256": str(run.summary.get("config_sha256", "")),
            "llm_replay.trace_sha256": str(run.summary.get("trace_sha256", "")),
        }
        for name, frame in (("requests", run.requests), ("ticks", run.ticks), ("events", run.events)):
            frame.write_parquet(tmp / f"{name}.parquet", metadata=meta)
        (tmp / "summary.json").write_text(json.dumps(run.summary, indent=2) + "\n")
        (tmp / "config.yaml").write_text(yaml.safe_dump(run.config, sort_keys=False))
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.replace(out_dir, old / "run")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
