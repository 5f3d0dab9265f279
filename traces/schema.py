"""The canonical trace frame every adapter ends in, and the cast/validation into it.

Times are int64 microseconds from the trace start (`arrival_us`); token counts are int32.
"""

from __future__ import annotations

import polars as pl

from common.errors import TraceError
from traces.limits import human_span

TRACE_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64,  # 0..n-1 in arrival order
    "arrival_us": pl.Int64,  # microseconds since the trace start
    "prompt_tokens": pl.Int32,
    "output_tokens": pl.Int32,
    "workload": pl.String,  # class label: "conv", "code", "mooncake", or the user's label
    "tenant": pl.String,
    "priority": pl.Int32,  # lower = more urgent, as vLLM
    "session_id": pl.String,  # nullable
    "prefix_hashes": pl.List(pl.UInt64),  # nullable; one id per prefix block, Mooncake style
    "adapter": pl.String,  # nullable LoRA id
}
NULLABLE = frozenset({"session_id", "prefix_hashes", "adapter"})
DEFAULTS = {"workload": "default", "tenant": "default", "priority": 0}
# What a request log observed of each request (traces/records.py), microseconds, nullable. Kept
# after the schema's columns only when the source has them, so other traces keep their shape.
OBSERVED_COLUMNS: dict[str, pl.DataType] = {"observed_ttft_us": pl.Int64, "observed_e2e_us": pl.Int64}
# A session turn's delay between the previous turn's finish and its own release (a user's think
# time, an agent's tool time), microseconds, null on a session's first turn. Kept like the
# observed columns: only when the source has it (synthesized sessions, a canonical Parquet).
SESSION_COLUMNS: dict[str, pl.DataType] = {"think_time_us": pl.Int64}
EXTRA_COLUMNS: dict[str, pl.DataType] = {**OBSERVED_COLUMNS, **SESSION_COLUMNS}


def cast_to_schema(frame: pl.DataFrame, source: str = "trace", first_id: int = 0,
                   after_us: int | None = None, check: bool = True) -> pl.DataFrame:
    """`frame` cast to TRACE_SCHEMA (columns in order, defaults filled), or a TraceError naming
    the column and row that break it: nulls, tokens < 1, negative or unsorted arrivals, ids not 0..n-1.
    Missing optional columns get their defaults; a missing `request_id` is numbered 0..n-1.
    A batch of a larger trace (traces/stream.py) is rows `first_id`.. of it, numbered and named
    so, and its first arrival may not precede `after_us` (the last of the batch before).
    `check=False`: rows validated already (a second read of a checked trace), cast only.
    """
    for name in ("arrival_us", "prompt_tokens", "output_tokens"):
        if name not in frame.columns:
            raise TraceError(f"{source}: missing column {name!r} (expected {', '.join(TRACE_SCHEMA)})")
    numbered = "request_id" not in frame.columns  # (numbered here: in sequence, not checked)
    if numbered:
        frame = frame.with_columns(pl.int_range(first_id, first_id + frame.height, dtype=pl.Int64).alias("request_id"))
    columns = []
    for name, dtype in TRACE_SCHEMA.items():
        if name in frame.columns:
            column = frame[name]
            if name in DEFAULTS and column.null_count():
                column = column.fill_null(DEFAULTS[name])
        else:
            column = pl.repeat(DEFAULTS.get(name), frame.height, dtype=dtype, eager=True)
        try:
            columns.append(column.cast(dtype, strict=True).rename(name))
        except pl.exceptions.PolarsError:
            raise TraceError(
                f"{source}: column {name!r} of type {column.dtype} cannot be cast to {dtype}"
            ) from None
    for name, dtype in EXTRA_COLUMNS.items():
        if name in frame.columns:
            columns.append(frame[name].cast(dtype, strict=False).rename(name))
    out = pl.DataFrame(columns)
    if check:
        _validate(out, source, first_id, after_us, numbered)
    return out


def _validate(frame: pl.DataFrame, source: str, first_id: int = 0, after_us: int | None = None,
              numbered: bool = False) -> None:
    """Each check a reduction over its column (a null count, a minimum, a sortedness test per
    chunk); only a check that fails makes its mask, to name the first row that breaks it (a
    day's batches: the masks were half of the check pass)."""
    def fail(mask: pl.Series, what: str) -> None:
        if mask.any():
            row = int(mask.arg_true()[0])
            raise TraceError(f"{source}: row {first_id + row} (request_id {frame['request_id'][row]}): {what}")

    if not frame.height:
        return
    for name in TRACE_SCHEMA:
        if name not in NULLABLE and frame[name].null_count():
            fail(frame[name].is_null(), f"{name} is null (expected a value)")
    for name, least, what in (("prompt_tokens", 1, "prompt_tokens < 1 (expected at least 1 token)"),
                              ("output_tokens", 1, "output_tokens < 1 (expected at least 1 token)"),
                              ("arrival_us", 0, "arrival_us is negative (expected >= 0)"),
                              ("think_time_us", 0, "think_time_us is negative (expected >= 0 microseconds, or null)")):
        if name in frame.columns and (low := frame[name].min()) is not None and low < least:
            fail(frame[name] < least, what)
    hashes = frame["prefix_hashes"]
    if hashes.null_count() < frame.height:
        # a request's list may be null (no hashes), not an entry in it: the engine has no id for that block
        null_entry = hashes.list.eval(pl.element().is_null().any()).list.first()
        fail(null_entry.fill_null(False), "prefix_hashes holds a null hash (expected one id per prefix block, or a null list)")
    arrival = frame["arrival_us"]
    if not _ascending(arrival, after_us):
        fail(arrival < arrival.shift(1, fill_value=after_us), "arrival_us is earlier than the previous row's (expected sorted)")
    ids = frame["request_id"]
    if not numbered and not (ids[0] == first_id and ids[-1] == first_id + frame.height - 1 and _ascending(ids, None, strictly=True)):
        expected = pl.int_range(first_id, first_id + frame.height, dtype=pl.Int64, eager=True)
        fail(ids != expected, "request_id out of sequence (expected 0..n-1 in order)")


def _ascending(column: pl.Series, after: int | None, strictly: bool = False) -> bool:
    """Whether a non-null integer column never decreases (`strictly`: always increases), from
    `after` on; read a chunk at a time as numpy views (no copy of the column)."""
    last = after
    for chunk in column.get_chunks():
        values = chunk.to_numpy()
        if not len(values):
            continue
        step = values[1:] <= values[:-1] if strictly else values[1:] < values[:-1]
        if (last is not None and (values[0] <= last if strictly else values[0] < last)) or step.any():
            return False
        last = values[-1]
    return True


def finish(frame: pl.DataFrame, checker, *, strict: bool,
           max_span_s: float | None = None) -> tuple[pl.DataFrame, int]:
    """Sort by arrival (stable), start the clock at the first arrival, number the requests and
    cast to the schema. Returns the frame and how many rows were out of order, i.e. arrived
    before some earlier row of the file. `checker` (a fields.Checker) names rows in errors; `frame` holds
    absolute `arrival_us` plus whatever canonical columns the source has. A trace spanning more
    than `max_span_s` is refused, naming the two rows of its widest gap (a stray epoch timestamp
    among small ones would otherwise be replayed as decades of ticks).
    """
    arrival = frame["arrival_us"]
    running = arrival.cum_max().shift(1)
    late = (arrival < running).fill_null(False)
    reordered = int(late.sum())
    if reordered and strict:
        row = int(late.arg_true()[0])
        earlier = int((arrival.head(row) == running[row]).arg_true()[0])
        start = arrival.min()
        raise TraceError(
            f"{checker.where(row)}: arrival at {(arrival[row] - start) / 1e6:.6f} s is before the "
            f"{(running[row] - start) / 1e6:.6f} s of {checker.line(earlier)} ({reordered} rows out of "
            "order; strict mode expects arrivals in time order)"
        )
    if max_span_s is not None:
        _check_span(arrival, checker, max_span_s)
    if reordered:
        frame = frame.sort("arrival_us", maintain_order=True)
    frame = frame.with_columns(
        (pl.col("arrival_us") - pl.col("arrival_us").min()).alias("arrival_us"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"),
    )
    return cast_to_schema(frame.drop("__line", strict=False)), reordered


def _check_span(arrival: pl.Series, checker, max_span_s: float) -> None:
    """`arrival`: the absolute arrivals in the checker's row order (the widest gap is found in
    arrival order, a stable sort's, and its two rows named as the checker names them)."""
    span_us = int(arrival.max()) - int(arrival.min())
    if span_us <= max_span_s * 1e6:
        return
    rows = pl.DataFrame({"arrival": arrival, "row": pl.int_range(len(arrival), eager=True)}) \
        .sort("arrival", maintain_order=True)
    arrival, order = rows["arrival"], rows["row"]
    gaps = arrival.diff().fill_null(0)
    late = int(gaps.arg_max())
    rows = (int(order[late]), int(order[late - 1]))
    raise TraceError(
        f"{checker.where(rows[0])} arrives at {_seconds(arrival[late])}, "
        f"{human_span(gaps[late] / 1e6)} after {checker.line(rows[1])} ({_seconds(arrival[late - 1])}): "
        f"the trace would span {human_span(span_us / 1e6)}, more than the bound of {human_span(max_span_s)} "
        "(check the arrival column's time unit; --max-span-s raises the bound)"
    )


def _seconds(us: int) -> str:
    return f"{us / 1e6:,.0f} s" if abs(us) >= 1e9 else f"{us / 1e6:.6g} s"
