"""Generic CSV / JSONL / Parquet traces described by a column map.

`column_map` maps canonical names to source columns; `time_unit` says what the arrival column
holds: seconds, milliseconds or microseconds (`s`, `ms`, `us`) or date-time strings (`datetime`).
"""

from __future__ import annotations

import dataclasses

import polars as pl

from traces.adapters import Options, Parsed, conclude
from common.errors import TraceError
from traces.fields import Checker
from traces.source import Source
from traces.tables import HASH_LIST, line_of, read_csv, read_jsonl, read_parquet

CANONICAL = (
    "arrival", "prompt_tokens", "output_tokens", "workload", "tenant",
    "priority", "session_id", "prefix_hashes", "adapter",
)  # fmt: skip
REQUIRED = ("arrival", "prompt_tokens", "output_tokens")
TIME_UNITS = {"s": 1_000_000, "ms": 1_000, "us": 1, "datetime": None}
_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}


def check_column_map(column_map: object, where: str) -> dict[str, str]:
    """The column map as a dict, or a TraceError naming the unknown/missing key."""
    if not isinstance(column_map, dict):
        raise TraceError(f"{where}: column_map must be a mapping of canonical name -> source column")
    for key, value in column_map.items():
        if key not in CANONICAL:
            raise TraceError(
                f"{where}: column_map has unknown key {key!r}; known keys: {', '.join(CANONICAL)}"
            )
        if not isinstance(value, str) or not value:
            raise TraceError(f"{where}: column_map.{key} = {value!r} (expected a column name)")
    for key in REQUIRED:
        if key not in column_map:
            raise TraceError(
                f"{where}: column_map needs {', '.join(REQUIRED)}; {key!r} is missing"
            )
    return dict(column_map)


def check_time_unit(unit: object, where: str) -> str:
    if unit not in TIME_UNITS:
        raise TraceError(f"{where}: time_unit {unit!r} is not known; known: {', '.join(TIME_UNITS)}")
    return unit


def generic(src: Source, opts: Options, container: str) -> Parsed:
    """Read a csv, jsonl or parquet trace through `opts.column_map`."""
    cmap = check_column_map(opts.column_map, src.display)
    unit = check_time_unit(opts.time_unit, src.display)
    if "prefix_hashes" in cmap and opts.prefix_block_tokens is None:
        raise TraceError(
            f"{src.display}: column_map maps prefix_hashes but prefix_block_tokens is not set "
            "(expected the tokens per hash block, e.g. 512 for Mooncake)"
        )
    source_columns = list(dict.fromkeys(cmap.values()))
    # (no line numbers read: a message finds its row's again)
    if container == "csv":
        table = read_csv(src, source_columns, types=_numeric_columns(cmap, unit), numbered=False)
    elif container == "parquet":
        table = read_parquet(src, source_columns, numbered=False)
    else:
        table = read_jsonl(src, _json_schema(cmap, unit), [cmap[k] for k in REQUIRED], numbered=False)
    lines = (lambda index: index + 1) if container == "parquet" else line_of(src, header=container == "csv")
    check = Checker(table, src.display, unit="row" if container == "parquet" else "line", lines=lines)
    del table  # (the checker's: released before the schema's columns are made)
    arrival = cmap["arrival"]
    if unit == "datetime":
        arrival_us = check.datetimes(arrival, fmt=None, what="a date-time like '2024-05-10 00:00:00.5+00:00'")
    else:
        arrival_us = check.times(arrival, us_per_unit=TIME_UNITS[unit], what=_UNIT_WORDS[unit])
    columns = {
        "arrival_us": arrival_us,
        "prompt_tokens": check.counts(cmap["prompt_tokens"], minimum=1),
        "output_tokens": check.counts(cmap["output_tokens"], minimum=1),
        "workload": _label(check, cmap.get("workload"), src.stem),
        "tenant": _label(check, cmap.get("tenant"), "default"),
    }
    if "priority" in cmap:
        columns["priority"] = check.integers(cmap["priority"], what="an integer priority")
    for key in ("session_id", "adapter"):
        if key in cmap:
            columns[key] = check.labels(cmap[key], None)
    block = None
    if "prefix_hashes" in cmap:
        columns["prefix_hashes"] = check.hash_lists(cmap["prefix_hashes"])
        block = opts.prefix_block_tokens
    parsed = conclude(check, columns, opts, block_tokens=block)
    note = time_unit_note(parsed.frame["arrival_us"], unit, src.display)
    return dataclasses.replace(parsed, notes=(note,)) if note else parsed


# Gaps of LLM serving traces: Azure, BurstGPT and Mooncake have a median gap under 1 s. A median
# gap of minutes, or a whole trace inside a few ms, is far more likely a time unit read wrong.
_SLOW_MEDIAN_GAP_S = 60.0
_FAST_SPAN_S = 0.01
_SMALLER = {"s": "ms", "ms": "us"}
_LARGER = {"us": "ms", "ms": "s"}


def time_unit_note(arrival_us: pl.Series, unit: str, display: str) -> str | None:
    """A warning when the arrivals read in `unit` look like another unit's, else None."""
    if unit not in _UNIT_WORDS or len(arrival_us) < 3:
        return None
    gaps = arrival_us.diff().drop_nulls()
    gaps = gaps.filter(gaps > 0)
    span_s = (arrival_us.max() - arrival_us.min()) / 1e6
    if len(gaps) and gaps.median() / 1e6 > _SLOW_MEDIAN_GAP_S and unit in _SMALLER:
        other = _SMALLER[unit]
        return (f"{display}: read as {_UNIT_WORDS[unit]}, arrivals span {span_s:,.0f} s with a median gap of "
                f"{gaps.median() / 1e6:,.0f} s between requests; if the arrival column holds {_UNIT_WORDS[other]}, "
                f"pass --time-unit {other}")
    if len(arrival_us) >= 100 and 0 < span_s < _FAST_SPAN_S and unit in _LARGER:
        other = _LARGER[unit]
        return (f"{display}: read as {_UNIT_WORDS[unit]}, {len(arrival_us):,} requests arrive within "
                f"{span_s * 1e3:.3g} ms; if the arrival column holds {_UNIT_WORDS[other]}, pass --time-unit {other}")
    return None


def _label(check: Checker, col: str | None, default: str) -> pl.Series:
    if col is None:
        return pl.repeat(default, check.frame.height, eager=True)
    return check.labels(col, default)


def _numeric_columns(cmap: dict[str, str], unit: str) -> dict[str, pl.DataType]:
    """Source columns every use of which parses one numeric type (read_csv may parse them as it reads)."""
    types = _json_schema(cmap, unit)
    uses: dict[str, set] = {}
    for key, col in cmap.items():
        uses.setdefault(col, set()).add(_json_schema({key: col}, unit)[col])
    return {col: types[col] for col, kinds in uses.items() if len(kinds) == 1 and types[col] in (pl.Int64, pl.Float64)}


def _json_schema(cmap: dict[str, str], unit: str) -> dict[str, pl.DataType]:
    """Declared read schema of a generic JSONL trace (strict; anything else takes the slow path)."""
    types = {
        "arrival": pl.String if unit == "datetime" else pl.Float64,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "priority": pl.Int64,
        "prefix_hashes": HASH_LIST,
    }
    schema: dict[str, pl.DataType] = {}
    for key, col in cmap.items():
        schema.setdefault(col, types.get(key, pl.String))
    return schema
