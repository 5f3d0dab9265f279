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
    """Refuse, before any work is done, what the final rename could not do or should not do."""
    target = out_dir.resolve()
    if target == Path.cwd().resolve() or target in Path.cwd().resolve().parents:
        raise UserError(f"--out {out_dir}: is the current directory or one above it; choose a new directory")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"--out {out_dir}: {parent} is a file, not a directory")
            break
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UserError(f"--out {out_dir}: exists and is not a directory")
        if not force and any(out_dir.iterdir()):
            raise UserError(f"--out {out_dir}: already exists; choose another --out or pass --force to replace it")


def write_run(out_dir: Path, run: RunOutputs, force: bool = False) -> Path:
    out_dir = Path(out_dir)
    check_out_dir(out_dir, force)
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot create it: {exc.strerror}") from None
    # mkdtemp makes 0o700; a run directory is shared like any other the user creates.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
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
