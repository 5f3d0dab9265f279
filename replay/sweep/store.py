"""A sweep's --out folder: sweep.json (the cells of the last sweep written there), cells/ID.json
(one record per finished or failed cell, each written whole by one rename), runs/ID/ (a cell's run
directory, with --keep-runs) and results.parquet (rebuilt from the records after every sweep).

Nothing here deletes: a cell's record is replaced by a later record of the same cell (a failed
cell run again), and a folder that is not a sweep's is refused before anything is written.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from common.errors import UserError
from replay.outputs.write import existing_out_dir

MANIFEST = "sweep.json"
RESULTS = "results.parquet"
OURS = {MANIFEST, RESULTS, "cells", "runs"}


def check_sweep_dir(out: Path) -> None:
    """--out is new, empty, or a sweep's folder (a re-run resumes it); anything else is refused."""
    if not str(out).strip():
        raise UserError("--out: empty path; give a directory for the sweep")
    if not existing_out_dir(out):
        return
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    if entries and not (out / MANIFEST).is_file():
        raise UserError(f"--out {out}: exists and is not a sweep's folder (no {MANIFEST}; it holds "
                        f"{', '.join(entries[:3])}{' ...' if len(entries) > 3 else ''}); choose another --out")


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds either its old content or all of `data`, never a part (a killed sweep)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(out: Path, source: str, cells: list) -> None:
    rows = [{"cell": c.id, "keys": c.keys} for c in cells]
    write_atomic(out / MANIFEST, (json.dumps({"sweep": source, "cells": rows}, indent=2, default=str) + "\n").encode())


def record_path(out: Path, cell_id: str) -> Path:
    return out / "cells" / f"{cell_id}.json"


def read_record(out: Path, cell_id: str) -> dict | None:
    try:
        return json.loads(record_path(out, cell_id).read_text())
    except (OSError, ValueError):
        return None  # absent, or unreadable: the cell runs again


def is_done(out: Path, cell, keep_runs: bool) -> bool:
    """Finished before, with the same config and trace (the id says so, the record confirms it),
    and with its run directory when --keep-runs asks for one. A failed cell runs again."""
    record = read_record(out, cell.id)
    if record is None or record.get("status") != "ok" or record.get("trace_sha256") != cell.trace_sha256:
        return False
    return not keep_runs or (out / "runs" / cell.id / "summary.json").is_file()


def save(out: Path, cell, record: dict, run: Any) -> None:
    """The cell's run directory first (with --keep-runs), then its record: a record means done."""
    if run is not None:
        from replay.outputs.write import write_run

        write_run(out / "runs" / cell.id, run, force=True)
    record = {**record, "keys": cell.keys}
    write_atomic(record_path(out, cell.id), (json.dumps(record, indent=2, default=str) + "\n").encode())


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """summary.json as columns: nested sections joined by '.' (pools.chat.ttft_p99_ms), lists as JSON."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        return {prefix: json.dumps(value, default=str)}
    return {prefix: value}


def results_table(out: Path, cells: list, keys: tuple[str, ...]) -> pl.DataFrame:
    """One row per cell in sweep order: its keys, cell, status, error, then every summary field."""
    rows = []
    for cell in cells:
        record = read_record(out, cell.id) or {"status": "failed", "error": "no record (the sweep stopped first)"}
        row = {key: cell.keys[key] for key in keys}
        row.update(cell=cell.id, status=record.get("status"), error=record.get("error"))
        for name, value in flatten(record.get("summary") or {}).items():
            row[name if name not in row else f"summary.{name}"] = value
        rows.append(row)
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pl.DataFrame({name: _column(name, [row.get(name) for row in rows]) for name in names})


def _column(name: str, values: list) -> pl.Series:
    """One type per column: numbers as Float64 (Int64 when all whole), strings, booleans; a column
    mixing kinds (a router by name in one cell, by mapping in another) as JSON text."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Boolean)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pl.Series(name, [None if v is None else float(v) for v in values], dtype=pl.Float64)
    if all(isinstance(v, str) for v in present):
        return pl.Series(name, values, dtype=pl.Utf8)
    return pl.Series(name, [None if v is None else json.dumps(v, sort_keys=True, default=str) for v in values],
                     dtype=pl.Utf8)


def write_results(out: Path, table: pl.DataFrame) -> Path:
    buf = io.BytesIO()
    table.write_parquet(buf)
    write_atomic(out / RESULTS, bytes(buf.getbuffer()))
    return out / RESULTS
