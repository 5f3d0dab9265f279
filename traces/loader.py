"""`load_trace`: open a file (or bundled name), pick its adapter, return the canonical frame."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

import polars as pl

from common.errors import TraceError
from traces import adapters, logs
from traces.canonical import BLOCK_KEY, canonical, is_canonical
from traces.genai_perf import genai_perf
from traces.adapters import Options, Parsed
from traces.generic import check_column_map, check_time_unit, generic
from traces.limits import DEFAULT_LIMITS, TraceLimits
from traces.schema import cast_to_schema
from traces.source import FORMATS, GENERIC_FORMATS, Source, detect, open_source
from traces.stream import TraceBatches, open_batches

ADAPTERS: dict[str, Callable[[Source, Options], Parsed]] = {
    "aiperf": logs.aiperf,
    "blis": logs.blis,
    "genai-perf": genai_perf,
    "inference-perf": logs.inference_perf,
    "litellm": logs.litellm,
    "azure": adapters.azure,
    "burstgpt": adapters.burstgpt,
    "csv": lambda src, opts: generic(src, opts, "csv"),
    "jsonl": lambda src, opts: generic(src, opts, "jsonl"),
    "mooncake": adapters.mooncake,
    "parquet": lambda src, opts: generic(src, opts, "parquet"),
    "splitwise": adapters.splitwise,
    "vidur": adapters.vidur,
}
assert sorted(ADAPTERS) == sorted(FORMATS)
MAX_BLOCK_TOKENS = 1 << 20  # tokens per prefix-hash block (Mooncake: 512); no prompt is longer than 1M


@dataclasses.dataclass(frozen=True)
class LoadedTrace:
    """A trace in the canonical schema plus where it came from and what loading changed."""

    frame: pl.DataFrame
    source: str  # path as given, or bundled name
    format: str
    prefix_block_tokens: int | None
    sha256: str  # of the input file bytes; of the concatenated hashes for merged traces
    dropped: dict[str, int]  # reason -> rows removed, e.g. {"zero_output_tokens": 12}
    reordered: int  # rows that arrived before an earlier row of the file and were sorted
    notes: tuple[str, ...] = ()  # warnings: what looks wrong but may be meant (a time unit, shared hashes)
    # Read in batches as the replay goes (traces/stream.py): `frame` then holds no rows, only
    # the schema's columns; `whole()` reads them for whatever needs every row at once.
    stream: TraceBatches | None = None

    @property
    def rows(self) -> int:
        return self.frame.height if self.stream is None else self.stream.rows

    def whole(self) -> LoadedTrace:
        """This trace with every row in `frame`."""
        if self.stream is None:
            return self
        return dataclasses.replace(self, frame=self.stream.frame(), stream=None)


_NO_ROWS = pl.DataFrame(schema={"arrival_us": pl.Int64, "prompt_tokens": pl.Int32, "output_tokens": pl.Int32})


def _streamed(src: Source, batches: TraceBatches, prefix_block_tokens: int | None) -> LoadedTrace:
    """A canonical file to be read in batches: a frame of its columns and no rows."""
    block = prefix_block_tokens if prefix_block_tokens is not None else _block_tokens(src)
    if batches.hashed and block is None:  # (as canonical() says it)
        raise TraceError(f"{src.display}: prefix_hashes without a block size (metadata {BLOCK_KEY}); "
                         "set prefix_block_tokens")
    return LoadedTrace(frame=cast_to_schema(_NO_ROWS, src.display), source=src.display, format="parquet",
                       prefix_block_tokens=block, sha256=src.sha256, dropped={}, reordered=0, stream=batches)


def _block_tokens(src: Source) -> int | None:
    """The file's prefix-block size (metadata), as canonical() reads it."""
    text = pl.read_parquet_metadata(src.parquet_source()).get(BLOCK_KEY)
    try:
        return None if text is None else int(text)
    except ValueError:
        raise TraceError(f"{src.display}: metadata {BLOCK_KEY}={text!r} (expected an integer)") from None


def check_format(name: object, where: str = "trace") -> str:
    if name not in ADAPTERS:
        raise TraceError(f"{where}: unknown trace format {name!r}; known: {', '.join(FORMATS)}")
    return name


def load_trace(
    path: str | pathlib.Path,
    *,
    format: str | None = None,
    column_map: dict[str, str] | None = None,
    time_unit: str | None = None,
    workload: str | None = None,
    prefix_block_tokens: int | None = None,
    strict: bool = False,
    limits: TraceLimits = DEFAULT_LIMITS,
    stream: bool = False,
) -> LoadedTrace:
    """Load one trace file in the canonical schema.

    `path` is a file (plain or .gz) or a bundled trace name. `format` overrides detection;
    `column_map` and `time_unit` (default `s`) describe a generic csv/jsonl/parquet file;
    `workload` replaces every row's label; `prefix_block_tokens` overrides the hash block size.
    Unsorted arrivals are sorted and counted in `reordered`, or raise with `strict=True`.
    `limits` bound the file's decompressed size, its lines and the span of its arrivals.
    `stream`: a canonical Parquet file that can be read in batches (traces/stream.py) as the
    replay goes, not whole (LoadedTrace.stream).
    """
    display = str(path)
    if format is not None:
        check_format(format, display)
    if prefix_block_tokens is not None and (
        isinstance(prefix_block_tokens, bool) or not isinstance(prefix_block_tokens, int)
        or not 1 <= prefix_block_tokens <= MAX_BLOCK_TOKENS
    ):
        raise TraceError(f"{display}: prefix_block_tokens={prefix_block_tokens!r} "
                         f"(expected an integer in 1..{MAX_BLOCK_TOKENS:,})")
    if column_map is not None:
        check_column_map(column_map, display)
    if time_unit is not None:
        check_time_unit(time_unit, display)
    src = open_source(path, limits)
    fmt = format or detect(src, column_map)
    if fmt == "parquet" and not column_map and time_unit is None and is_canonical(src):
        # a trace already in the schema (llm-replay synth's output): no column map to ask for
        batches = open_batches(src, workload) if stream else None
        if batches is not None:
            return _streamed(src, batches, prefix_block_tokens)
        parsed = canonical(src, Options(workload=workload, prefix_block_tokens=prefix_block_tokens))
        return LoadedTrace(frame=parsed.frame, source=display, format="parquet",
                           prefix_block_tokens=parsed.prefix_block_tokens, sha256=src.sha256, dropped={}, reordered=0)
    if fmt in GENERIC_FORMATS:
        if not column_map:
            raise TraceError(
                f"{display}: format {fmt!r} needs a column_map (canonical name -> column), "
                "e.g. {arrival: ts, prompt_tokens: in, output_tokens: out}"
            )
    elif column_map is not None or time_unit is not None:
        raise TraceError(
            f"{display}: column_map and time_unit apply to the csv, jsonl and parquet formats only, "
            f"not to {fmt!r}"
        )
    opts = Options(
        workload=workload,
        prefix_block_tokens=prefix_block_tokens,
        strict=strict,
        column_map=column_map,
        time_unit=time_unit or "s",
        max_span_s=limits.max_span_s,
    )
    try:
        parsed = ADAPTERS[fmt](src, opts)
    except TraceError:
        # a bad value, found in columns parsed as they were read: read again as text, so the
        # message quotes it as the file has it
        parsed = ADAPTERS[fmt](dataclasses.replace(src, typed=False), opts)
    return LoadedTrace(
        frame=parsed.frame,
        source=display,
        format=fmt,
        prefix_block_tokens=parsed.prefix_block_tokens,
        sha256=src.sha256,
        dropped=parsed.dropped,
        reordered=parsed.reordered,
        notes=parsed.notes,
    )
