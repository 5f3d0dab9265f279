"""Reading run directories: the fleet adds up to what summary.json says, bad directories are one
UserError naming the file, and charts never hold more values than columns."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest

from tests.tui.conftest import AFTER, BEFORE
from common.errors import UserError
from tui.charts import column_edges, downsample
from tui.data import FLEET, load_run
from tui.timefmt import fmt_time, parse_time


def test_fleet_adds_up_to_the_summary():
    run = load_run(AFTER)
    summary = json.loads((AFTER / "summary.json").read_text())
    assert run.pools == ["chat", "docs", "batch"]  # the config's order, not the file's
    assert run.scopes == [FLEET, "chat", "docs", "batch"]
    fleet = run.series[FLEET]
    assert fleet["cost_usd"][-1] == pytest.approx(summary["cost_usd"], abs=1e-3)
    assert fleet["cost_per_mtok_cum_usd"][-1] == pytest.approx(summary["cost_per_mtok_out_usd"], rel=1e-3)
    for pool in run.pools:
        assert run.series[pool]["cost_usd"][-1] == pytest.approx(summary["pools"][pool]["cost_usd"], abs=1e-3)
    ticks = pl.read_parquet(AFTER / "ticks.parquet")
    per_t = ticks.group_by("t_us").agg(pl.col("waiting").sum(), pl.col("gpus").sum()).sort("t_us")
    assert np.array_equal(fleet["waiting"], per_t["waiting"].to_numpy())
    assert np.array_equal(fleet["gpus"], per_t["gpus"].to_numpy())
    assert np.nanmax(fleet["kv_usage"]) <= 1.0


def test_one_pool_is_the_fleet(one_pool_run):
    run = load_run(one_pool_run)
    assert run.pools == ["default"] and run.scopes == [FLEET]
    assert run.series[FLEET] is run.series["default"]
    assert len(run.scaling_times_in(FLEET)) == 0


def test_fleet_ttft_at_one_tick_is_the_window_of_the_tick_columns():
    run = load_run(BEFORE)  # one pool: the tick column is the reference
    i = 200
    t = run.t_us[i]
    got = run.fleet_ttft(np.array([t]), np.array([t]))[0]
    series = run.series[FLEET]
    assert got[0] == pytest.approx(series["ttft_p50_ms"][i], rel=1e-9)
    assert got[1] == pytest.approx(series["ttft_p99_ms"][i], rel=1e-9)


def _copy(tmp_path, src=BEFORE):
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def test_bad_directories_are_one_user_error_naming_the_file(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        load_run(tmp_path / "file")
    with pytest.raises(UserError, match="it holds the runs incident-after, incident-before"):
        load_run(BEFORE.parent)
    run = _copy(tmp_path)
    (run / "events.parquet").unlink()
    with pytest.raises(UserError, match=r"missing events\.parquet"):
        load_run(run)


def test_a_damaged_file_is_named(tmp_path):
    run = _copy(tmp_path)
    (run / "ticks.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match=r"ticks\.parquet: not a readable parquet file"):
        load_run(run)
    run2 = _copy(tmp_path / "b")
    pl.read_parquet(run2 / "ticks.parquet").drop("waiting").write_parquet(run2 / "ticks.parquet")
    with pytest.raises(UserError, match="missing column 'waiting'"):
        load_run(run2)
    run3 = _copy(tmp_path / "c", AFTER)
    pl.read_parquet(run3 / "ticks.parquet").head(10).write_parquet(run3 / "ticks.parquet")
    with pytest.raises(UserError, match="one row per pool per tick"):
        load_run(run3)
    run4 = _copy(tmp_path / "d")
    (run4 / "config.yaml").write_text("- a list\n")
    with pytest.raises(UserError, match="config.yaml: expected a mapping"):
        load_run(run4)


def test_a_run_without_events(tmp_path):
    run = _copy(tmp_path)
    pl.read_parquet(run / "events.parquet").head(0).write_parquet(run / "events.parquet")
    data = load_run(run)
    assert data.events.height == 0 and len(data.scaling_times_in(FLEET)) == 0


@pytest.mark.parametrize("text, seconds", [("14:05", 845), ("1:02:03", 3723), ("90", 90), ("90s", 90),
                                           ("0:00", 0), ("2.5", 2.5)])
def test_parse_time(text, seconds):
    assert parse_time(text) == round(seconds * 1e6)


@pytest.mark.parametrize("text", ["", "14:5x", "14:60", "1:60:00", "-3", "a:b", "14h"])
def test_parse_time_rejects(text):
    with pytest.raises(UserError, match="--at"):
        parse_time(text)


def test_fmt_time():
    assert fmt_time(845_000_000) == "14:05"
    assert fmt_time(3_723_000_000) == "1:02:03"


def test_downsample_keeps_peaks_and_width():
    t = np.arange(1, 86_401, dtype=np.int64) * 1_000_000
    v = np.zeros(len(t))
    v[43_210] = 99.0
    out = downsample(t, v, column_edges(0, int(t[-1]), 60))
    assert len(out) == 60 and out.max() == 99.0 and (out == 99.0).sum() == 1
    lows = downsample(t, 1 - v / 99, column_edges(0, int(t[-1]), 60), how="min")
    assert lows.min() == 0.0
    # more columns than ticks: each column shows the tick covering it; past the end, nothing
    short = downsample(t[:3], np.array([1.0, 2.0, 3.0]), column_edges(0, 6_000_000, 12))
    assert short[:6].tolist() == [1, 1, 2, 2, 3, 3] and np.isnan(short[6:]).all()


def test_columns_of_is_column_of_for_each_time():
    from tui.charts import column_of, columns_of

    times = np.array([0, 1, 999_999, 1_000_000, 1_000_001, 59_999_999, 60_000_000, 75_000_000])
    for width in (1, 7, 60, 200):
        assert columns_of(times, 0, 60_000_000, width).tolist() == [column_of(int(t), 0, 60_000_000, width)
                                                                    for t in times]
    assert columns_of(times, 5, 5, 10).tolist() == [0] * len(times)
