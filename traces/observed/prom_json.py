"""Prometheus HTTP API range-query JSON: what `GET /api/v1/query_range` returns.

`{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": ...,
labels}, "values": [[unix_seconds, "value"], ...]}]}}` (Prometheus docs, "HTTP API": range
queries; values are strings so that NaN and +Inf survive JSON). Also read: a list of such
responses, an object whose values are responses (one per query, keyed by the query), and JSON
Lines of responses (what a shell loop of `curl` calls appends), so several queries' results can
travel in one file.
"""

from __future__ import annotations

import contextlib
import gc
import json
from typing import Any

import numpy as np

from common.errors import UserError
from traces.observed.limits import ObservedLimits
from traces.observed.samples import Counter, RawSeries, check_labels, number, numbers, series_text


def is_response(doc: Any) -> bool:
    return isinstance(doc, dict) and "status" in doc and ("data" in doc or "error" in doc)


@contextlib.contextmanager
def _collector_held():
    """The cyclic garbage collector held off while a file is parsed: an export is a list per
    sample, and the collector, run again and again as they pile up, walks all of them each time
    (more than half of json.loads' time on a day's export). Parsed JSON holds no reference cycle;
    the document is freed by reference counting when the parse is done with it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def responses(text: str, display: str) -> list[tuple[str, dict]]:
    """(where, response) for each response in the file; `where` says which one, for messages."""
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError as exc:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise UserError(f"{display}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
        docs = []
        for n, line in enumerate(lines, 1):
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as inner:
                raise UserError(f"{display}: line {n}: not valid JSON ({inner.msg}); expected one "
                                f"query_range response per line") from None
        return [(f"line {n}", doc) for n, doc in enumerate(docs, 1)]
    doc = docs[0]
    if is_response(doc):
        return [("", doc)]
    if isinstance(doc, list) and doc and all(is_response(d) for d in doc):
        return [(f"response [{i}]", d) for i, d in enumerate(doc)]
    if isinstance(doc, dict) and doc and all(is_response(d) for d in doc.values()):
        return [(f"query {str(k)[:80]!r}", d) for k, d in doc.items()]
    raise UserError(f"{display}: JSON, but not a Prometheus query_range response (expected "
                    f'{{"status": "success", "data": {{"resultType": "matrix", "result": [...]}}}}, '
                    f"a list of them, or an object of them by query)")


def parse(text: str, display: str, limits: ObservedLimits, counter: Counter) -> list[RawSeries]:
    with _collector_held():
        return _parse(text, display, limits, counter)


def _parse(text: str, display: str, limits: ObservedLimits, counter: Counter) -> list[RawSeries]:
    out: list[RawSeries] = []
    for where, doc in responses(text, display):
        at = f"{display}: {where}" if where else display
        if doc.get("status") != "success":
            raise UserError(f"{at}: the query failed ({doc.get('errorType', 'error')}: "
                            f"{str(doc.get('error', ''))[:120]}); expected status \"success\"")
        data = doc.get("data")
        kind = data.get("resultType") if isinstance(data, dict) else None
        if kind != "matrix":
            raise UserError(f"{at}: resultType {kind!r}, expected \"matrix\" (a range query: "
                            f"/api/v1/query_range, not /api/v1/query)")
        result = data.get("result")
        if not isinstance(result, list):
            raise UserError(f"{at}: data.result is not a list of series")
        for i, item in enumerate(result):
            out.append(_series(item, f"{at}: result[{i}]", display, limits))
            counter.add(display, 1, len(out[-1].t))
    return out


def _series(item: Any, at: str, display: str, limits: ObservedLimits) -> RawSeries:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), dict) or not isinstance(item.get("values"), list):
        raise UserError(f"{at}: expected {{\"metric\": {{labels}}, \"values\": [[t, \"v\"], ...]}}")
    labels = {str(k): str(v) for k, v in item["metric"].items()}
    name = labels.pop("__name__", None)
    if not name:
        raise UserError(f"{at}: series {series_text('', labels)} has no __name__: expected a raw metric's "
                        f"series (query the metric itself, e.g. vllm:num_requests_waiting, not rate(...) or sum(...))")
    check_labels(labels, name, display, limits)
    values = item["values"]
    fast = _well_formed(values)
    if fast is not None:
        return RawSeries(name, labels, *fast, display)
    t = np.empty(len(values))
    v = np.empty(len(values))
    for j, pair in enumerate(values):
        if not isinstance(pair, list) or len(pair) != 2 or isinstance(pair[0], bool) \
                or not isinstance(pair[0], (int, float)):
            raise UserError(f"{at}: series {series_text(name, labels)}: values[{j}] is {str(pair)[:60]}, "
                            f"expected [unix_seconds, \"value\"]")
        x = number(pair[1]) if isinstance(pair[1], str) else None
        if x is None:
            raise UserError(f"{at}: series {series_text(name, labels)}: values[{j}] has value {str(pair[1])[:40]!r}, "
                            f"expected a number in a string (\"12\", \"0.5\", \"NaN\")")
        t[j], v[j] = pair[0], x
    return RawSeries(name, labels, t, v, display)


def _well_formed(values: list) -> tuple[np.ndarray, np.ndarray] | None:
    """(t, value) of `values` when every pair is well formed (a list of a JSON number and a
    number in a string), found by a few passes over the whole list instead of a check per pair;
    None otherwise, and _series's pair-by-pair loop then says which pair is not."""
    if set(map(type, values)) != {list} or set(map(len, values)) != {2}:
        return None if values else (np.empty(0), np.empty(0))
    t, v = zip(*values)
    if not set(map(type, t)) <= {int, float} or set(map(type, v)) != {str}:  # a bool is neither
        return None
    value = numbers(v)
    if value is None:
        return None
    try:
        return np.array(t, dtype=np.float64), value
    except OverflowError:  # an integer no float holds: the loop meets it as it did
        return None
