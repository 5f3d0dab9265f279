"""The four request-log adapters (see traces/records.py for what they share)."""

from __future__ import annotations

import polars as pl

from common.errors import TraceError
from traces.adapters import Options, Parsed, conclude
from traces.fields import Checker, show, whole_numbers
from traces.records import (
    BLIS_COLUMNS, BLIS_OPTIONAL, LITELLM_COLUMNS, Rows, as_object, check_order, delta, json_records,
    label_or, missing_reason, ns_to_us,
)  # fmt: skip
from traces.source import Source
from traces.tables import read_csv

_LITELLM_OPTIONAL = ("completionStartTime", "model", "user", "team_id", "request_id", "status")
_ISO = "an ISO 8601 timestamp like '2024-05-01T10:00:00.123Z'"


def _drop(table: pl.DataFrame, dropped: dict[str, int], reason: str, mask: pl.Series) -> pl.DataFrame:
    count = int(mask.fill_null(False).sum())
    if count:
        dropped[reason] = dropped.get(reason, 0) + count
        table = table.filter(~mask.fill_null(False))
    return table


def _blank(table: pl.DataFrame, col: str) -> pl.Series:
    if col not in table.columns:
        return pl.repeat(True, table.height, eager=True)
    return table[col].is_null() | (table[col].str.strip_chars() == "")


def _nothing_left(src: Source, dropped: dict[str, int]):
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
    return TraceError(f"{src.display}: no replayable request (dropped: {reasons})")


def _stamps(check: Checker, col: str, optional: bool) -> pl.Series:
    """Epoch microseconds of ISO timestamps in `col`; blanks are null when `optional`."""
    raw = check.frame[col] if col in check.frame.columns else pl.repeat(None, check.frame.height,
                                                                          dtype=pl.String, eager=True)
    text = raw.str.strip_chars()
    text = pl.select(pl.when(text != "").then(text)).to_series()
    try:
        stamps = text.str.to_datetime(None, time_unit="us", strict=False)
    except pl.exceptions.PolarsError:
        stamps = pl.repeat(None, len(text), dtype=pl.Datetime("us"), eager=True)
    if getattr(stamps.dtype, "time_zone", None):
        stamps = stamps.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    us = stamps.dt.epoch("us")
    bad = us.is_null() & (text.is_not_null() | (not optional))
    check.note(bad, lambda i: f"{col}={show(raw[i])} is not a valid timestamp (expected {_ISO})")
    return us


def litellm(src: Source, opts: Options) -> Parsed:
    """LiteLLM proxy spend logs (`LiteLLM_SpendLogs` exported as CSV, JSON array or JSON lines).
    Arrival = startTime; TTFT = completionStartTime - startTime; E2E = endTime - startTime. A
    completionStartTime equal to endTime gives no TTFT (null): a call answered in one piece (not
    streamed) shows no first-token time, and its E2E would pass for one. `model` is the
    workload, `team_id` (else `user`) the tenant. Failed calls (`status` "failure") and calls with
    no or zero token counts (embeddings, errors) are dropped and counted."""
    if src.first_line().lstrip().startswith(("{", "[")):
        records, unit = json_records(src)
        rows = Rows(src, LITELLM_COLUMNS + _LITELLM_OPTIONAL)
        for line, value in records:
            rows.add(line, as_object(src, unit, line, value))
        table = rows.frame(unit).frame
    else:
        table, unit = read_csv(src, LITELLM_COLUMNS, _LITELLM_OPTIONAL), "line"
    dropped: dict[str, int] = {}
    if "status" in table.columns:
        table = _drop(table, dropped, "failed", table["status"].str.strip_chars().str.to_lowercase() == "failure")
    for col in ("startTime", "prompt_tokens", "completion_tokens"):
        table = _drop(table, dropped, f"missing_{col}", _blank(table, col))
    table = _drop(table, dropped, "zero_output_tokens", whole_numbers(table["completion_tokens"]) == 0)
    table = _drop(table, dropped, "zero_prompt_tokens", whole_numbers(table["prompt_tokens"]) == 0)
    if table.height == 0:
        raise _nothing_left(src, dropped)
    check = Checker(table, src.display, unit)
    start = _stamps(check, "startTime", optional=False)
    end = _stamps(check, "endTime", optional=True)
    first = _stamps(check, "completionStartTime", optional=True)
    first = pl.select(pl.when(end.is_null() | (first != end)).then(first)).to_series()
    check_order(check, start, end, "endTime")
    check_order(check, start, first, "completionStartTime")
    team = label_or(check, "team_id", None) if "team_id" in table.columns else None
    user = label_or(check, "user", "default")
    columns = {
        "arrival_us": start,
        "prompt_tokens": check.counts("prompt_tokens", minimum=1),
        "output_tokens": check.counts("completion_tokens", minimum=1),
        "workload": label_or(check, "model", "litellm"),
        "tenant": user if team is None else team.fill_null(user),
        "observed_ttft_us": delta(first, start),
        "observed_e2e_us": delta(end, start),
    }
    return conclude(check, columns, opts, dropped=dropped)


_NS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "sec": 1e6}


def aiperf(src: Source, opts: Options) -> Parsed:
    """aiperf `profile_export.jsonl`: one `MetricRecordInfo` per line (aiperf docs,
    working-with-profile-exports.md): `metadata.request_start_ns`, and `metrics` entries
    `{value, unit}` for `input_sequence_length`, `output_sequence_length`, `time_to_first_token`
    and `request_latency`. Records with an `error` are dropped as `failed`, warm-up records
    (`benchmark_phase` "warmup") as `warmup`."""
    records, unit = json_records(src)
    names = ("start_ns", "isl", "osl", "ttft_us", "e2e_us")
    rows = Rows(src, names)
    for line, value in records:
        record = as_object(src, unit, line, value)
        if record.get("error"):
            rows.drop("failed")
            continue
        meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        if meta.get("benchmark_phase") == "warmup":  # aiperf's warm-up requests are not the workload
            rows.drop("warmup")
            continue
        metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
        flat = {"start_ns": ns_to_us(meta.get("request_start_ns")),
                "isl": _metric(src, unit, line, metrics, "input_sequence_length", None),
                "osl": _metric(src, unit, line, metrics, "output_sequence_length", None),
                "ttft_us": _metric(src, unit, line, metrics, "time_to_first_token", "ms"),
                "e2e_us": _metric(src, unit, line, metrics, "request_latency", "ms")}
        reason = missing_reason(flat, ("start_ns", "isl", "osl"))
        if reason:
            rows.drop(reason.replace("start_ns", "request_start_ns").replace("isl", "input_sequence_length")
                      .replace("osl", "output_sequence_length"))
            continue
        rows.add(line, flat)
    check = rows.frame(unit)
    columns = {
        "arrival_us": check.times("start_ns", us_per_unit=1, what="epoch nanoseconds").rename("request_start_ns"),
        "prompt_tokens": check.counts("isl", minimum=1, what="input_sequence_length, a token count"),
        "output_tokens": check.counts("osl", minimum=1, what="output_sequence_length, a token count"),
        "workload": pl.repeat("aiperf", check.frame.height, eager=True),
        "observed_ttft_us": _optional_number(check, "ttft_us"),
        "observed_e2e_us": _optional_number(check, "e2e_us"),
    }
    return conclude(check, columns, opts, dropped=rows.dropped)


def _metric(src, unit, line, metrics: dict, name: str, time_unit: str | None):
    entry = metrics.get(name)
    if entry is None:
        return None
    value = entry.get("value") if isinstance(entry, dict) else entry
    if time_unit is None or value is None or isinstance(value, str):
        return value
    scale = _NS.get(str(entry.get("unit", time_unit)).lower() if isinstance(entry, dict) else time_unit)
    if scale is None:
        raise TraceError(f"{src.display} {unit} {line}: metrics.{name}.unit={show(entry.get('unit'))} "
                         f"(expected one of {', '.join(_NS)})")
    return value * scale if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _optional_number(check: Checker, col: str) -> pl.Series:
    """Microseconds as Int64, null where not recorded; a non-numeric value is an error."""
    raw = check.frame[col]
    number = raw.cast(pl.Float64, strict=False)
    bad = (number.is_null() & raw.is_not_null()) | (number < 0).fill_null(False) | number.is_nan().fill_null(False)
    check.note(bad, lambda i: f"{col.removesuffix('_us')}={show(raw[i])} is not a non-negative duration")
    return pl.select(pl.when(~bad).then(number.round(0)).cast(pl.Int64)).to_series()


def inference_perf(src: Source, opts: Options) -> Parsed:
    """kubernetes-sigs/inference-perf `per_request_lifecycle_metrics.json` (written by its report
    generator: a list of {start_time, end_time, request, response, info, error}, times in seconds,
    `info.input_tokens`, `info.output_tokens`, `info.output_token_times` per streamed token).
    TTFT = first output_token_times - start_time; E2E = end_time - start_time. Requests with an
    `error` are dropped as `failed`."""
    records, unit = json_records(src)
    rows = Rows(src, ("start_time", "end_time", "input_tokens", "output_tokens", "first_token"))
    for line, value in records:
        record = as_object(src, unit, line, value)
        if record.get("error"):
            rows.drop("failed")
            continue
        info = record.get("info") if isinstance(record.get("info"), dict) else {}
        times = info.get("output_token_times")
        flat = {"start_time": record.get("start_time"), "end_time": record.get("end_time"),
                "input_tokens": info.get("input_tokens"), "output_tokens": info.get("output_tokens"),
                "first_token": times[0] if isinstance(times, list) and times else None}
        reason = missing_reason(flat, ("start_time", "input_tokens", "output_tokens"))
        if reason:
            rows.drop(reason)
            continue
        rows.add(line, flat)
    check = rows.frame(unit)
    start = check.times("start_time", us_per_unit=1_000_000, what="seconds")
    end = _optional_seconds(check, "end_time")
    first = _optional_seconds(check, "first_token")
    check_order(check, start, end, "end_time")
    check_order(check, start, first, "first_token")
    columns = {
        "arrival_us": start,
        "prompt_tokens": check.counts("input_tokens", minimum=1),
        "output_tokens": check.counts("output_tokens", minimum=1),
        "workload": pl.repeat("inference-perf", check.frame.height, eager=True),
        "observed_ttft_us": delta(first, start),
        "observed_e2e_us": delta(end, start),
    }
    return conclude(check, columns, opts, dropped=rows.dropped)


def _optional_seconds(check: Checker, col: str) -> pl.Series:
    raw = check.frame[col]
    number = raw.cast(pl.Float64, strict=False)
    bad = (number.is_null() & raw.is_not_null()) | number.is_nan().fill_null(False)
    check.note(bad, lambda i: f"{col}={show(raw[i])} is not a number (expected seconds)")
    return pl.select(pl.when(~bad).then((number * 1e6).round(0)).cast(pl.Int64)).to_series()


def blis(src: Source, opts: Options) -> Parsed:
    """BLIS TraceV2 CSV (`blis observe` / `blis run` export). Prompt = input_tokens + prefix_length
    (BLIS stores the suffix only); `model` is the workload, `tenant_id` the tenant, `vllm_priority`
    the priority. TTFT = first_chunk_time_us - arrival_time_us and E2E = last_chunk_time_us -
    arrival_time_us where the chunk time is set (BLIS's TraceRecordsToRequests reads them so).
    Rows whose status is not "ok" are dropped and counted as `status_<value>`."""
    table = read_csv(src, BLIS_COLUMNS, BLIS_OPTIONAL)
    dropped: dict[str, int] = {}
    status = table["status"].str.strip_chars().str.to_lowercase()
    for value in sorted(set(status.to_list()) - {"ok"}):
        same = table["status"].str.strip_chars().str.to_lowercase() == value
        table = _drop(table, dropped, f"status_{value or 'blank'}", same)
    if table.height == 0:
        raise _nothing_left(src, dropped)
    check = Checker(table, src.display)
    arrival = check.times("arrival_time_us", us_per_unit=1, what="integer microseconds")
    first = check.times("first_chunk_time_us", us_per_unit=1, what="integer microseconds (0 = none)")
    last = check.times("last_chunk_time_us", us_per_unit=1, what="integer microseconds (0 = none)")
    first = pl.select(pl.when(first > 0).then(first)).to_series()
    last = pl.select(pl.when(last > 0).then(last)).to_series()
    check_order(check, arrival, first, "first_chunk_time_us")
    check_order(check, arrival, last, "last_chunk_time_us")
    prompt = check.counts("input_tokens", minimum=0)
    if "prefix_length" in table.columns:
        prompt = prompt + check.counts("prefix_length", minimum=0)
    columns = {
        "arrival_us": arrival,
        "prompt_tokens": prompt,
        "output_tokens": check.counts("output_tokens", minimum=1),
        "workload": label_or(check, "model", "blis"),
        "tenant": label_or(check, "tenant_id", "default"),
        "observed_ttft_us": delta(first, arrival),
        "observed_e2e_us": delta(last, arrival),
    }
    if "session_id" in table.columns:
        columns["session_id"] = check.labels("session_id", None)
    if "adapter" in table.columns:
        columns["adapter"] = check.labels("adapter", None)
    if "vllm_priority" in table.columns:
        columns["priority"] = check.integers("vllm_priority", what="an integer vLLM priority")
    return conclude(check, columns, opts, dropped=dropped)

