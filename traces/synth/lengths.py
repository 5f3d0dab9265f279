"""Samplers of token counts (and think times) for the synth spec's `Dist` sections.

A sampler is `sample(rng, n, t_s) -> float64[n]`; `t_s` (the arrival times, seconds) matters only
to ServeGen's PMFs, which ServeGen measured per 6-hour window of the day. Token counts are then
rounded and clipped by `tokens()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from traces.synth.servegen import read_dataset
from traces.synth.spec import MAX_TOKENS, Dist

Sampler = Callable[[np.random.Generator, int, np.ndarray], np.ndarray]


def _resolve(path: str, base_dir: Path | None) -> str:
    from traces.bundled import BUNDLED

    p = Path(path).expanduser()
    if path in BUNDLED or p.is_absolute() or base_dir is None:
        return path
    return str(base_dir / p)


def _pmf(values: np.ndarray, weights: np.ndarray) -> Sampler:
    cdf = np.cumsum(weights / weights.sum())

    def sample(rng, n, t_s):
        return values[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(values) - 1)]
    return sample


def windowed(table: dict[int, tuple[np.ndarray, np.ndarray]], where: str) -> Sampler:
    """ServeGen's per-window PMFs: each arrival draws from the window it falls in (the day's
    windows repeat: the data covers one day). Windows without data borrow the nearest earlier one."""
    starts = np.array(sorted(table), dtype=np.float64)
    samplers = [_pmf(*table[int(s)]) for s in starts]
    day = 86_400.0

    def sample(rng, n, t_s):
        out = np.empty(n)
        which = np.maximum(np.searchsorted(starts, np.mod(t_s, day), side="right") - 1, 0)
        for i in np.unique(which):
            rows = np.flatnonzero(which == i)
            out[rows] = samplers[i](rng, len(rows), t_s[rows])
        return out
    if not samplers:
        raise ConfigError(f"{where}: no window has data for this field")
    return sample


def sampler(d: Dist, where: str, base_dir: Path | None) -> Sampler:
    """The sampler of `d`; `where` names the spec key in errors."""
    if d.dist == "constant":
        return lambda rng, n, t_s: np.full(n, float(d.value))
    if d.dist == "uniform":
        return lambda rng, n, t_s: rng.uniform(d.low, d.high, n)  # token counts round into [low, high]
    if d.dist == "lognormal":
        if d.median is not None:
            mu, sigma = math.log(max(d.median, 1e-300)), d.sigma
        else:  # mean and cv of the lognormal itself
            sigma = math.sqrt(math.log1p(d.cv**2))
            mu = math.log(max(d.mean, 1e-300)) - sigma**2 / 2
        return lambda rng, n, t_s: rng.lognormal(mu, sigma, n)
    if d.dist == "pmf":
        try:
            values = np.array([float(k) for k in d.values], dtype=np.float64)
        except ValueError:
            raise ConfigError(f"{where}.values: keys must be numbers, got {list(d.values)[:3]}") from None
        return _pmf(values, np.array(list(d.values.values()), dtype=np.float64))
    if d.dist == "empirical":
        from traces.loader import load_trace

        trace = load_trace(_resolve(d.trace, base_dir))
        values = trace.frame[d.column].to_numpy().astype(np.float64)
        return lambda rng, n, t_s: values[rng.integers(0, len(values), n)]
    table = read_dataset(_resolve(d.path, base_dir), d.field, where)
    return windowed(table, f"{d.path}: {d.field}")


def clipped(d: Dist, where: str, base_dir: Path | None, low: float, high: float) -> Sampler:
    """`sampler(d)` clipped to [d.min or low, d.max or high]."""
    inner = sampler(d, where, base_dir)
    lo = low if d.min is None else max(low, d.min)
    hi = high if d.max is None else min(high, d.max)
    return lambda rng, n, t_s: np.clip(inner(rng, n, t_s), lo, hi)


def token_sampler(d: Dist, where: str, base_dir: Path | None) -> Callable[..., np.ndarray]:
    """Whole token counts >= 1 (int32: a day of ServeGen's mix is 24 M rows)."""
    inner = clipped(d, where, base_dir, 1, MAX_TOKENS)
    return lambda rng, n, t_s: np.rint(inner(rng, n, t_s)).astype(np.int32)
