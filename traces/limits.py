"""Bounds on what one trace may cost to read: decompressed bytes, lines, and the time it spans.

They protect the machine from a small input that expands (a gzip of newlines, a stray epoch
timestamp among small ones) and are flags, not config keys: they refuse or allow a trace, they
never change what is replayed, so a run's config.yaml stays the same whatever they are.
"""

from __future__ import annotations

import dataclasses
import math

GIB = 1 << 30
DAY_S = 86_400.0
# A trace's text is one polars string, whose length is a u32: 4 GiB is a hard ceiling.
BYTES_CEILING = 4 * GIB - 1
DEFAULT_MAX_BYTES = 2 * GIB
# Loading costs about 180 bytes of memory per line (measured on a 5M-line CSV: 0.9 GB peak), so
# 30M lines stay near 5 GB; the largest public traces (Azure 2024 week-long, BurstGPT) fit.
DEFAULT_MAX_ROWS = 30_000_000
DEFAULT_MAX_SPAN_S = 31 * DAY_S
# One line becomes one polars string, and a long one costs several times its length while it is
# split and parsed (a 500 MB line took 5 GB). A trace row is well under 1 KiB; the longest bundled
# line (a Mooncake row with its hash list) is 2.7 KiB, so 1 MiB leaves ample room.
DEFAULT_MAX_LINE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class TraceLimits:
    """`max_bytes`: a file's size once decompressed; `max_rows`: its lines (rows, for Parquet);
    `max_span_s`: last arrival minus first, in seconds, after every transform; `max_line_bytes`:
    the longest line of a text file, its line ending excluded."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_rows: int = DEFAULT_MAX_ROWS
    max_span_s: float = DEFAULT_MAX_SPAN_S
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    def __post_init__(self):
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) \
                or not 1 <= self.max_bytes <= BYTES_CEILING:
            raise ValueError(f"--max-trace-bytes: got {self.max_bytes!r}, expected bytes in 1..{BYTES_CEILING:,} "
                             "(4 GiB less one byte: a trace's text is one string, whose length is a u32)")
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) or not 1 <= self.max_rows <= 2**31:
            raise ValueError(f"--max-rows: got {self.max_rows!r}, expected an integer in 1..{2**31:,}")
        if not (math.isfinite(self.max_span_s) and 0 < self.max_span_s <= 1e9):
            raise ValueError(f"--max-span-s: got {self.max_span_s!r}, expected seconds in (0, 1e9] (1e9 s = 31 years)")
        if isinstance(self.max_line_bytes, bool) or not isinstance(self.max_line_bytes, int) \
                or not 1 <= self.max_line_bytes <= BYTES_CEILING:
            raise ValueError(f"--max-line-bytes: got {self.max_line_bytes!r}, expected bytes in 1..{BYTES_CEILING:,}")


DEFAULT_LIMITS = TraceLimits()


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def human_span(seconds: float) -> str:
    """A duration as a person would say it: '54 years', '3.2 days', '12 min', '4.5 s'."""
    for size, unit in ((365.25 * DAY_S, "years"), (DAY_S, "days"), (3600.0, "h"), (60.0, "min")):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{seconds:.3g} s"
