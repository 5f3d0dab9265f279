"""A canonical Parquet trace read in row batches, so that a replay holds a window of it, not all.

`llm-replay synth` writes traces already in TRACE_SCHEMA (traces/canonical.py); such a file needs
no sort, no renumbering beyond an offset and no other row's values to cast a row, so it can be
read `BATCH_ROWS` rows at a time. `open_batches` reads it once to validate every batch as
`cast_to_schema` validates the whole frame (the same messages, naming the same global rows; an
arrival earlier than the last row of the batch before is unsorted too) and to learn what a
replay needs up front: the row count, the first and last arrivals, the longest prompt, the
arrival of every MARK_ROWS-th row (where a read of the trace's tail starts), and the distinct
tenants and workloads (tenant ids are dense ranks over the whole trace; a workload split checks
every label). cast_to_schema checks each batch with a reduction a check, its mask only where one
fails, to name the row (traces/schema.py). A replay then reads the batches again as its request
window fills (replay/fleet/streamed.py), cast and numbered, not checked again.

A trace with prefix hashes is read so too, in shorter batches (HASH_BATCH hashes, about): the
engine's window holds the hashes of the requests it holds (replay/engine/window.py). What needs more than one batch keeps the whole frame
(`open_batches` answers None): a request log's observed columns and a session's think times, and
files that are not canonical.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import stat
from collections.abc import Iterator, Sequence

import polars as pl

from common.errors import TraceError
from traces.schema import EXTRA_COLUMNS, TRACE_SCHEMA, cast_to_schema
from traces.source import Source
from traces.tables import parquet_columns

BATCH_ROWS = 1 << 20  # rows read at a time
# A trace with prefix hashes is read in batches of about this many hashes (fewer rows, not fewer
# than MIN_HASHED_ROWS), its hashes a row the mean of its first HASH_SAMPLE_ROWS rows: a batch's
# lists and their flat copy are what a hashed trace's replay holds beyond a plain one's
# (bench/bench_stream_hashes.py), and a million Mooncake-like rows hold ~20M hashes.
HASH_BATCH = 1 << 22
MIN_HASHED_ROWS = 1 << 16
HASH_SAMPLE_ROWS = 1 << 16
MARK_ROWS = 1 << 16  # rows between two of TraceBatches.marks
# The columns a batch is read with (request_id is numbered, as the whole path numbers it).
READ = tuple(name for name in TRACE_SCHEMA if name != "request_id")
MARKERS = ("arrival_us", "prompt_tokens", "output_tokens")  # (traces/canonical.py's)


@dataclasses.dataclass(frozen=True, eq=False)
class TraceBatches:
    """A validated canonical Parquet trace, to be read `batch_rows` rows at a time."""

    source: Source
    rows: int
    workload: str | None  # replaces every row's label (the trace's `workload` option)
    first_arrival_us: int
    last_arrival_us: int
    tenants: tuple[str, ...]  # distinct, sorted (as polars sorts strings: by their bytes)
    workloads: tuple[str, ...]  # distinct, sorted
    adapters: bool  # whether any row names a LoRA adapter
    hashed: bool  # whether any row has prefix hashes
    stored: tuple[str, ...]  # the file's columns of TRACE_SCHEMA (the others take their defaults)
    batch_rows: int = BATCH_ROWS
    max_prompt_tokens: int = 0
    # (row, arrival) of every MARK_ROWS-th row of each batch, from the first: where a read `since`
    # a time starts
    marks: tuple[tuple[int, int], ...] = ()
    # Every row validated (open_batches' pass): a replay's reads cast and number the batches
    # without checking them again
    checked: bool = False

    def batches(self, columns: Sequence[str] = READ, since_us: int | None = None) -> Iterator[tuple[int, pl.DataFrame]]:
        """(first request id, the batch) from the first row (`since_us`: from a row no later than
        the first arriving at or after it) to the last, each cast and validated as `cast_to_schema`
        does the whole trace (its first arrival against the batch before's last; `checked`: cast
        only): request_id and `columns` of TRACE_SCHEMA (the three required ones always)."""
        wanted = {"request_id", "arrival_us", "prompt_tokens", "output_tokens", *columns}
        read = [c for c in READ if c in wanted and c in self.stored and not (c == "workload" and self.workload)]
        lo = 0
        if since_us is not None:
            at = bisect.bisect_right([t for _, t in self.marks], since_us) - 1
            lo = self.marks[at][0] if at >= 0 else 0
        last = None
        for frame in _scan_batches(self.source, read, self.batch_rows, lo):
            if self.workload is not None:
                frame = frame.with_columns(pl.lit(self.workload, pl.String).alias("workload"))
            frame = cast_to_schema(frame, source=self.source.display, first_id=lo, after_us=last, check=not self.checked)
            first, lo, last = lo, lo + frame.height, int(frame["arrival_us"][-1])
            yield first, frame.select([name for name in TRACE_SCHEMA if name in wanted])
            del frame  # (not held while the next batch is read: a hashed one's lists are large)

    def frame(self) -> pl.DataFrame:
        """The whole trace, as traces/canonical.py reads it (for a replay that needs every row)."""
        return pl.concat([batch for _, batch in self.batches()], rechunk=False)

    def ends(self) -> pl.DataFrame:
        """The first and last arrivals as a two-row frame (what span and tick checks read)."""
        return pl.DataFrame({"arrival_us": [self.first_arrival_us, self.last_arrival_us]},
                            schema={"arrival_us": pl.Int64})


def readable_in_batches(path, lora: bool = False) -> bool:
    """Whether `open_batches` would take this file (a canonical Parquet trace with no observed
    columns or think times; with `lora`, naming no adapter either), from its footer and (`lora`)
    a pass over the adapter column: what --max-memory's estimate asks before the load."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a FIFO or a device is never opened here (the loader refuses it by its kind)
        with open(path, "rb") as handle:
            if handle.read(4) != b"PAR1":
                return False
        names = pl.read_parquet_schema(path)
        if not set(MARKERS) <= set(names) or set(names) & set(EXTRA_COLUMNS):
            return False
        if not (lora and "adapter" in names):
            return True
        rows, nulls = pl.scan_parquet(path).select(pl.len(), pl.col("adapter").null_count()).collect().row(0)
    except (pl.exceptions.PolarsError, OSError):
        return False
    return rows == nulls


def hashes_per_row(source) -> float:
    """Prefix hashes a row of a Parquet file (a path or a Parquet source) with a `prefix_hashes`
    column: the mean of its first HASH_SAMPLE_ROWS rows (every list would take seconds); else 0."""
    if "prefix_hashes" not in pl.read_parquet_schema(source):
        return 0.0
    rows, hashes = pl.scan_parquet(source).head(HASH_SAMPLE_ROWS).select(
        pl.len(), pl.col("prefix_hashes").list.len().sum()).collect().row(0)
    return (hashes or 0) / rows if rows else 0.0


def batch_rows_for(per_row: float) -> int:
    """The rows of a batch of a trace with `per_row` prefix hashes a row (HASH_BATCH's)."""
    if per_row <= 0:
        return BATCH_ROWS
    return int(min(BATCH_ROWS, max(MIN_HASHED_ROWS, HASH_BATCH / per_row)))


def open_batches(src: Source, workload: str | None, batch_rows: int | None = None) -> TraceBatches | None:
    """The file read once in batches (of `batch_rows`; by default BATCH_ROWS, fewer for prefix
    hashes: `batch_rows_for`) and validated; None where a replay of it needs the whole frame
    (module doc)."""
    present = parquet_columns(src)
    if set(present) & set(EXTRA_COLUMNS):
        return None
    if batch_rows is None:
        try:
            batch_rows = batch_rows_for(hashes_per_row(src.parquet_source()))
        except pl.exceptions.PolarsError:
            batch_rows = BATCH_ROWS  # (the pass below names what is wrong with the file)
    stored = tuple(name for name in READ if name in present)
    rows = pl.scan_parquet(src.parquet_source()).select(pl.len()).collect().item()
    if rows == 0:
        raise TraceError(f"{src.display}: no rows (expected at least one request)")
    probe = TraceBatches(src, rows, workload, 0, 0, (), (), False, False, stored, batch_rows)
    tenants: set[str] = set()
    workloads: set[str] = set()
    adapters = hashed = False
    marks: list[tuple[int, int]] = []
    longest = last = 0
    for lo, batch in probe.batches():
        hashed = hashed or batch["prefix_hashes"].null_count() < batch.height
        tenants.update(_labels(batch, "tenant"))
        workloads.update(_labels(batch, "workload"))
        adapters = adapters or batch["adapter"].null_count() < batch.height
        marks.extend(zip(range(lo, lo + batch.height, MARK_ROWS), batch["arrival_us"].gather_every(MARK_ROWS).to_list()))
        longest = max(longest, int(batch["prompt_tokens"].max()))
        last = int(batch["arrival_us"][-1])
    return TraceBatches(src, rows, workload, marks[0][1], last, tuple(_sorted(tenants)), tuple(_sorted(workloads)),
                        adapters, hashed, stored, batch_rows, longest, tuple(marks), checked=True)


def _labels(batch: pl.DataFrame, name: str) -> list[str]:
    """The distinct labels of a batch's column: a lazy frame's `unique` (a fifth of the m-large
    day's check pass as Series.unique, which is slow on the batches' many chunks; this, 2.5x less)."""
    return batch.select(name).lazy().unique().collect()[name].to_list()


def _sorted(labels: set[str]) -> list[str]:
    return sorted(labels, key=lambda s: s.encode())


def _scan_batches(src: Source, columns: list[str], rows: int, start: int = 0) -> Iterator[pl.DataFrame]:
    """The file's `columns` in batches of about `rows`, in order, in one pass (polars' streaming
    engine): cast to TRACE_SCHEMA's types as they are read while every value casts (no wide copy
    of a column is held), else from that row on as stored (cast_to_schema then names what does not).
    From row `start` (the reader skips the row groups before it)."""
    scan = pl.scan_parquet(src.parquet_source()).select(columns)
    if start:
        scan = scan.slice(start)
    done = 0
    try:
        for frame in scan.cast({k: TRACE_SCHEMA[k] for k in columns}, strict=True).collect_batches(chunk_size=rows):
            done += frame.height
            yield frame
            del frame
        return
    except pl.exceptions.PolarsError:
        pass
    try:
        for frame in scan.collect_batches(chunk_size=rows):
            skip, done = min(done, frame.height), max(0, done - frame.height)
            if skip < frame.height:
                yield frame.slice(skip)
    except pl.exceptions.PolarsError as exc:
        raise TraceError(f"{src.display}: not a readable Parquet file ({str(exc).strip().splitlines()[0]})") from None
