"""The saturation classifier on constructed tick series: what a load test would call stable,
backlogged and overloaded, the evidence it reports, and windows (a load stage, a drain)."""

from __future__ import annotations

import numpy as np
import pytest

from replay.fleet.saturation import BACKLOGGED, OVERLOADED, STABLE, classify

TICK_US = 1_000_000


def series(arrivals, finished, start_queue: int = 0):
    """Ticks of 1 s from 1 s, the queue by conservation: what arrived and did not finish waits."""
    arrivals, finished = np.asarray(arrivals), np.asarray(finished)
    waiting = start_queue + np.cumsum(arrivals - finished)
    assert (waiting >= 0).all()
    t_us = np.arange(1, len(arrivals) + 1) * TICK_US
    return t_us, waiting, arrivals, finished


def test_a_pool_that_keeps_up_is_stable():
    got = classify(*series([10] * 60, [10] * 60))
    assert got.state == STABLE
    assert got.queue_peak == 0 and got.queue_end == 0
    assert got.arrival_rate_per_s == pytest.approx(10) and got.completion_rate_per_s == pytest.approx(10)


def test_arrivals_over_capacity_are_overloaded_and_the_evidence_is_the_queue_trend():
    got = classify(*series([20] * 60, [12] * 60))
    assert got.state == OVERLOADED
    assert got.queue_slope_per_s == pytest.approx(8)
    assert got.arrival_rate_per_s == pytest.approx(20) and got.completion_rate_per_s == pytest.approx(12)
    assert got.queue_end == got.queue_peak == 480
    # judged on the later half of the arrivals: the ramp from an empty system is left out
    assert (got.judged_from_us, got.judged_to_us) == (30 * TICK_US, 60 * TICK_US)


def test_a_burst_that_clears_is_backlogged():
    arrivals = [300] + [10] * 59
    finished = [0] + [20] * 30 + [10] * 29
    got = classify(*series(arrivals, finished))
    assert got.state == BACKLOGGED
    assert got.queue_peak == 300 and got.queue_end == 0


def test_a_queue_held_at_a_cap_is_backlogged_not_overloaded():
    # admission keeps the queue at 100: completions fall short of arrivals (the rest rejected),
    # but the queue does not grow
    t_us, _, arrivals, finished = series([20] * 60, [20] * 60)
    waiting = np.minimum(np.arange(1, 61) * 10, 100)
    finished = np.full(60, 10)
    assert classify(t_us, waiting, arrivals, finished).state == BACKLOGGED


def test_a_few_requests_waiting_are_noise_whatever_the_load():
    # a queue creeping from 0 to 6 over a minute at 1 req/s: a trend, but of a few requests
    arrivals = [1] * 60
    finished = [1 if i % 10 else 0 for i in range(60)]
    got = classify(*series(arrivals, finished))
    assert got.queue_slope_per_s > 0 and got.queue_end == 6
    assert got.state == STABLE


def test_a_growth_small_against_the_rate_is_not_overloaded():
    # 1% more arrivals than completions at 1,000 req/s: below GROWTH_MIN_SHARE, a backlog at most
    got = classify(*series([1000] * 60, [990] * 60))
    assert got.state != OVERLOADED
    assert classify(*series([1000] * 60, [950] * 60)).state == OVERLOADED


def test_the_drain_after_the_last_arrival_does_not_hide_an_overload():
    arrivals = [20] * 60 + [0] * 60
    finished = [12] * 60 + [8] * 60
    run = series(arrivals, finished)
    assert run[1][-1] == 0  # drained by the end
    got = classify(*run)
    assert got.state == OVERLOADED
    assert got.judged_to_us == 60 * TICK_US
    assert got.queue_end == 0 and got.queue_peak == 480
    # a window holding the load and part of the drain reads the same
    assert classify(*run, window_us=(0, 90 * TICK_US)).state == OVERLOADED


def test_windows_judge_each_load_stage():
    # stage 1 (0-60 s) over capacity, stage 2 (60-120 s) under it: its backlog clears
    arrivals = [20] * 60 + [5] * 60
    finished = [12] * 60 + [13] * 60
    run = series(arrivals, finished)
    assert classify(*run, window_us=(0, 60 * TICK_US)).state == OVERLOADED
    second = classify(*run, window_us=(60 * TICK_US, 120 * TICK_US))
    assert second.state == BACKLOGGED and second.queue_slope_per_s < 0
    assert classify(*run).state == BACKLOGGED  # the whole run: a backlog that cleared
    # a stage with no requests at all, after the queue emptied
    quiet = series(arrivals + [0] * 30, finished + [0] * 30)
    assert classify(*quiet, window_us=(120 * TICK_US, 150 * TICK_US)).state == STABLE


def test_a_window_without_ticks_and_unequal_series():
    run = series([10] * 5, [10] * 5)
    empty = classify(*run, window_us=(100 * TICK_US, 200 * TICK_US))
    assert empty.state == STABLE and empty.queue_peak == 0
    with pytest.raises(ValueError, match="unequal lengths"):
        classify(run[0], run[1][:-1], run[2], run[3])


def test_to_dict_is_summary_json_shaped():
    got = classify(*series([20] * 60, [12] * 60)).to_dict()
    assert got == {"class": "overloaded", "queue_slope_per_s": 8.0, "arrival_rate_per_s": 20.0,
                   "completion_rate_per_s": 12.0, "queue_end": 480, "queue_peak": 480,
                   "judged_from_s": 30.0, "judged_to_s": 60.0}


def test_classify_pool_reads_a_ticks_frame_and_a_prefill_pools_load_from_the_requests():
    import polars as pl

    from replay.fleet.saturation import classify_pool

    n = 60
    t_us = np.arange(1, n + 1) * TICK_US
    # the decode pool's ticks count every arrival; the prefill pool's none, its queue grows
    ticks = pl.DataFrame({
        "t_us": np.concatenate((t_us, t_us)), "pool": ["decode"] * n + ["prefill"] * n,
        "waiting": np.concatenate((np.zeros(n, np.int64), np.arange(1, n + 1) * 6)),
        "arrivals": np.concatenate((np.full(n, 10), np.zeros(n, np.int64))),
        "finished": np.concatenate((np.full(n, 4), np.zeros(n, np.int64))),
    })
    # 10 requests a second arrive (at the decode pool); the prefill pool ends 4 prefills a second
    arrival = np.repeat(np.arange(n) * TICK_US, 10) + 1
    prefill_end = np.full(len(arrival), None, dtype=object)
    prefill_end[: 4 * n] = np.repeat(np.arange(n) * TICK_US + 500_000, 4)
    requests = pl.DataFrame({"pool": ["decode"] * len(arrival), "prefill_pool": ["prefill"] * len(arrival),
                             "arrival_us": arrival, "prefill_end_us": pl.Series(prefill_end.tolist(), dtype=pl.Int64)})
    prefill = classify_pool(ticks, "prefill", requests=requests)
    assert prefill.state == OVERLOADED
    assert prefill.arrival_rate_per_s == pytest.approx(10) and prefill.completion_rate_per_s == pytest.approx(4)
    assert classify_pool(ticks, "prefill").state != OVERLOADED  # without the requests it sees no load
    assert classify_pool(ticks, "decode", requests=requests).state == STABLE
    stage = classify_pool(ticks, "prefill", (20 * TICK_US, 40 * TICK_US), requests)
    assert stage.state == OVERLOADED and stage.judged_to_us == 40 * TICK_US
