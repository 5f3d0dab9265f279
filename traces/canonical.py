"""Canonical Parquet: a file already in TRACE_SCHEMA (what `llm-replay synth` writes) read as is.

A Parquet file whose columns carry the schema's names (`arrival_us`, `prompt_tokens`,
`output_tokens`, ...) needs no column map: its times are microseconds from the trace start and
its prefix-hash block size is in the file's key-value metadata (BLOCK_KEY), so it loads like any
other trace. `write_canonical` writes one atomically (a temporary name beside it, then a rename).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from common.errors import TraceError
from traces.adapters import Options, Parsed
from traces.schema import EXTRA_COLUMNS, TRACE_SCHEMA, cast_to_schema
from traces.source import Source
from traces.tables import read_parquet

BLOCK_KEY = "llm_replay.prefix_block_tokens"
MARKERS = ("arrival_us", "prompt_tokens", "output_tokens")


def is_canonical(src: Source) -> bool:
    """A Parquet file with the schema's three required columns by their canonical names."""
    try:
        names = set(pl.read_parquet_schema(src.parquet_source()))
    except pl.exceptions.PolarsError:
        return False
    return names >= set(MARKERS)


def canonical(src: Source, opts: Options) -> Parsed:
    # request_id is not read: renumbered, as a filtered copy of a trace is still a trace. (Numbered
    # and that column dropped again, polars 2.1 copies every column: 0.5 GB at 5M rows.)
    columns = [name for name in [*TRACE_SCHEMA, *EXTRA_COLUMNS] if name != "request_id"]
    frame = read_parquet(src, MARKERS, columns, cast={**TRACE_SCHEMA, **EXTRA_COLUMNS}, numbered=False)
    block = opts.prefix_block_tokens
    if block is None:
        text = pl.read_parquet_metadata(src.parquet_source()).get(BLOCK_KEY)
        if text is not None:
            try:
                block = int(text)
            except ValueError:
                raise TraceError(f"{src.display}: metadata {BLOCK_KEY}={text!r} (expected an integer)") from None
    if "prefix_hashes" in frame.columns and frame["prefix_hashes"].null_count() < frame.height and block is None:
        raise TraceError(f"{src.display}: prefix_hashes without a block size (metadata {BLOCK_KEY}); "
                         "set prefix_block_tokens")
    if opts.workload is not None:
        frame = frame.with_columns(pl.lit(opts.workload).alias("workload"))
    return Parsed(cast_to_schema(frame, source=src.display), 0, {}, block)


def write_canonical(frame: pl.DataFrame, path: str | Path, prefix_block_tokens: int | None) -> None:
    """`frame` (in TRACE_SCHEMA) to `path`, whole or not at all."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    metadata = {BLOCK_KEY: str(prefix_block_tokens)} if prefix_block_tokens else None
    try:
        frame.write_parquet(tmp, metadata=metadata, statistics=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
