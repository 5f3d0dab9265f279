"""genai-perf's `profile_export.json` (written by perf_analyzer; genai-perf docs/files.md: "the
timestamps for each event in the lifecycle of each request"): `experiments[].requests[]` with
`timestamp` (ns), `response_timestamps` (ns, one per streamed response) and `response_outputs`.

It holds no token counts: genai-perf tokenizes the text itself. The counts are read from the
OpenAI `usage` object (`prompt_tokens`, `completion_tokens`) where a response carries one (a
non-streamed answer, or a stream asked for usage); a request without it is dropped and counted as
`missing_usage`, since no count can be had here without the model's tokenizer.
"""

from __future__ import annotations

import json

import polars as pl

from common.errors import TraceError
from traces.adapters import Options, Parsed, conclude
from traces.fields import show
from traces.records import Rows, as_object, json_text, ns_to_us
from traces.source import Source


def genai_perf(src: Source, opts: Options) -> Parsed:
    try:
        document = json.loads(src.text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{src.display} line {exc.lineno}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise TraceError(f"{src.display}: JSON nested too deeply") from None
    experiments = document.get("experiments") if isinstance(document, dict) else None
    if not isinstance(experiments, list):
        raise TraceError(f"{src.display}: expected an object with an 'experiments' list "
                         "(genai-perf profile_export.json)")
    rows = Rows(src, ("timestamp", "first_ns", "last_ns", "prompt_tokens", "completion_tokens"))
    number = 0
    for e, experiment in enumerate(experiments):
        requests = experiment.get("requests") if isinstance(experiment, dict) else None
        if not isinstance(requests, list):
            raise TraceError(f"{src.display}: experiments[{e}].requests is not a list")
        for request in requests:
            number += 1
            request = as_object(src, "record", number, request)
            stamps = request.get("response_timestamps")
            stamps = stamps if isinstance(stamps, list) else []
            usage = _usage(request.get("response_outputs"))
            if request.get("timestamp") is None:
                rows.drop("missing_timestamp")
                continue
            if not stamps:
                rows.drop("no_response")  # a failed request: nothing came back
                continue
            if usage is None:
                rows.drop("missing_usage")
                continue
            first = ns_to_us(stamps[0]) if len(stamps) > 1 else None
            rows.add(number, {"timestamp": ns_to_us(request["timestamp"]), "first_ns": first,
                              "last_ns": ns_to_us(stamps[-1]), **usage})
    check = rows.frame("record")
    start = check.times("timestamp", us_per_unit=1, what="nanoseconds")
    # one response (not streamed) shows no first-token time: TTFT null, as for LiteLLM
    raw = check.frame["first_ns"]
    first = raw.cast(pl.Float64, strict=False).round(0).cast(pl.Int64)
    check.note(first.is_null() & raw.is_not_null(),
               lambda i: f"response_timestamps[0]={show(raw[i])} is not a number (expected nanoseconds)")
    last = check.times("last_ns", us_per_unit=1, what="nanoseconds")
    columns = {
        "arrival_us": start,
        "prompt_tokens": check.counts("prompt_tokens", minimum=1),
        "output_tokens": check.counts("completion_tokens", minimum=1),
        "workload": pl.repeat("genai-perf", check.frame.height, eager=True),
        "observed_ttft_us": (first - start).cast(pl.Int64),
        "observed_e2e_us": (last - start).cast(pl.Int64),
    }
    bad = (first < start).fill_null(False)
    check.note(bad, lambda i: "response_timestamps[0] is before the request's timestamp (expected later)")
    return conclude(check, columns, opts, dropped=rows.dropped)


def _usage(outputs) -> dict | None:
    """The last OpenAI `usage` object among the responses (SSE `data:` lines or plain JSON)."""
    found = None
    for output in outputs if isinstance(outputs, list) else []:
        text = output.get("response") if isinstance(output, dict) else None
        if not isinstance(text, str):
            continue
        for piece in text.splitlines() or [text]:
            piece = piece.strip().removeprefix("data:").strip()
            if not piece.startswith("{"):
                continue
            try:
                value = json.loads(piece)
            except (ValueError, RecursionError):
                continue
            usage = value.get("usage") if isinstance(value, dict) else None
            if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
                found = {"prompt_tokens": json_text(usage.get("prompt_tokens")),
                         "completion_tokens": json_text(usage.get("completion_tokens"))}
    return found
