"""Times on the dashboard: simulated microseconds since the run's first arrival, written as
M:SS (H:MM:SS past an hour), and parsed back from what a user types after --at."""

from __future__ import annotations

import math
import re

from common.errors import UserError

_TIME = re.compile(r"^(?:(?:(\d+):)?(\d+):)?(\d+(?:\.\d+)?)s?$")


def parse_time(text: str, flag: str = "--at") -> int:
    """'14:05' -> 845 s, '1:02:03' -> 3723 s, '90' or '90s' -> 90 s; returned in microseconds."""
    m = _TIME.match(text.strip())
    if not m:
        raise UserError(f"{flag} {text!r}: expected a time from the run's start as MM:SS, H:MM:SS or seconds "
                        "(e.g. 14:05)")
    hours, minutes, seconds = m.group(1), m.group(2), m.group(3)
    if (minutes is not None or hours is not None) and float(seconds) >= 60:
        raise UserError(f"{flag} {text!r}: seconds must be below 60 in MM:SS (e.g. 14:05)")
    if hours is not None and int(minutes) >= 60:
        raise UserError(f"{flag} {text!r}: minutes must be below 60 in H:MM:SS (e.g. 1:02:03)")
    total = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds)
    return round(total * 1e6)


def fmt_time(t_us: float) -> str:
    s = int(t_us // 1_000_000)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_duration_ms(ms: float | None) -> str:
    """A latency for a narrow column: 850 ms, 12.3 s, 3.8 min."""
    if ms is None or math.isnan(ms):
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"
