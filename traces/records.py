"""Request logs written by serving and benchmarking tools, read as traces: LiteLLM spend logs,
aiperf per-record exports, inference-perf per-request lifecycle JSON and BLIS TraceV2 CSV.

Each log records what was observed, so besides arrival and token counts these adapters keep
each request's observed TTFT and E2E (`observed_ttft_us`, `observed_e2e_us`, nullable) where the
log has them. Rows that cannot be replayed (a failed request, a missing token count) are dropped
and counted per reason in `LoadedTrace.dropped`; a value that is present but malformed is an
error naming the file, line and field.
"""

from __future__ import annotations

import json

import polars as pl

from common.errors import TraceError
from traces.fields import Checker, show
from traces.source import Source

# LiteLLM's `LiteLLM_SpendLogs` table (schema.prisma; litellm-js/spend-logs/src/_types.ts):
# request_id, startTime, endTime, completionStartTime (set on streamed responses), model, user,
# team_id, prompt_tokens, completion_tokens, and in newer versions `status` ("success"/"failure").
LITELLM_COLUMNS = ("startTime", "endTime", "prompt_tokens", "completion_tokens")
# BLIS (inference-sim) sim/workload/tracev2.go `traceV2Columns`: times are integer microseconds on
# one origin; first/last_chunk_time_us are 0 when no token came back; input_tokens excludes the
# shared prefix (prefix_length), status is "ok", "error", "timeout" or "incomplete".
BLIS_COLUMNS = ("request_id", "arrival_time_us", "input_tokens", "output_tokens",
                "first_chunk_time_us", "last_chunk_time_us", "status")
BLIS_OPTIONAL = ("tenant_id", "model", "session_id", "prefix_length", "vllm_priority", "adapter")


def json_records(src: Source) -> tuple[list[tuple[int, object]], str]:
    """(line, value) for each element of a JSON array file or each line of a JSON-lines file, and
    the unit ("line" or "record") errors name them by. Line numbers are where each element starts."""
    text = src.text
    start = len(text) - len(text.lstrip())
    decoder = json.JSONDecoder()
    out: list[tuple[int, object]] = []
    if text.startswith("[", start):
        pos = start + 1
        while True:
            pos = _skip(text, pos)
            if pos < len(text) and text[pos] == "]":
                break
            line = text.count("\n", 0, pos) + 1
            try:
                value, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{src.display} line {line}: invalid JSON ({exc.msg})") from None
            except RecursionError:
                raise TraceError(f"{src.display} line {line}: JSON nested too deeply") from None
            out.append((len(out) + 1, value))
            pos = _skip(text, pos)
            if pos < len(text) and text[pos] == ",":
                pos += 1
            elif pos >= len(text) or text[pos] != "]":
                line = text.count("\n", 0, pos) + 1
                raise TraceError(f"{src.display} line {line}: expected ',' or ']' in the JSON array")
        if not out:
            raise TraceError(f"{src.display}: an empty JSON array (expected at least one request)")
        return out, "record"
    for number, line_text in src.lines().iter_rows():
        try:
            out.append((number, json.loads(line_text)))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{src.display} line {number}: invalid JSON ({exc.msg} at column "
                             f"{exc.colno}): {show(line_text)}") from None
        except RecursionError:
            raise TraceError(f"{src.display} line {number}: JSON nested too deeply") from None
    return out, "line"


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def first_json_object(src: Source) -> dict | None:
    """The first object of a JSON array or JSON-lines file, or None (only its keys matter). Read
    from the file's beginning; the whole text only when the first object runs past it."""
    texts = (src.head_text,) if src.head_is_whole else (src.head_text, None)
    for text in texts:
        text = src.text if text is None else text
        pos = text.find("{")
        if pos >= 0 and text[:pos].strip() not in ("", "["):
            return None
        if pos >= 0:
            try:
                value, _ = json.JSONDecoder().raw_decode(text, pos)
            except (ValueError, RecursionError):
                continue
            return value if isinstance(value, dict) else None
    return None


class Rows:
    """Collects flat text columns from JSON records, dropping (and counting) rows not replayable."""

    def __init__(self, src: Source, names: tuple[str, ...]):
        self.src = src
        self.names = names
        self.lines: list[int] = []
        self.values: dict[str, list] = {name: [] for name in names}
        self.dropped: dict[str, int] = {}

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def add(self, line: int, row: dict) -> None:
        self.lines.append(line)
        for name in self.names:
            value = row.get(name)
            self.values[name].append(None if value is None else json_text(value))

    def frame(self, unit: str) -> Checker:
        if not self.lines:
            raise TraceError(f"{self.src.display}: no replayable request (dropped: {_reasons(self.dropped)})")
        columns = {n: pl.Series(n, v, dtype=pl.String) for n, v in self.values.items()}
        frame = pl.DataFrame({"__line": pl.Series(self.lines, dtype=pl.Int64), **columns})
        return Checker(frame, self.src.display, unit)


def json_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, (int, float)) else json.dumps(value)


def _reasons(dropped: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none"


def as_object(src: Source, unit: str, line: int, value) -> dict:
    if not isinstance(value, dict):
        raise TraceError(f"{src.display} {unit} {line}: expected a JSON object, found {show(json.dumps(value))}")
    return value


def missing_reason(row: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if row.get(key) in (None, ""):
            return f"missing_{key}"
    return None


def label_or(check: Checker, col: str, default: str) -> pl.Series:
    if col in check.frame.columns:
        return check.labels(col, default)
    return pl.repeat(default, check.frame.height, eager=True)


def delta(later: pl.Series, earlier: pl.Series) -> pl.Series:
    """later - earlier, null where either is null (not recorded)."""
    return (later - earlier).cast(pl.Int64)


def check_order(check: Checker, start: pl.Series, end: pl.Series, col: str) -> None:
    bad = (end < start).fill_null(False)
    check.note(bad, lambda i: f"{col}={show(check.frame[col][i])} is before the request started "
               "(expected a time at or after its start)")


def ns_to_us(ns):
    """Nanoseconds (a JSON number, or digits as text) to microseconds, exactly for integers: a
    float would round epoch nanoseconds. Anything else is returned as it is, for the checkers to
    name."""
    if isinstance(ns, str) and ns.strip().isdigit():
        ns = int(ns)
    if type(ns) is int:
        return ns // 1000
    return ns / 1000 if isinstance(ns, float) else ns
