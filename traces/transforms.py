"""Transforms on canonical trace frames: time window, rate scaling, sampling, filters, merging.

Each returns a frame still in TRACE_SCHEMA with `request_id` renumbered 0..n-1. Times are int64
microseconds; config fields are in seconds (`*_s`) and token counts.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl

from traces.errors import TraceError
from traces.schema import TRACE_SCHEMA


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """Keep arrivals in [start_s, end_s) of trace time; the kept part starts at 0 (start_s -> 0)."""

    start_s: float = 0.0
    end_s: float | None = None

    def __post_init__(self):
        if not math.isfinite(self.start_s) or self.start_s < 0:
            raise ValueError(f"start_s={self.start_s!r} (expected a number of seconds >= 0)")
        if self.end_s is not None and (not math.isfinite(self.end_s) or self.end_s <= self.start_s):
            raise ValueError(f"end_s={self.end_s!r} (expected a number of seconds > start_s={self.start_s})")


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Keep a random `fraction` of the requests or exactly `n` of them, chosen with `seed`."""

    fraction: float | None = None
    n: int | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.fraction is None) == (self.n is None):
            raise ValueError("give exactly one of fraction and n")
        if self.fraction is not None and not (0 < self.fraction <= 1):
            raise ValueError(f"fraction={self.fraction!r} (expected a number in (0, 1])")
        if self.n is not None and self.n < 1:
            raise ValueError(f"n={self.n!r} (expected an integer >= 1)")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed!r} (expected an integer >= 0)")


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """Keep requests whose token counts lie in the given inclusive bounds and whose workload and
    tenant are in the given lists (None = no constraint)."""

    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    min_output_tokens: int | None = None
    max_output_tokens: int | None = None
    workloads: tuple[str, ...] | None = None
    tenants: tuple[str, ...] | None = None

    def __post_init__(self):
        for kind in ("prompt", "output"):
            low = getattr(self, f"min_{kind}_tokens")
            high = getattr(self, f"max_{kind}_tokens")
            for name, value in ((f"min_{kind}_tokens", low), (f"max_{kind}_tokens", high)):
                if value is not None and value < 0:
                    raise ValueError(f"{name}={value!r} (expected a token count >= 0)")
            if low is not None and high is not None and low > high:
                raise ValueError(f"min_{kind}_tokens={low} > max_{kind}_tokens={high} (expected min <= max)")
        for name in ("workloads", "tenants"):
            value = getattr(self, name)
            if value is not None and len(value) == 0:
                raise ValueError(f"{name} is an empty list (expected at least one label, or leave it out)")


def _renumber(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"))


def window(frame: pl.DataFrame, start_s: float = 0.0, end_s: float | None = None) -> pl.DataFrame:
    """Arrivals in [start_s, end_s), re-zeroed so that `start_s` becomes time 0."""
    cfg = WindowConfig(start_s, end_s)
    start_us = round(cfg.start_s * 1e6)
    keep = pl.col("arrival_us") >= start_us
    if cfg.end_s is not None:
        keep = keep & (pl.col("arrival_us") < round(cfg.end_s * 1e6))
    out = frame.filter(keep).with_columns(pl.col("arrival_us") - start_us)
    return _renumber(out)


def scale_rate(frame: pl.DataFrame, rate_scale: float) -> pl.DataFrame:
    """Divide every arrival time by `rate_scale`: 2.0 doubles the request rate, 0.5 halves it."""
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ValueError(f"rate_scale={rate_scale!r} (expected a number > 0)")
    scaled = (pl.col("arrival_us").cast(pl.Float64) / rate_scale).round(0).cast(pl.Int64)
    return frame.with_columns(scaled.alias("arrival_us"))


def sample(frame: pl.DataFrame, fraction: float | None = None, n: int | None = None,
           seed: int = 0) -> pl.DataFrame:
    """A deterministic random subset (same seed, same rows), kept in arrival order.
    `fraction` keeps round(fraction * rows) rows (at least 1)."""
    cfg = SampleConfig(fraction, n, seed)
    rows = frame.height
    count = cfg.n if cfg.n is not None else max(1, round(cfg.fraction * rows))
    if count > rows:
        raise TraceError(f"sample.n={count} is more than the {rows} requests available")
    chosen = np.sort(np.random.default_rng(cfg.seed).permutation(rows)[:count])
    return _renumber(frame[chosen])


def filter_rows(frame: pl.DataFrame, cfg: FilterConfig) -> pl.DataFrame:
    """Rows meeting every bound and label list of `cfg`."""
    keep = pl.lit(True)
    for kind in ("prompt", "output"):
        col = pl.col(f"{kind}_tokens")
        low, high = getattr(cfg, f"min_{kind}_tokens"), getattr(cfg, f"max_{kind}_tokens")
        if low is not None:
            keep = keep & (col >= low)
        if high is not None:
            keep = keep & (col <= high)
    if cfg.workloads is not None:
        keep = keep & pl.col("workload").is_in(list(cfg.workloads))
    if cfg.tenants is not None:
        keep = keep & pl.col("tenant").is_in(list(cfg.tenants))
    return _renumber(frame.filter(keep))


def merge(frames: list[pl.DataFrame], offsets_us: list[int] | None = None) -> pl.DataFrame:
    """One stream from several traces (each shifted by its offset), sorted by arrival; ties keep
    the order of `frames`. Label the sources first (their `workload` column) to tell them apart."""
    offsets_us = offsets_us or [0] * len(frames)
    shifted = [
        f.select(list(TRACE_SCHEMA)).with_columns(pl.col("arrival_us") + off)
        for f, off in zip(frames, offsets_us, strict=True)
    ]
    merged = pl.concat(shifted, how="vertical").sort("arrival_us", maintain_order=True)
    return _renumber(merged)


def label(frame: pl.DataFrame, workload: str) -> pl.DataFrame:
    """Every row's workload set to `workload`."""
    return frame.with_columns(pl.lit(workload, dtype=pl.String).alias("workload"))
