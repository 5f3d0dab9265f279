"""The tick frame's trailing windows (replay/fleet/metrics.py `_window_stats`) read in bounded
memory: SLO attainment from per-edge counts, TTFT percentiles a span of ticks at a time. Every
tick value must be the float that one sort of all the rows gave (the implementation before
issue 15's bounded memory, kept here as the reference), however small the spans."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal

import replay.fleet.metrics as metrics
from replay.fleet.metrics import _window_percentiles, _window_stats


def _whole(t_us: np.ndarray, requests: pl.LazyFrame, window_us: int) -> dict[str, np.ndarray]:
    """Every first token and every ended request read and sorted at once (metrics.py before)."""
    firsts = requests.select("first_token_us", "ttft_us").filter(
        pl.col("first_token_us").is_not_null()).collect().sort("first_token_us")
    ttft_ms = firsts["ttft_us"].to_numpy().astype(np.float64)
    ttft_ms /= 1000.0
    pcts = _window_percentiles(firsts["first_token_us"].to_numpy(), ttft_ms, t_us.astype(np.int64),
                               np.int64(window_us), np.array([0.5, 0.99]))
    done = requests.filter(pl.col("status") != "unfinished").select(
        pl.coalesce("finished_us", "arrival_us").alias("ended_us"), "slo_met").collect().sort("ended_us")
    fin = done["ended_us"].to_numpy()
    met = np.concatenate(([0], np.cumsum(done["slo_met"].to_numpy())))
    lo = np.searchsorted(fin, t_us - window_us, side="right")
    hi = np.searchsorted(fin, t_us, side="right")
    count = hi - lo
    attained = np.full(len(t_us), np.nan)
    np.divide(met[hi] - met[lo], count, out=attained, where=count > 0)
    return {"ttft_p50_ms": pcts[:, 0], "ttft_p99_ms": pcts[:, 1], "slo_attainment": attained}


def _rows(seed: int, n: int, tick_us: int, ticks: int) -> pl.DataFrame:
    """Requests whose first tokens and ends fall anywhere, on tick boundaries often (a window's
    ends: (t - window, t] must keep the one and drop the other), with quiet stretches (empty
    windows), long queues (a first token long after arrival), rejections and unfinished ones."""
    rng = np.random.default_rng(seed)
    span = tick_us * ticks
    arrival = rng.integers(0, span, n)
    quiet = (arrival > span // 3) & (arrival < span // 2)
    arrival[quiet] //= 4  # a quiet stretch in the middle, a burst before it
    arrival.sort()
    on_edge = rng.random(n) < 0.3
    arrival[on_edge] -= arrival[on_edge] % tick_us
    ttft = rng.choice([0, tick_us, 3 * tick_us, 40 * tick_us], n) + rng.integers(0, 2, n) * rng.integers(0, 5000, n)
    status = rng.choice(["finished", "rejected", "unfinished"], n, p=[0.8, 0.1, 0.1])
    first = np.where(status == "rejected", -1, arrival + ttft)
    finished = first + rng.choice([0, tick_us, 9 * tick_us + 1], n)
    return pl.DataFrame({
        "arrival_us": arrival,
        "first_token_us": pl.Series(first).replace(-1, None),
        "ttft_us": pl.Series(np.where(first >= 0, ttft, -1)).replace(-1, None),
        "finished_us": pl.Series(np.where(status == "finished", finished, -1)).replace(-1, None),
        "status": status,
        "slo_met": (status == "finished") & (rng.random(n) < 0.7),
    })


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)  # NaN where NaN, float for float


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("span_rows", [1, 7, 300, 1 << 30])
@pytest.mark.parametrize("short_last", [True, False])
def test_spans_of_any_size_give_every_tick_the_whole_sorts_value(seed, span_rows, short_last):
    tick_us, ticks, window_ticks = 1000, 120, [1, 5, 30, 200][seed]
    rows = _rows(seed, 2000, tick_us, ticks).lazy()
    # uniform ticks long past the last request (empty windows), and a last one short of a whole
    # tick (the drain's end: the edges off a grid of few points, searched) or not (on it)
    t_us = np.arange(1, 4 * ticks + 1) * tick_us
    if short_last:
        t_us = np.append(t_us, 4 * ticks * tick_us + 377)
    got = _window_stats(t_us, rows, window_ticks * tick_us, span_rows)
    _assert_same(got, _whole(t_us, rows, window_ticks * tick_us))
    assert np.isnan(got["ttft_p50_ms"]).any() and not np.isnan(got["ttft_p50_ms"]).all()


def test_rows_spilled_as_parts_read_a_span_at_a_time_match(tmp_path):
    """Rows in their Parquet file (replay/outputs/rows.py), as a day's are: the spans' filtered reads
    (row groups skipped by their statistics) hold the same first tokens."""
    from replay.outputs.rows import RequestRows

    frame = _rows(9, 5000, 1000, 300)
    spilled = RequestRows(spill_dir=None, memory_rows=700)
    for at in range(0, frame.height, 250):
        spilled.append(frame.slice(at, 250))
    spilled.settle()
    assert spilled.spilled
    t_us = np.arange(1, 301) * 1000
    _assert_same(_window_stats(t_us, spilled.lazy(), 10_000, 50), _whole(t_us, frame.lazy(), 10_000))


def test_a_run_with_tiny_spans_has_the_same_tick_frame(monkeypatch):
    """A whole replay (an autoscaled pool from zero: queues, quiet ticks) with spans of a few
    first tokens: the tick frame of one span, value for value."""
    from replay.config import build_config
    from replay.run import replay_trace
    from tests.unit.test_window_run import SCALED
    from traces import load_trace

    cfg = build_config(yaml.safe_load(SCALED), "test", Path("."))
    trace = load_trace("azure-conv-2023")
    trace = dataclasses.replace(trace, frame=trace.frame.head(1500))
    whole = replay_trace(trace, cfg)
    monkeypatch.setattr(metrics, "SPAN_ROWS", 5)
    spans = replay_trace(trace, cfg)
    assert whole.ticks.height > 20 and whole.ticks["ttft_p99_ms"].null_count() < whole.ticks.height
    assert_frame_equal(spans.ticks, whole.ticks)
    assert spans.summary == whole.summary
