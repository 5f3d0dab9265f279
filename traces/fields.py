"""Vectorised parsing of trace columns (token counts, times, labels, hash lists) into typed series.

A `Checker` remembers the first bad row of every column instead of raising at once, so the error
names the earliest offending line of the file. Times come out as absolute int64 microseconds.
A row's line is its frame's `__line`, or (a reader that kept no line numbers, traces/tables.py)
found by `lines` only when a message names it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import polars as pl

from common.errors import TraceError

INT32_MAX = 2**31 - 1
_US_LIMIT = 2**62
TOKENS = "a non-negative integer token count"
_INT = re.compile(r"\s*[+-]?\d+\s*")


class Checker:
    """Parses columns of `frame`, collecting the earliest problem. A row's line number is the
    frame's `__line` where it has one, else `lines(index)`."""

    def __init__(self, frame: pl.DataFrame, display: str, unit: str = "line",
                 lines: Callable[[int], int] | None = None):
        self.frame = frame
        self.display = display
        self.unit = unit
        self._lines = frame["__line"] if "__line" in frame.columns else None
        self._locate = lines
        self._first: tuple[int, str] | None = None

    def line(self, index: int) -> str:
        """'line 7' (or 'row 7' for Parquet) for the row at `index` of the frame."""
        number = self._lines[index] if self._lines is not None else self._locate(index)
        return f"{self.unit} {number}"

    def release(self) -> None:
        """Drop the frame's columns but its line numbers: what naming a row needs from here on."""
        self.frame = self.frame.select("__line") if self._lines is not None else self.frame.clear()

    def where(self, index: int) -> str:
        return f"{self.display} {self.line(index)}"

    def note(self, bad: pl.Series, describe) -> None:
        """Record the first True of `bad`; `describe(index)` builds the message (called lazily)."""
        if not bad.any():
            return
        index = int(bad.arg_true()[0])
        if self._first is None or index < self._first[0]:
            self._first = (index, describe(index))

    def done(self) -> None:
        """Raise the earliest recorded problem, if any."""
        if self._first is not None:
            index, message = self._first
            raise TraceError(f"{self.where(index)}: {message}")

    def _value(self, col: str, index: int) -> str:
        return f"{col}={show(self.frame[col][index])}"

    # -- token counts and other integers ---------------------------------------------------
    def counts(self, col: str, *, minimum: int = 0, what: str = TOKENS) -> pl.Series:
        """Whole numbers >= `minimum` (up to int32) as Int64; nulls where invalid."""
        values = whole_numbers(self.frame[col])
        bad = values.is_null() | (values < minimum) | (values > INT32_MAX)

        def describe(i: int) -> str:
            raw = self.frame[col][i]
            problem = count_problem(raw, minimum)
            expected = "at least 1 token" if problem == "is zero" else what
            return f"{self._value(col, i)} {problem} (expected {expected})"

        self.note(bad.fill_null(True), describe)
        return values

    def integers(self, col: str, *, what: str) -> pl.Series:
        """Whole numbers in the int32 range (negative allowed) as Int64."""
        values = whole_numbers(self.frame[col])
        bad = values.is_null() | (values.abs() > INT32_MAX)
        self.note(
            bad.fill_null(True),
            lambda i: f"{self._value(col, i)} {count_problem(self.frame[col][i], -INT32_MAX)} "
            f"(expected {what})",
        )
        return values

    # -- times -----------------------------------------------------------------------------
    def times(self, col: str, *, us_per_unit: int, what: str) -> pl.Series:
        """Numbers in some unit (s, ms, us) as Int64 microseconds; any finite value is allowed."""
        raw = self.frame[col]
        if raw.dtype.is_integer():
            # UInt64 values past int64 become null, and are reported, rather than fail the cast.
            bad = raw.is_null() | (raw.cast(pl.Float64).abs() * us_per_unit >= _US_LIMIT)
            us = pl.select(pl.when(~bad).then(raw).cast(pl.Int64) * us_per_unit).to_series()
        else:
            number = _floats(raw)
            scaled = number * us_per_unit
            bad = scaled.is_null() | scaled.is_nan() | (scaled.abs() >= _US_LIMIT)
            us = pl.select(pl.when(~bad).then(scaled).round(0).cast(pl.Int64)).to_series()

        def describe(i: int) -> str:
            return f"{self._value(col, i)} {number_problem(raw[i])} (expected {what})"

        self.note(bad.fill_null(True), describe)
        return us.rename(col)

    def datetimes(self, col: str, *, fmt: str | None, what: str) -> pl.Series:
        """Timestamps (strings in `fmt`, or inferred when None; or a datetime column) as epoch us."""
        raw = self.frame[col]
        if isinstance(raw.dtype, pl.Datetime):
            stamps = raw
        elif raw.dtype == pl.Date:
            stamps = raw.cast(pl.Datetime("us"))
        elif raw.dtype == pl.String:
            try:
                stamps = raw.str.strip_chars().str.to_datetime(fmt, time_unit="us", strict=False)
            except pl.exceptions.PolarsError:  # format inference failed on the first value
                stamps = pl.Series(col, [None] * len(raw), dtype=pl.Datetime("us"))
        else:
            stamps = pl.Series(col, [None] * len(raw), dtype=pl.Datetime("us"))
        if getattr(stamps.dtype, "time_zone", None):
            stamps = stamps.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
        us = stamps.dt.epoch("us")
        self.note(
            us.is_null(), lambda i: f"{self._value(col, i)} is not a valid timestamp (expected {what})"
        )
        return us.rename(col)

    # -- labels and hashes -----------------------------------------------------------------
    def labels(self, col: str, default: str | None) -> pl.Series:
        """Text labels; empty or missing values become `default`."""
        values = self.frame[col].cast(pl.String).str.strip_chars()
        values = pl.select(pl.when(values != "").then(values)).to_series()
        return values.fill_null(default) if default is not None else values

    def hash_lists(self, col: str) -> pl.Series:
        """Prefix-block hash ids as List(UInt64): a list column, or text like '1 2 3' / '[1, 2, 3]'."""
        raw = self.frame[col]
        dtype = raw.dtype
        if dtype == pl.String:
            text = raw.str.strip_chars().str.strip_chars("[]").str.replace_all(r"[\s,;]+", " ")
            text = text.str.strip_chars()
            parts = pl.select(pl.when(text != "").then(text.str.split(" "))).to_series()
            hashes = parts.cast(pl.List(pl.UInt64), strict=False)
            bad = hashes.list.eval(pl.element().is_null()).list.any().fill_null(False)
            bad = bad | (hashes.is_null() & parts.is_not_null())
        elif isinstance(dtype, pl.List) and (dtype.inner.is_integer() or dtype.inner == pl.Null):
            wide = raw.cast(pl.List(pl.Int128), strict=False) if dtype.inner != pl.UInt64 else raw
            bad = wide.list.eval(pl.element().is_null() | (pl.element() < 0)).list.any()
            bad = bad.fill_null(False)
            hashes = pl.select(pl.when(~bad).then(raw)).to_series().cast(pl.List(pl.UInt64))
        else:
            bad = raw.is_not_null()
            hashes = pl.Series(col, [None] * len(raw), dtype=pl.List(pl.UInt64))
        self.note(
            bad,
            lambda i: f"{self._value(col, i)} is not a list of non-negative integers "
            "(expected prefix-block hash ids)",
        )
        return hashes.rename(col)


def whole_numbers(raw: pl.Series) -> pl.Series:
    """Int64 values of `raw` where they are whole, finite numbers (ints, '12', '12.0', 12.0); else null."""
    if raw.dtype.is_integer():
        return raw.cast(pl.Int64, strict=False)
    if raw.dtype.is_float():
        ok = raw.is_finite() & (raw == raw.floor()) & (raw.abs() < 2**53)
        return pl.select(pl.when(ok).then(raw)).to_series().cast(pl.Int64)
    if raw.dtype == pl.String:
        text = raw.str.strip_chars()
        ints = text.cast(pl.Int64, strict=False)
        return ints.fill_null(whole_numbers(text.cast(pl.Float64, strict=False)))
    return pl.Series(raw.name, [None] * len(raw), dtype=pl.Int64)


def _floats(raw: pl.Series) -> pl.Series:
    if raw.dtype.is_numeric():
        return raw.cast(pl.Float64)
    if raw.dtype == pl.String:
        return raw.str.strip_chars().cast(pl.Float64, strict=False)
    return pl.Series(raw.name, [None] * len(raw), dtype=pl.Float64)


def show(value: Any) -> str:
    """A value as error messages quote it: text in quotes ('12.5'), numbers bare, null as null."""
    if value is None:
        return "null"
    if isinstance(value, pl.Series):
        value = value.to_list()
    text = value if isinstance(value, str) else str(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return repr(text) if isinstance(value, str) else text


def _blank_problem(value: Any) -> str | None:
    """What is wrong with a value before it is even read as a number, or None."""
    if value is None:
        return "is missing"
    if isinstance(value, bool):
        return "is not a number"
    if str(value).strip() == "":
        return "is empty"
    return None


def number_problem(value: Any) -> str:
    problem = _blank_problem(value)
    if problem:
        return problem
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return "is not a number"
    if not math.isfinite(number):
        return "is not a finite number"
    return "is out of range"


def count_problem(value: Any, minimum: int) -> str:
    """Why `value` is not a whole number >= minimum and <= int32 max (the slow, readable twin)."""
    problem = _blank_problem(value)
    if problem:
        return problem
    text = str(value).strip()
    if _INT.fullmatch(text):
        if len(text.lstrip("+-").lstrip("0")) > 19:  # int() refuses past 4300 digits; any such is too large
            return "is negative" if text.startswith("-") and minimum >= 0 else f"is too large (more than {INT32_MAX:,})"
        number = int(text)
    else:
        try:
            real = float(text)
        except ValueError:
            return "is not a number"
        if not math.isfinite(real):
            return "is not a finite number"
        if real != math.floor(real):
            return "is not a whole number"
        number = int(real)
    if number < 0 and minimum >= 0:
        return "is negative"
    if number < minimum:
        return "is zero" if number == 0 else f"is below {minimum}"
    if abs(number) > INT32_MAX:
        return f"is too large (more than {INT32_MAX:,})"
    return "is not a valid integer"
