"""Arrival times: a rate held constant over segments, and inside each segment the gaps of a
renewal process (Poisson, Gamma, Weibull, constant).

ServeGen (alibaba/ServeGen, `clientpool`/`generate` in the README's data description) draws a
window's gaps from the fitted Gamma or Weibull and rescales them so that the window holds
rate x 600 requests; this module does the same for every non-Poisson segment: n = rate x length
rounded stochastically, n + 1 gaps drawn, scaled to fill the segment. Poisson segments draw n
from a Poisson law and place the arrivals uniformly (the process itself, exactly). Either way
the expected count is rate x length, and the CV within a segment is the process's.
"""

from __future__ import annotations

import math

import numpy as np

from common.errors import ConfigError
from traces.synth.spec import Arrival

POISSON, GAMMA, WEIBULL, CONSTANT = 0, 1, 2, 3
KINDS = {"poisson": POISSON, "gamma": GAMMA, "weibull": WEIBULL, "constant": CONSTANT}
MAX_SEGMENTS = 10_000_000


def weibull_shape(cv: float) -> float:
    """The Weibull shape k whose CV is `cv`: CV^2 = G(1+2/k) / G(1+1/k)^2 - 1, decreasing in k."""
    def cv_of(k: float) -> float:
        return math.sqrt(max(math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)) - 1, 0.0))
    lo, hi = 0.05, 500.0
    if not cv_of(hi) <= cv <= cv_of(lo):
        raise ConfigError(f"cv: got {cv:g}, a Weibull's CV lies in [{cv_of(hi):.3g}, {cv_of(lo):.3g}]")
    for _ in range(100):  # bisection on log k
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if cv_of(mid) > cv else (lo, mid)
    return math.sqrt(lo * hi)


def process_shape(arrival: Arrival) -> float:
    if arrival.shape is not None:
        return arrival.shape
    if arrival.process == "gamma":
        return 1.0 / arrival.cv**2
    if arrival.process == "weibull":
        return weibull_shape(arrival.cv)
    return 1.0


def segments(arrival: Arrival, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start_s, length_s, rate) of the segments covering [0, duration_s): the window grid split
    at every burst edge; the rate at a segment's midpoint."""
    count = math.ceil(duration_s / arrival.window_s)
    if count + 2 * len(arrival.bursts) > MAX_SEGMENTS:
        raise ConfigError(f"arrival.window_s: {arrival.window_s:g} s makes {count:,} windows over "
                          f"{duration_s:g} s, expected at most {MAX_SEGMENTS:,}")
    edges = [np.arange(count, dtype=np.float64) * arrival.window_s, [duration_s]]
    for b in arrival.bursts:
        edges.append([b.at_s, b.at_s + b.duration_s])
    cuts = np.unique(np.clip(np.concatenate(edges), 0, duration_s))
    start, length = cuts[:-1], np.diff(cuts)
    mid = start + length / 2
    if arrival.rate is not None:
        rate = np.full(len(start), arrival.rate)
    else:
        t, r = np.array(arrival.curve, dtype=np.float64).T
        rate = np.interp(mid, t, r)
    if arrival.diurnal is not None:
        d = arrival.diurnal
        rate = rate * (1 + d.amplitude * np.cos(2 * np.pi * (mid - d.peak_s) / d.period_s))
    for b in arrival.bursts:
        rate = np.where((mid >= b.at_s) & (mid < b.at_s + b.duration_s), rate * b.factor, rate)
    return start, length, rate


def counts(rng: np.random.Generator, kind: np.ndarray, length: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Requests per segment: Poisson for Poisson segments, rate x length rounded at random otherwise."""
    mean = rate * length
    poisson = rng.poisson(np.where(kind == POISSON, mean, 0.0))
    rounded = np.floor(mean + rng.random(len(mean))).astype(np.int64)
    return np.where(kind == POISSON, poisson, rounded)


def times(rng: np.random.Generator, start: np.ndarray, length: np.ndarray, n: np.ndarray,
          kind: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Sorted arrival times (s) of segments holding n requests each (per-segment kind and shape)."""
    if len(n) == 0:
        return np.zeros(0)
    seg = np.repeat(np.arange(len(n)), n + 1)  # n + 1 gaps per segment: the last one is after the last arrival
    k, a = kind[seg], shape[seg]
    gaps = np.ones(len(seg))
    for code, draw in ((POISSON, lambda m, s: rng.exponential(1.0, m)),
                       (GAMMA, lambda m, s: rng.gamma(s, 1.0, m)),
                       (WEIBULL, lambda m, s: rng.weibull(s, m))):
        rows = np.flatnonzero(k == code)
        if len(rows):
            gaps[rows] = draw(len(rows), a[rows])
    # Poisson segments: n uniform arrivals are the normalised cumsum of n + 1 exponential gaps.
    gaps = np.maximum(gaps, 1e-300)
    total = np.cumsum(gaps)
    first = np.concatenate(([0], np.cumsum(n + 1)[:-1]))
    before = np.where(first > 0, total[np.maximum(first - 1, 0)], 0.0)
    local = total - before[seg]
    scale = local[first + n]  # the segment's whole sum
    keep = np.ones(len(seg), bool)
    keep[first + n] = False
    out = start[seg] + local / scale[seg] * length[seg]
    return out[keep]


def arrivals(rng: np.random.Generator, arrival: Arrival, duration_s: float, limit: int, where: str) -> np.ndarray:
    """Sorted arrival times in [0, duration_s) of a spec'd process; more than `limit` expected
    is refused before anything is drawn."""
    start, length, rate = segments(arrival, duration_s)
    expected = float(np.sum(rate * length))
    if expected > limit:
        raise ConfigError(f"{where}.arrival: about {expected:,.0f} arrivals over {duration_s:g} s, more than "
                          f"max_requests={limit:,} (raise max_requests, or lower the rate)")
    kind = np.full(len(start), KINDS[arrival.process], np.int8)
    shape = np.full(len(start), process_shape(arrival))
    n = counts(rng, kind, length, rate)
    return times(rng, start, length, n, kind, shape)
