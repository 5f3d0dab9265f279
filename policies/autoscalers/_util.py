"""Small helpers the autoscalers share: parameter checks, seconds to integer µs, time windows.

Times in params are seconds (`_s`); inside a policy they are integer microseconds (`_us`).
"""

from __future__ import annotations

import math
from typing import Any

US_PER_S = 1_000_000


def us(seconds: float) -> int:
    """Seconds from a config to integer microseconds (rounded to the nearest µs)."""
    return int(round(seconds * US_PER_S))


def require(ok: bool, field: str, value: Any, expected: str) -> None:
    """Raise the `ValueError("field: got X, expected Y")` the config loader turns into a ConfigError."""
    if not ok:
        raise ValueError(f"{field}: got {value!r}, expected {expected}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_number(field: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> None:
    """A finite number within [lo, hi] (or (lo, hi] with `lo_open`)."""
    low = "" if lo is None else (f"> {lo}" if lo_open else f">= {lo}")
    high = "" if hi is None else f"<= {hi}"
    expected = "a number" + (f" {low}" if low else "") + (" and" if low and high else "") + (f" {high}" if high else "")
    ok = _is_number(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    require(ok, field, value, expected)


def check_int(field: str, value: Any, *, lo: int = 0) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= lo,
            field, value, f"an integer >= {lo}")


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    require(value in choices, field, value, "one of " + ", ".join(repr(c) for c in choices))


def since(window: tuple[tuple, ...], cutoff_us: int) -> tuple[tuple, ...]:
    """The samples `(t_us, ...)` strictly after `cutoff_us` (samples are appended in time order)."""
    for i, sample in enumerate(window):
        if sample[0] > cutoff_us:
            return window[i:] if i else window
    return ()


def from_zero(ctx: Any) -> bool:
    """The pool has no replica active or starting, and requests are held at it waiting for one.

    Policies whose signal needs a replica to report it (a per-replica ratio, KV use) still leave
    zero then, as the components that scale such pools from zero do: KEDA activates a Deployment
    0 -> 1 on its trigger and leaves 1 -> N to the HPA (keda.sh docs, concepts/scaling-deployments),
    and llm-d WVA's ScaleFromZero engine scales a variant at 0 replicas to 1 when the inference
    gateway's flow-control queue holds requests for it (docs/user-guide/scale-from-zero.md)."""
    return ctx.desired == 0 and ctx.metrics.held > 0


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
