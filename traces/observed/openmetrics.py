"""OpenMetrics text exposition with timestamps (the format `promtool tsdb create-blocks-from
openmetrics` backfills).

One sample a line, `name{label="value",...} value timestamp`, timestamps in Unix seconds (the
OpenMetrics spec; Prometheus' older text format writes milliseconds, which is refused with a
hint); `# TYPE`, `# HELP` and `# UNIT` describe a family, `# EOF` ends the file. Histograms
arrive as their `_bucket`/`_count`/`_sum` samples and counters as `_total`, which is how the
tool looks them up. A sample without a timestamp cannot be placed in time and is an error.
"""

from __future__ import annotations

import re

import numpy as np

from common.errors import UserError
from traces.observed.limits import ObservedLimits
from traces.observed.samples import Counter, RawSeries, check_labels, number, series_text

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*([,}])')
_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+(\S+)")  # a sample: name, labels, value
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_UNESCAPE = re.compile(r"\\[\\\"n]")
_DESCRIPTORS = ("# TYPE ", "# HELP ", "# UNIT ")
# Past this a "seconds" timestamp is 5138 AD: it is milliseconds.
_MS_FROM = 1e11


def looks_like(text: str) -> bool:
    """The first meaningful line is a descriptor, `# EOF`, or a sample line."""
    for line in text.splitlines()[:50]:
        line = line.strip()
        if not line:
            continue
        if line.startswith(_DESCRIPTORS) or line == "# EOF":
            return True
        if line.startswith("#"):
            continue
        match = _LINE.match(line)
        # labels in braces say OpenMetrics; a bare name needs a numeric value ("hello world" is prose)
        return bool(match) and (match.group(1) is not None or number(match.group(2)) is not None)
    return False


def parse(text: str, display: str, limits: ObservedLimits, counter: Counter) -> list[RawSeries]:
    found: dict[tuple, tuple[list[float], list[float]]] = {}
    ended = False
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > limits.max_line_bytes:
            raise UserError(f"{display}: line {n}: longer than {limits.max_line_bytes:,} characters")
        stripped = line.strip()
        if not stripped:
            continue
        if ended:
            raise UserError(f"{display}: line {n}: text after '# EOF' (expected it to end the file)")
        if stripped == "# EOF":
            ended = True
            continue
        if stripped.startswith("#"):
            continue  # TYPE/HELP/UNIT: the sample names say what the tool needs
        name, labels, value, ts = _sample(stripped, display, n)
        key = (name, tuple(sorted(labels.items())))
        if key not in found:
            check_labels(labels, name, display, limits)
            found[key] = ([], [])
            counter.add(display, 1, 0)
        found[key][0].append(ts)
        found[key][1].append(value)
        counter.add(display, 0, 1)
    return [RawSeries(name, dict(labels), np.array(t, dtype=np.float64), np.array(v, dtype=np.float64), display)
            for (name, labels), (t, v) in found.items()]


def _sample(line: str, display: str, n: int) -> tuple[str, dict[str, str], float, float]:
    match = _NAME.match(line)
    if not match:
        raise UserError(f"{display}: line {n}: {line[:60]!r} is not an OpenMetrics sample "
                        f"(expected name{{label=\"value\"}} value timestamp)")
    name, pos, labels = match.group(), match.end(), {}
    if line[pos:pos + 1] == "{":
        pos += 1
        if line[pos:pos + 1] == "}":
            pos += 1
        while line[pos - 1] != "}":
            lab = _LABEL.match(line, pos)
            if not lab:
                raise UserError(f"{display}: line {n}: series {name}: labels not of the form "
                                f"{{name=\"value\",...}} at column {pos + 1}")
            labels[lab.group(1)] = _UNESCAPE.sub(lambda m: _ESCAPES[m.group()], lab.group(2))
            pos = lab.end()
            if lab.group(3) == "," and line[pos:].lstrip().startswith("}"):
                pos = line.index("}", pos) + 1
    rest = line[pos:].split("#", 1)[0].split()  # an exemplar follows " # "
    if not rest:
        raise UserError(f"{display}: line {n}: series {series_text(name, labels)} has no value")
    value = number(rest[0])
    if value is None:
        raise UserError(f"{display}: line {n}: series {series_text(name, labels)}: value {rest[0][:40]!r} "
                        f"is not a number")
    if len(rest) < 2:
        raise UserError(f"{display}: line {n}: series {series_text(name, labels)} has no timestamp "
                        f"(expected one in Unix seconds after the value: observed samples must say when)")
    ts = number(rest[1])
    if ts is None or not np.isfinite(ts):
        raise UserError(f"{display}: line {n}: series {series_text(name, labels)}: timestamp {rest[1][:40]!r} "
                        f"is not a number of Unix seconds")
    if abs(ts) >= _MS_FROM:
        raise UserError(f"{display}: line {n}: series {series_text(name, labels)}: timestamp {rest[1]} "
                        f"looks like milliseconds; OpenMetrics timestamps are seconds")
    return name, labels, value, ts
