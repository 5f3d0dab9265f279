"""The checks that hold a run directory to its schema before anything is drawn: a damaged run is
one UserError naming the file, the column or key, the value and what was expected. Times are
integer microseconds.

The schema itself (files, columns in order with their dtypes, statuses, saturation classes, the
schema version) is the writer's, replay/outputs/schema.py; this module names only which of its columns
the dashboard cannot do without (`Reads`), and derives each column's kind from the writer's dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from common.errors import UserError
from replay.outputs import schema as run_schema
from replay.outputs.schema import SATURATION_CLASSES, STATUSES, Table

INT, FLOAT, STR, BOOL = "int", "float", "str", "bool"
EXPECTED = {INT: "an integer type (int64)", FLOAT: "a numeric type (float64)", STR: "a string type",
            BOOL: "a boolean type"}


@dataclass(frozen=True)
class Reads:
    """What the dashboard reads of one of the writer's tables: `needed` columns (a run without one
    is refused); every other column of the table is checked for its kind when present."""
    table: Table
    needed: tuple[str, ...]

    def __post_init__(self):
        unknown = [n for n in self.needed if n not in self.table.names]
        if unknown:  # a column the writer does not write: the dashboard would refuse every run
            raise ValueError(f"{self.table.file}: the dashboard reads {unknown}, which replay/outputs/schema.py does not declare")

    @property
    def names(self) -> tuple[str, ...]:
        return self.needed

    @property
    def kinds(self) -> dict[str, str]:
        return {name: _kind_of(dtype) for name, dtype in self.table.dtypes.items()}

    @property
    def not_null(self) -> tuple[str, ...]:
        return self.table.not_null

    @property
    def unique(self) -> tuple[str, ...]:
        return self.table.unique


_TICK_FLOATS = ("prompt_tokens_per_s", "output_tokens_per_s", "gpu_busy", "cost_usd", "cost_per_mtok_out_usd",
                "ttft_p50_ms", "ttft_p99_ms", "slo_attainment")
TICKS = Reads(run_schema.TICKS, ("t_us", "pool", "replicas_active", "replicas_loading", "replicas_draining", "gpus",
                                 "waiting", "running", "kv_used_blocks", "kv_total_blocks", "arrivals", "rejected",
                                 "preemptions", *_TICK_FLOATS))
EVENTS = Reads(run_schema.EVENTS, ("t_us", "pool", "replica", "kind", "detail", "request_id"))
REQUESTS = Reads(run_schema.REQUESTS, (
    "request_id", "workload", "pool", "replica", "arrival_us", "prompt_tokens", "output_tokens", "cached_tokens",
    "first_scheduled_us", "first_token_us", "finished_us", "ttft_us", "preemptions", "status", "reject_reason",
    "slo_met"))
FIRSTS = Reads(run_schema.FIRSTS, run_schema.FIRSTS.names)


def _kind_of(dtype: pl.DataType) -> str | None:
    if dtype.is_integer():
        return INT
    if dtype.is_float():
        return FLOAT
    if dtype in (pl.String, pl.Categorical, pl.Null):
        return STR
    if dtype == pl.Boolean:
        return BOOL
    return None


def _fits(dtype: pl.DataType, kind: str) -> bool:
    got = _kind_of(dtype)
    # an all-null column reads as Null (any kind); an integer column is a fine float
    return dtype == pl.Null or got == kind or (kind == FLOAT and got == INT)


def _where(frame: pl.DataFrame, row: int, schema: Reads) -> str:
    keys = [c for c in (schema.unique or ("request_id",)) if c in frame.columns]
    said = ", ".join(f"{c} {frame[c][row]!r}" for c in keys)
    return f"row {row}" + (f" ({said})" if said else "")


# A run's longest possible time: the config reader's 1e8 s bound on any span, in microseconds.
MAX_TIME_US = 10**14
CHECK_BATCH = 1 << 18  # rows of a table checked at a time (a day's requests are tens of millions)


def check_version(path: Path, metadata: dict[str, str]) -> None:
    """A Parquet file of a schema version this dashboard does not know is refused, not misread
    (replay/outputs/schema.py: only a change that is not an append moves the version). A file without the
    key was written before it existed: version 1."""
    got = metadata.get(run_schema.SCHEMA_KEY, "1")
    if got != str(run_schema.SCHEMA_VERSION):
        by = metadata.get("llm_replay.version")
        raise UserError(f"{path}: run schema version {got!r}{f' (written by llm-replay {by})' if by else ''}; this "
                        f"dashboard reads version {run_schema.SCHEMA_VERSION}: open it with the llm-replay that wrote it")


def check_frame(path: Path, frame: pl.DataFrame, schema: Reads) -> None:
    """Columns present with their kinds, keys not null and unique, statuses known."""
    missing = [c for c in schema.needed if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing column {missing[0]!r} (columns expected: README 'Run outputs'; "
                        "was it written by llm-replay?)")
    for name, kind in schema.kinds.items():
        if name in frame.columns and not _fits(frame.schema[name], kind):
            sample = frame[name].drop_nulls().head(1).to_list()
            value = f" (first value {sample[0]!r})" if sample else ""
            raise UserError(f"{path}: column {name!r} is {frame.schema[name]}{value}; expected {EXPECTED[kind]}")
    for name in schema.kinds:
        # the writer stores "no value" as null (NaN filled), never an infinity: either is damage,
        # and a chart of it would read "inf min"
        if name in frame.columns and frame.schema[name].is_float():
            bad = ~frame[name].is_finite() & frame[name].is_not_null()
            if bad.any():
                row = int(bad.arg_true()[0])
                raise UserError(f"{path}: {_where(frame, row, schema)}: {name} is {frame[name][row]}; expected a "
                                "finite number or null")
        if name in frame.columns and name.endswith("_us") and frame.schema[name].is_integer():
            bad = (frame[name] < 0) | (frame[name] > MAX_TIME_US)
            if bad.any():
                row = int(bad.arg_true()[0])
                raise UserError(f"{path}: {_where(frame, row, schema)}: {name} is {frame[name][row]}; expected "
                                f"microseconds from the run's start, 0 to {MAX_TIME_US:.0e}")
    for name in schema.not_null:
        if frame[name].null_count():
            row = int(frame[name].is_null().arg_true()[0])
            raise UserError(f"{path}: {_where(frame, row, schema)}: {name} is null; expected a value")
    if schema.unique and frame.height:
        dup = frame.select(pl.struct(schema.unique).is_duplicated()).to_series()
        if dup.any():
            row = int(dup.arg_true()[0])
            again = int(dup.arg_true()[1])
            raise UserError(f"{path}: {_where(frame, row, schema)} appears again at row {again}; expected one row "
                            f"per {' and '.join(schema.unique)}")
    if "status" in schema.needed:
        bad = ~frame["status"].is_in(STATUSES)
        if bad.any():
            row = int(bad.arg_true()[0])
            raise UserError(f"{path}: {_where(frame, row, schema)}: status {frame['status'][row]!r}; expected one of "
                            f"{', '.join(STATUSES)}")


def may_fail(path: Path, scan: pl.LazyFrame, schema: Reads) -> bool:
    """Whether check_frame could refuse the table `scan` reads, from its schema and one pass a
    batch of rows at a time (it holds no column): each of its tests reduced to whether any row fails it. False means
    check_frame would pass; True, that it must run on the whole frame to say what is wrong."""
    names = scan.collect_schema()
    try:  # the columns and their kinds, from the footer (a kind's message quotes a value: re-run)
        check_frame(path, pl.DataFrame(schema=names), schema)
    except UserError:
        return True
    tests = []
    for name in schema.kinds:
        if name in names and names[name].is_float():
            tests.append((~pl.col(name).is_finite() & pl.col(name).is_not_null()).any())
        if name in names and name.endswith("_us") and names[name].is_integer():
            tests.append(((pl.col(name) < 0) | (pl.col(name) > MAX_TIME_US)).any())
    tests += [pl.col(name).null_count() > 0 for name in schema.not_null]
    if "status" in schema.needed:
        tests.append((~pl.col("status").is_in(STATUSES)).any())
    # a single key is unique when increasing (as the writer writes request ids): no hash set;
    # checked within each batch and across each boundary, from a batch's first and last key
    single = len(schema.unique) == 1
    order = []
    if single:
        key = pl.col(schema.unique[0])
        order = [(key.diff().drop_nulls() <= 0).any() | key.is_null().any(), key.first(), key.last()]
    if not tests and not schema.unique:
        return False
    exprs = [*tests, *order]
    used = [name for name in names if any(name in e.meta.root_names() for e in exprs)]
    increasing, last = single, None
    for batch in scan.select(used).collect_batches(chunk_size=CHECK_BATCH, engine="streaming"):
        if not batch.height:
            continue
        row = batch.select(*(e.alias(f"t{i}") for i, e in enumerate(exprs))).row(0)
        if any(bool(v) for v in row[:len(tests)]):
            return True
        if increasing:
            increasing = not row[len(tests)] and (last is None or row[-2] > last)
            last = row[-1]
    if schema.unique and not increasing:
        keys = pl.col(schema.unique[0]) if single else pl.struct(schema.unique)
        return bool(scan.select(keys.n_unique() != pl.len()).collect(engine="streaming").item())
    return False


def _number(file: Path, key: str, value: object, positive: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        raise UserError(f"{file}: {key}: got {value!r}, expected a number > 0")
    return float(value)


def check_config(file: Path, cfg: object) -> dict:
    """The keys of config.yaml the dashboard uses: tick_s, metrics_window_s, slo, pools' names."""
    if not isinstance(cfg, dict):
        raise UserError(f"{file}: expected a mapping, got {type(cfg).__name__}")
    for key, most in (("tick_s", 3600), ("metrics_window_s", 7 * 86400)):  # the config reader's bounds
        if cfg.get(key) is not None and _number(file, key, cfg[key]) > most:
            raise UserError(f"{file}: {key}: got {cfg[key]!r}, expected at most {most:,} seconds")
    slo = cfg.get("slo")
    if slo is not None:
        if not isinstance(slo, dict):
            raise UserError(f"{file}: slo: got {slo!r}, expected a mapping (ttft_ms, tpot_ms, by_workload)")
        by = slo.get("by_workload") or {}
        if not isinstance(by, dict):
            raise UserError(f"{file}: slo.by_workload: got {by!r}, expected a mapping of workload -> targets")
        for where, targets in [("slo", slo), *((f"slo.by_workload.{w}", t) for w, t in by.items())]:
            if not isinstance(targets, dict):
                raise UserError(f"{file}: {where}: got {targets!r}, expected a mapping (ttft_ms, tpot_ms)")
            for key in ("ttft_ms", "tpot_ms"):
                if targets.get(key) is not None:
                    _number(file, f"{where}.{key}", targets[key])
    pools = cfg.get("pools")
    if pools is not None and not isinstance(pools, list):
        raise UserError(f"{file}: pools: got {pools!r}, expected a list of pools")
    return cfg


def check_summary(file: Path) -> dict:
    """summary.json, when a finished run has one, is a whole JSON object (not cut short)."""
    try:
        body = json.loads(file.read_text())
    except OSError as exc:
        raise UserError(f"{file}: not readable ({exc.strerror})") from None
    except ValueError as exc:
        raise UserError(f"{file}: not valid JSON, truncated or damaged? ({exc})") from None
    if not isinstance(body, dict):
        raise UserError(f"{file}: expected a JSON object, got {type(body).__name__}")
    return body


def summary_saturation(file: Path, body: dict) -> dict[str, str]:
    """Each pool's saturation class (`pools.<name>.saturation.class`, replay/fleet/saturation.py); a
    pool without one (a run recorded before the field existed) is left out."""
    pools = body.get("pools")
    if not isinstance(pools, dict):
        return {}
    found = {}
    for name, block in pools.items():
        got = block.get("saturation") if isinstance(block, dict) else None
        if got is None:
            continue
        state = got.get("class") if isinstance(got, dict) else got
        if state not in SATURATION_CLASSES:
            raise UserError(f"{file}: pools.{name}.saturation.class: got {state!r}, expected one of "
                            f"{', '.join(SATURATION_CLASSES)}")
        found[str(name)] = state
    return found
