"""One small adapter per trace source, each ending in `finish` (sort, zero the clock, cast).

Read schemas are declared per format (the column names and what each becomes); values arrive as
text or JSON scalars and are parsed by `traces.fields.Checker`, which names the first bad line.
"""

from __future__ import annotations

import dataclasses
import re

import polars as pl

from common.errors import TraceError
from traces.fields import Checker
from traces.schema import TRACE_SCHEMA, finish
from traces.source import AZURE_COLUMNS, BURSTGPT_COLUMNS, VIDUR_COLUMNS, Source
from traces.tables import HASH_LIST, line_of, read_csv, read_jsonl

MOONCAKE_BLOCK_TOKENS = 512
AZURE_2023_FORMAT = "%Y-%m-%d %H:%M:%S%.f"  # 2023-11-16 18:15:46.6805900 (naive, read as UTC)
AZURE_2024_FORMAT = "%Y-%m-%d %H:%M:%S%.f%:z"  # 2024-05-10 00:00:00.009930+00:00
_OFFSET = re.compile(r"(Z|[+-]\d\d:?\d\d)$")


@dataclasses.dataclass(frozen=True)
class Options:
    """What `load_trace` passes to every adapter."""

    workload: str | None = None
    prefix_block_tokens: int | None = None
    strict: bool = False
    column_map: dict[str, str] | None = None
    time_unit: str = "s"
    max_span_s: float | None = None  # see traces.limits


@dataclasses.dataclass(frozen=True)
class Parsed:
    frame: pl.DataFrame
    reordered: int
    dropped: dict[str, int]
    prefix_block_tokens: int | None
    notes: tuple[str, ...] = ()  # warnings for the user: doubtful but not wrong


def conclude(check: Checker, columns: dict[str, pl.Series], opts: Options,
             dropped: dict[str, int] | None = None, block_tokens: int | None = None) -> Parsed:
    """Raise the first recorded problem, else build the frame and finish it into the schema.
    `columns` is taken (emptied once in the frame) and the checker's frame released, so that
    neither the read columns nor the checked ones' wide types are held while the schema's are
    made; the checked values are cast to the schema's types first (where one does not fit, as a
    sum of two counts may not, `finish` names it)."""
    check.done()
    check.release()
    frame = pl.DataFrame(columns)
    columns.clear()
    narrow = {name: TRACE_SCHEMA[name] for name in frame.columns if name in TRACE_SCHEMA and name != "arrival_us"}
    try:
        frame = frame.cast(narrow)
    except pl.exceptions.PolarsError:
        pass
    if opts.workload is not None:
        frame = frame.with_columns(pl.lit(opts.workload).alias("workload"))
    frame, reordered = finish(frame, check, strict=opts.strict, max_span_s=opts.max_span_s)
    return Parsed(frame, reordered, dropped or {}, block_tokens)


def name_label(src: Source, fallback: str) -> str:
    """Workload label from the file name: 'conv' or 'code' as Azure/Splitwise name them, else `fallback`."""
    stem = src.stem.lower()
    for label in ("conv", "code"):
        if label in stem:
            return label
    return fallback


def azure(src: Source, opts: Options) -> Parsed:
    """Azure LLM inference traces 2023 (naive 7-digit timestamps) and 2024 (UTC offset)."""
    check = Checker(read_csv(src, AZURE_COLUMNS, types={"ContextTokens": pl.Int64, "GeneratedTokens": pl.Int64},
                             numbered=False), src.display, lines=line_of(src, header=True))
    first = check.frame["TIMESTAMP"][0].strip()
    if _OFFSET.search(first):
        fmt, example = AZURE_2024_FORMAT, "'2024-05-10 00:00:00.009930+00:00'"
    else:
        fmt, example = AZURE_2023_FORMAT, "'2023-11-16 18:15:46.6805900'"
    columns = {
        "arrival_us": check.datetimes("TIMESTAMP", fmt=fmt, what=f"a timestamp like {example}"),
        "prompt_tokens": check.counts("ContextTokens", minimum=1),
        "output_tokens": check.counts("GeneratedTokens", minimum=1),
        "workload": pl.repeat(name_label(src, "azure"), check.frame.height, eager=True),
    }
    return conclude(check, columns, opts)


def mooncake(src: Source, opts: Options) -> Parsed:
    """Mooncake JSONL: `timestamp` ms, `input_length`, `output_length`, `hash_ids` (512-token blocks)."""
    schema = {
        "timestamp": pl.Int64,
        "input_length": pl.Int64,
        "output_length": pl.Int64,
        "hash_ids": HASH_LIST,
    }
    check = Checker(read_jsonl(src, schema, required=("timestamp", "input_length", "output_length"), numbered=False),
                    src.display, lines=line_of(src, header=False))
    columns = {
        "arrival_us": check.times("timestamp", us_per_unit=1_000, what="milliseconds since the trace start"),
        "prompt_tokens": check.counts("input_length", minimum=1),
        "output_tokens": check.counts("output_length", minimum=1),
        "workload": pl.repeat("mooncake", check.frame.height, eager=True),
        "prefix_hashes": check.hash_lists("hash_ids"),
    }
    block = opts.prefix_block_tokens or MOONCAKE_BLOCK_TOKENS
    return conclude(check, columns, opts, block_tokens=block)


def burstgpt(src: Source, opts: Options) -> Parsed:
    """BurstGPT CSV. `Model` becomes the workload (ChatGPT / GPT-4: the natural pool split),
    `Log Type` the tenant (Conversation log / API log), `Session ID` (v2) the session. Rows with
    0 response tokens are failed requests: dropped and counted as `zero_output_tokens`.
    """
    optional = ("Model", "Log Type", "Session ID")
    locate = line_of(src, header=True)
    check = Checker(read_csv(src, BURSTGPT_COLUMNS, optional, numbered=False,
                             types={"Timestamp": pl.Float64, "Request tokens": pl.Int64, "Response tokens": pl.Int64}),
                    src.display, lines=locate)
    output = check.counts("Response tokens")
    check.counts("Request tokens")
    check.times("Timestamp", us_per_unit=1_000_000, what="seconds")
    check.done()
    keep = output != 0
    failed = check.frame.height - int(keep.sum())
    if failed == check.frame.height:
        raise TraceError(
            f"{src.display}: every request has 0 response tokens (all failed); nothing to replay"
        )
    kept = keep.arg_true() if failed else None  # the rows left, by their index in the file's
    check = Checker(check.frame.filter(keep) if failed else check.frame, src.display,
                    lines=locate if kept is None else lambda index: locate(int(kept[index])))
    columns = {
        "arrival_us": check.times("Timestamp", us_per_unit=1_000_000, what="seconds"),
        "prompt_tokens": check.counts("Request tokens", minimum=1),
        "output_tokens": check.counts("Response tokens", minimum=1),
        "workload": _column_or(check, "Model", "burstgpt"),
        "tenant": _column_or(check, "Log Type", "default"),
    }
    if "Session ID" in check.frame.columns:
        columns["session_id"] = check.labels("Session ID", None)
    return conclude(check, columns, opts, dropped={"zero_output_tokens": failed} if failed else {})


def _column_or(check: Checker, col: str, default: str) -> pl.Series:
    if col in check.frame.columns:
        return check.labels(col, default)
    return pl.repeat(default, check.frame.height, eager=True)


def splitwise(src: Source, opts: Options) -> Parsed:
    """Splitwise traces as vidur ships them (`arrived_at` s, `num_prefill_tokens`, `num_decode_tokens`)."""
    return _vidur_columns(src, opts, name_label(src, "splitwise"))


def vidur(src: Source, opts: Options) -> Parsed:
    """Vidur trace-replay CSV: the same three columns; extra columns are allowed and ignored."""
    return _vidur_columns(src, opts, "vidur")


def _vidur_columns(src: Source, opts: Options, label: str) -> Parsed:
    check = Checker(read_csv(src, VIDUR_COLUMNS, types=dict(zip(VIDUR_COLUMNS, (pl.Float64, pl.Int64, pl.Int64))),
                             numbered=False), src.display, lines=line_of(src, header=True))
    columns = {
        "arrival_us": check.times("arrived_at", us_per_unit=1_000_000, what="seconds"),
        "prompt_tokens": check.counts("num_prefill_tokens", minimum=1),
        "output_tokens": check.counts("num_decode_tokens", minimum=1),
        "workload": pl.repeat(label, check.frame.height, eager=True),
    }
    return conclude(check, columns, opts)
