"""align()'s compiled passes (traces/observed/kernels.py) against the literal definition: on
generated fleets of gauges, counters with resets and histogram buckets, each output is what
the slow twins of Prometheus' lookback, extrapolatedRate and bucketQuantile
(test_observed_promql.py) give, summed or averaged over a pool's series as `sum by`/`avg by`
do, the histogram's rates summed per bucket before the quantile."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from hypothesis import given, strategies as st

from tests.unit.test_observed_promql import _bucket_quantile_twin, _increase_twin, _instant_twin
from traces.observed import Grid, ObservedConfig, align
from traces.observed.layout import Scrapes
from traces.observed.mapping import Mapped
from traces.observed.metrics import KNOWN, QUANTILES

_GAUGES = ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "DCGM_FI_DEV_GPU_UTIL")
_COUNTERS = ("vllm:generation_tokens_total", "vllm:num_preemptions_total")
_LES = (0.1, 1.0, math.inf)


@st.composite
def _times(draw, dense=False):
    """Sample times in seconds from integer gaps in ms; `dense`: scrapes many to a rate window,
    whose edges kernels.py gallops to over several samples at a time."""
    gaps = draw(st.lists(st.integers(100, 900), min_size=100, max_size=400) if dense
                else st.lists(st.integers(1, 20_000), min_size=0, max_size=25))
    return draw(st.integers(0, 60_000)) / 1000.0 + np.cumsum(gaps) / 1000.0


@st.composite
def _counter(draw, n):
    v, level = [], draw(st.integers(0, 100))
    for _ in range(n):
        inc = draw(st.integers(0, 30))
        level = inc if draw(st.integers(0, 9)) == 0 else level + inc  # a restart now and then
        v.append(float(level))
    return np.array(v)


@st.composite
def _fleet(draw):
    """Targets (pool, replica), each scraped at its own instants; every series of a target is
    sampled at them, or (now and then) at instants of its own."""
    rows, samples = [], []

    def add(name, pool, replica, t, v, le=None):
        m = KNOWN[name]
        rows.append((len(rows), name, m.signal, m.kind, m.combine, m.scale, pool, replica, le, "gen"))
        samples.append((t, v))

    for pool in draw(st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True)):
        for replica in draw(st.lists(st.sampled_from(["0", "1", "2"]), min_size=1, max_size=3, unique=True)):
            shared = draw(_times())
            for name in draw(st.lists(st.sampled_from(_GAUGES), max_size=3, unique=True)):
                t = shared if draw(st.booleans()) else draw(_times())
                values = draw(st.lists(st.one_of(st.integers(0, 50).map(float), st.just(math.nan)),
                                       min_size=len(t), max_size=len(t)))
                add(name, pool, replica, t, np.array(values, dtype=float))
            for name in draw(st.lists(st.sampled_from(_COUNTERS), max_size=2, unique=True)):
                t = shared if draw(st.booleans()) else draw(_times())
                add(name, pool, replica, t, draw(_counter(len(t))))
            if draw(st.booleans()):
                t = shared if draw(st.booleans()) else draw(_times(dense=True))
                counts = np.sort(np.array([draw(_counter(len(t))) for _ in _LES]), axis=0)
                for le, row in zip(_LES, counts):
                    add("vllm:time_to_first_token_seconds", pool, replica, t, row, le)
    series = pl.DataFrame(rows, orient="row", schema={
        "series": pl.UInt32, "metric": pl.String, "signal": pl.String, "kind": pl.String, "combine": pl.String,
        "scale": pl.Float64, "pool": pl.String, "replica": pl.String, "le": pl.Float64, "file": pl.String})
    frame = pl.DataFrame({"series": np.concatenate([np.full(len(t), i, np.uint32) for i, (t, _) in enumerate(samples)]
                                                   or [np.zeros(0, np.uint32)]),
                          "t": np.concatenate([t for t, _ in samples] or [np.zeros(0)]),
                          "value": np.concatenate([v for _, v in samples] or [np.zeros(0)])})
    return Mapped(series, Scrapes.from_frame(frame, len(rows)), {}, 0, (), ())


def _literal(mapped, grid, config):
    """Every output of align(), by the twins, one series and one tick at a time."""
    ticks = grid.times()
    per = max(1, round(config.rate_window_s / grid.tick_s))
    count = -(-grid.n // per)
    ends = ticks[-1] - per * grid.tick_s * np.arange(count)[::-1]
    out, groups = {}, {}
    for row in mapped.series.iter_rows(named=True):
        groups.setdefault((row["signal"], row["pool"]), []).append(row)
    for (signal, pool), rows in groups.items():
        frame = mapped.samples.frame()
        data = [(frame.filter(pl.col("series") == r["series"]), r) for r in rows]
        if rows[0]["kind"] == "gauge":
            got = np.array([[_instant_twin(s["t"].to_list(), s["value"].to_list(), tick, config.lookback_s) * r["scale"]
                             for tick in ticks] for s, r in data])
            present = (~np.isnan(got)).sum(axis=0)
            total = np.nansum(got, axis=0)
            out[(signal, pool)] = np.where(present > 0, total if rows[0]["combine"] == "sum" else total / np.maximum(present, 1), np.nan)
        elif rows[0]["kind"] == "counter":
            got = np.array([[_increase_twin(s["t"].to_list(), s["value"].to_list(), tick, config.rate_window_s)
                             * r["scale"] / config.rate_window_s for tick in ticks] for s, r in data])
            out[(signal, pool)] = np.where((~np.isnan(got)).sum(axis=0) > 0, np.nansum(got, axis=0), np.nan)
        else:
            bounds = sorted({r["le"] for r in rows})
            rates = np.zeros((count, len(bounds)))
            for s, r in data:
                rates[:, bounds.index(r["le"])] += np.nan_to_num(
                    [_increase_twin(s["t"].to_list(), s["value"].to_list(), end, config.rate_window_s) / config.rate_window_s
                     for end in ends])
            window_of = count - 1 - (grid.n - 1 - np.arange(grid.n)) // per
            for name, q in QUANTILES:
                out[(f"{signal}_{name}", pool)] = np.array([_bucket_quantile_twin(q, bounds, c) for c in rates])[window_of]
    return out


@given(mapped=_fleet(), step=st.sampled_from([0.5, 1.0, 7.0, 15.0]), lookback=st.sampled_from([1.0, 30.0, 300.0]),
       rate_window=st.sampled_from([5.0, 15.0, 60.0]))
def test_align_is_the_literal_promql_of_every_series(mapped, step, lookback, rate_window):
    config = ObservedConfig(lookback_s=lookback, rate_window_s=rate_window)
    grid = Grid(5.0, step, int(400 / step))
    got = align(mapped, grid, config).values
    want = _literal(mapped, grid, config)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=str(key))
