"""`llm-replay export RUN --format openmetrics|grafana -o FILE`: a run's series for Prometheus
(OpenMetrics text that `promtool tsdb create-blocks-from openmetrics` backfills) or the Grafana
dashboard that reads them (README "Export"). The file appears whole or not at all: it is written
beside -o under a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common.errors import UserError

# The wall-clock instant trace time 0 maps to when --start is not given: fixed, so that exporting
# the same run twice gives the same bytes.
DEFAULT_START = "2025-01-01T00:00:00Z"
FORMATS = ("openmetrics", "grafana")
NEEDED = ("ticks.parquet", "requests.parquet", "summary.json", "config.yaml")
TICK_COLUMNS = ("t_us", "pool", "waiting", "running", "kv_usage", "replicas_active", "replicas_loading",
                "preemptions", "prompt_tokens_per_s", "output_tokens_per_s", "gpu_busy")
REQUEST_COLUMNS = ("pool", "replica", "status", "output_tokens", "first_token_us", "ttft_us", "finished_us",
                   "tpot_us", "e2e_us")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="a run's series as OpenMetrics for Prometheus, or its Grafana dashboard")
    p.add_argument("run_dir", metavar="RUN", help="a run directory (the --out of llm-replay run)")
    p.add_argument("--format", "-f", required=True, choices=FORMATS,
                   help="openmetrics: the series, timestamped, for promtool's backfill; grafana: the dashboard JSON")
    p.add_argument("--out", "-o", required=True, help="file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--start", default=DEFAULT_START, metavar="ISO8601",
                   help=f"wall-clock time of trace time 0 (default {DEFAULT_START}; no zone means UTC)")
    p.add_argument("--step", type=float, default=None, metavar="S",
                   help="write one sample every S seconds, a multiple of the run's tick (default: every tick)")
    p.add_argument("--run-label", default=None, metavar="NAME", help="the `run` label (default: RUN's folder name)")


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    out = Path(args.out)
    _check_out(out, args.force)
    start_us = _start_us(args.start)
    label = args.run_label or run_dir.resolve().name
    tables = load_tables(run_dir, label)
    if args.format == "grafana":
        from replay.outputs.grafana import dashboard_for
        last_us = int(tables.ticks["t_us"].max())
        text = json.dumps(dashboard_for(label, start_us, start_us + last_us), indent=2) + "\n"
        _write_atomically(out, lambda fh: fh.write(text))
        return 0
    from replay.outputs.openmetrics import write_openmetrics

    keep = _kept_ticks(tables.ticks, args.step)
    _write_atomically(out, lambda fh: write_openmetrics(fh, tables, start_us, keep))
    return 0


def _check_out(out: Path, force: bool) -> None:
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; expected a file name")
    if (out.exists() or out.is_symlink()) and not force:
        raise UserError(f"--out {out}: already exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: no folder {out.parent}; create it first")


def _start_us(text: str) -> int:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--start {text!r}: not an ISO 8601 time; expected e.g. {DEFAULT_START}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    delta = at - datetime(1970, 1, 1, tzinfo=timezone.utc)
    if delta.days < 0:  # Prometheus' timestamps are milliseconds since the Unix epoch
        raise UserError(f"--start {text!r}: before 1970-01-01; expected a time after the Unix epoch")
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def load_tables(run_dir: Path, label: str):
    """The run's ticks, requests and per-pool models, refused (UserError) where RUN is not a run
    directory or a file lacks what the export reads."""
    import polars as pl

    from replay.outputs.openmetrics import RunTables

    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory; expected the --out of llm-replay run")
    missing = [name for name in NEEDED if not (run_dir / name).is_file()]
    if missing:
        raise UserError(f"{run_dir}: not a run directory (missing {', '.join(missing)}); "
                        "expected the --out of llm-replay run")
    frames = {}
    for name, columns in (("ticks.parquet", TICK_COLUMNS), ("requests.parquet", REQUEST_COLUMNS)):
        try:
            frame = pl.read_parquet(run_dir / name)
        except Exception as exc:  # polars raises several kinds for a file that is not Parquet
            raise UserError(f"{run_dir / name}: cannot be read as Parquet ({type(exc).__name__})") from None
        lacking = [c for c in columns if c not in frame.columns]
        if lacking:
            raise UserError(f"{run_dir / name}: no column {', '.join(lacking)}; expected a run's {name}")
        frames[name] = frame
    if frames["ticks.parquet"].is_empty():
        raise UserError(f"{run_dir / 'ticks.parquet'}: no rows; there is nothing to export")
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{run_dir / 'summary.json'}: not JSON ({exc})") from None
    plans = summary.get("pool_plans") if isinstance(summary, dict) else None
    models = {pool: str(plan.get("model", "")) for pool, plan in (plans or {}).items() if isinstance(plan, dict)}
    return RunTables(frames["ticks.parquet"], frames["requests.parquet"], models, label)


def _kept_ticks(ticks, step_s: float | None):
    """The tick times --step keeps: those on a multiple of the step (every tick without one)."""
    if step_s is None:
        return None
    import numpy as np

    grid = np.unique(ticks["t_us"].to_numpy())
    tick_us = int(grid[1] - grid[0]) if len(grid) > 1 else int(grid[0])
    step_us = round(step_s * 1e6)
    if step_us <= 0 or step_us % tick_us:
        raise UserError(f"--step {step_s:g}: expected a positive multiple of the run's tick ({tick_us / 1e6:g} s)")
    return grid[grid % step_us == 0]


def _write_atomically(out: Path, write) -> None:
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            write(fh)
        os.replace(tmp, out)
    except OSError as exc:  # a full disk, a read-only folder: one line, and no partial file
        raise UserError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
