"""Opening a finished run checks requests.parquet whole in one streaming pass and keeps none of its
columns: a pool's series are its ticks', a fleet's SLO attainment is counted per tick as it opens,
its TTFT percentiles read the first tokens when a chart first asks; each view's columns are read
when it first asks, from the file as it was opened."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import polars as pl
import pytest

import yaml

from bench.bench_tui import synthetic_run
from tests.tui.conftest import AFTER, BEFORE
from tests.tui.test_validate import DAMAGES
from tui.app import make_app, render_svg
from tui.data import FLEET, load_run
from tui.request_table import RequestTable
from tui.validate import REQUESTS, may_fail
from tui.views import replica_state, replicas_of, workload_values, workloads


@pytest.fixture
def run(tmp_path):
    return shutil.copytree(BEFORE, tmp_path / "run")


@pytest.fixture
def reads(monkeypatch):
    """The columns of requests.parquet read from the file (after its streaming check), in order."""
    got: list[str] = []
    read = RequestTable._read

    def recording(self, names):
        got.extend(names)
        return read(self, names)

    monkeypatch.setattr(RequestTable, "_read", recording)
    return got


def _first_screen(run):
    """The run as the dashboard has it once its first screen is drawn."""
    import asyncio

    app = make_app(run, follow=False)
    asyncio.run(render_svg(app, (160, 50)))
    return app.model.runs[0]


def test_a_pool_opens_and_draws_its_first_screen_reading_no_request_column(run, reads):
    data = load_run(run)
    assert len(data.pools) == 1 and data.table.held == [] and reads == []
    assert data.table.columns == list(pl.read_parquet_schema(run / "requests.parquet"))
    assert _first_screen(run).table.held == [] and reads == []


def test_a_fleet_of_pools_draws_its_first_screen_reading_first_tokens_only(tmp_path, reads):
    run = synthetic_run(tmp_path / "fleet", 600, 3, 20_000)
    data = load_run(run)
    assert data.pools == ["pool0", "pool1", "pool2"] and data.table.held == [] and reads == []
    shown = _first_screen(run)
    assert shown.table.held == [] and set(reads) <= {"first_token_us", "ttft_us"}


@pytest.mark.parametrize("window_s", [60.0, 2.5, 0.5])
def test_a_fleets_attainment_is_the_share_of_requests_ended_in_each_window_that_met_it(tmp_path, window_s):
    run = synthetic_run(tmp_path / "fleet", 300, 2, 3_000, seed=3)
    requests = pl.read_parquet(run / "requests.parquet")
    rng = np.random.default_rng(1)  # some rejected at arrival (ended then) and some unfinished (not ended)
    status = rng.choice(["finished", "rejected", "unfinished"], requests.height, p=[0.8, 0.1, 0.1])
    requests.with_columns(status=pl.Series(status), finished_us=pl.when(pl.Series(status) == "finished")
                          .then("finished_us")).write_parquet(run / "requests.parquet")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "metrics_window_s": window_s}))
    data = load_run(run)
    ended = requests.with_columns(status=pl.Series(status)).filter(pl.col("status") != "unfinished")
    end = np.where(ended["status"] == "finished", ended["finished_us"], ended["arrival_us"])
    met = ended["slo_met"].to_numpy()
    w = round(window_s * 1e6)
    want = [met[(end > t - w) & (end <= t)].mean() if ((end > t - w) & (end <= t)).any() else np.nan
            for t in data.t_us]
    assert np.allclose(data.series[FLEET]["slo_attainment"], want, equal_nan=True, rtol=0, atol=1e-12)


def test_the_review_views_read_no_column_whole(run, reads):
    data = load_run(run)
    names = workloads(data)
    t = data.t_us[len(data.t_us) // 2:][:5]
    assert not np.isnan(workload_values(data, names[0], "ttft_p99_ms", t, t)).all()
    assert replicas_of(data, data.pools[0]) and replica_state(data, data.pools[0], int(t[0]))
    assert data.table.held == [] and reads == []  # (tests/tui/test_lazy_views.py: their figures)


def test_the_table_is_the_file(run):
    data = load_run(run)
    assert data.requests.equals(pl.read_parquet(run / "requests.parquet"))


@pytest.mark.parametrize("own_path", [True, False], ids=["by the handle's path", "by the handle's bytes"])
def test_a_run_replaced_after_it_was_opened_still_shows_what_was_opened(run, own_path, monkeypatch):
    if not own_path:  # as where no /proc/self/fd names the handle's file
        monkeypatch.setattr("tui.request_table._own_path", lambda handle: None)
    data = load_run(run)
    before = pl.read_parquet(run / "requests.parquet")
    replaced = before.with_columns(workload=pl.lit("other"))
    replaced.write_parquet(run / "requests.tmp")
    (run / "requests.tmp").replace(run / "requests.parquet")  # as the writer publishes: a rename
    assert data.table["workload"].equals(before["workload"])
    assert data.table.query(lambda req: req.select(pl.col("workload").unique().sort())).equals(
        before.select(pl.col("workload").unique().sort()))
    counted = data.table.fold(lambda req: req.select("workload"), int, lambda n, batch: n + batch.height, 7)
    assert counted == before.height


def _rewrite(**columns):
    def damage(run):
        frame = pl.read_parquet(run / "requests.parquet")
        frame.with_columns(**columns).write_parquet(run / "requests.parquet")
    return damage


ONE = pl.col("request_id") == 5
MORE = {  # each of check_frame's tests on rows, once
    "infinite tpot": _rewrite(tpot_us=pl.when(ONE).then(float("inf")).otherwise(pl.col("tpot_us"))),
    "NaN tpot": _rewrite(tpot_us=pl.when(ONE).then(float("nan")).otherwise(pl.col("tpot_us"))),
    "negative time": _rewrite(first_token_us=pl.when(ONE).then(-1).otherwise(pl.col("first_token_us"))),
    "time past the bound": _rewrite(finished_us=pl.when(ONE).then(10**15).otherwise(pl.col("finished_us"))),
    "null pool": _rewrite(pool=pl.when(ONE).then(None).otherwise(pl.col("pool"))),
}
ALL = {**{n: d for n, (d, fragment) in DAMAGES.items() if fragment.startswith("requests.parquet")}, **MORE}


@pytest.mark.parametrize("name", list(ALL))
def test_every_damage_of_the_requests_is_flagged_by_the_streaming_check(run, name, cli):
    damage = ALL[name]
    assert not may_fail(run / "requests.parquet", pl.scan_parquet(run / "requests.parquet"), REQUESTS)
    damage(run)
    try:
        scan = pl.scan_parquet(run / "requests.parquet")
        flagged = may_fail(run / "requests.parquet", scan, REQUESTS)
    except Exception:  # noqa: BLE001 - unreadable: the whole frame's reader names it
        flagged = True
    assert flagged
    code, _, err = cli("tui", run, "--screenshot", run / "s.svg")
    assert code == 2 and "requests.parquet" in err


def test_fleet_ttft_of_a_large_query_is_np_percentile(run, monkeypatch):
    import tui.percentiles as percentiles

    data = load_run(run)
    edges = np.linspace(0, data.end_us, 41).astype(np.int64)
    small = data.fleet_ttft(edges[:-1] + 1, edges[1:])
    monkeypatch.setattr(percentiles, "KERNEL_FROM", 0)
    large = data.fleet_ttft(edges[:-1] + 1, edges[1:])
    assert np.array_equal(small, large, equal_nan=True)


@pytest.mark.parametrize("repeat_at", [None, "shuffled", 1, 99, 100, 101, 200, 1500])
def test_request_ids_are_checked_unique_across_the_checks_batches(run, monkeypatch, repeat_at):
    import tui.validate as validate

    monkeypatch.setattr(validate, "CHECK_BATCH", 100)  # the fixture's 2,892 requests in batches of 100
    frame = pl.read_parquet(run / "requests.parquet")
    rid = np.arange(frame.height)
    if repeat_at == "shuffled":
        rid = np.random.default_rng(0).permutation(frame.height)
    elif repeat_at is not None:
        rid[repeat_at:] -= 1  # the id before repeated, the rest still increasing (a batch's first, or inside one)
    frame.with_columns(request_id=pl.Series(rid, dtype=pl.Int64)).write_parquet(run / "requests.parquet")
    flagged = may_fail(run / "requests.parquet", pl.scan_parquet(run / "requests.parquet"), REQUESTS)
    assert flagged is (repeat_at not in (None, "shuffled"))


def _many_row_groups(run, seed=0):
    """requests.parquet with some requests rejected and some unfinished, in row groups of 1,000
    rows (so a query's filters can skip some by their statistics), shuffled in parts."""
    frame = pl.read_parquet(run / "requests.parquet")
    rng = np.random.default_rng(seed)
    status = pl.Series(rng.choice(["finished", "rejected", "unfinished"], frame.height, p=[0.9, 0.05, 0.05]))
    done = status == "finished"
    frame = frame.with_columns(status=status, finished_us=pl.when(done).then("finished_us"),
                               ttft_us=pl.when(status != "rejected").then("ttft_us"),
                               first_token_us=pl.when(status != "rejected").then("first_token_us"))
    order = np.concatenate([rng.permutation(part) for part in np.array_split(np.arange(frame.height), 7)])
    frame[order].write_parquet(run / "requests.parquet", row_group_size=1_000)
    return frame


def _worst(frame, cursor_us, window_us, by="ttft_us", pool=None):
    """The worst requests of the window ending at the cursor, from the whole frame (the reference)."""
    ended = pl.when(pl.col("status") == "rejected").then("arrival_us").otherwise(pl.coalesce("finished_us", 2**62))
    mine = frame.filter((pl.col("arrival_us") <= cursor_us) & (ended > cursor_us - window_us))
    if pool is not None:
        mine = mine.filter(pl.col("pool") == pool)
    return mine.sort([by, "request_id"], descending=[True, False], nulls_last=True)["request_id"]


def test_the_worst_requests_and_a_life_read_only_their_rows(tmp_path, reads):
    run = synthetic_run(tmp_path / "fleet", 600, 3, 30_000, seed=2)
    frame = _many_row_groups(run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "metrics_window_s": 20.0}))
    data = load_run(run)
    from tui.requests import LIMIT, request_life, worst_requests

    for cursor_s, pool in ((300, None), (300, "pool1"), (5, None), (599, "pool2"), (900, None)):
        want = _worst(frame, cursor_s * 1_000_000, 20_000_000, pool=pool)
        got = worst_requests(data, cursor_s * 1_000_000, pool or FLEET, limit=10**6)
        assert got["request_id"].equals(want) and want.len()
        rows = frame.filter(pl.col("request_id").is_in(want.implode())).sort("request_id").drop("e2e_us")
        assert got.select(frame.columns).sort("request_id").drop("e2e_us").equals(rows)  # (e2e_us: recomputed)
        page = worst_requests(data, cursor_s * 1_000_000, pool or FLEET, offset=LIMIT)
        assert page["request_id"].equals(want[LIMIT:2 * LIMIT])
    rid = int(frame["request_id"][12_345])
    assert f"request {rid}" in request_life(data, rid).plain
    assert data.table.held == [] and reads == []  # no column read whole


def test_a_large_fleets_ttft_is_read_a_span_at_a_time_and_draws_the_same(monkeypatch, reads):
    import tui.data as tui_data

    held = load_run(AFTER)  # three pools: the fleet's TTFT from first tokens
    edges = np.linspace(0, held.end_us, 57).astype(np.int64)
    lo, hi = np.minimum(edges[:-1] + 1, held.end_us), edges[1:]
    want = held.fleet_ttft(lo, hi), held.fleet_ttft(held.t_us, held.t_us)
    shot = asyncio.run(render_svg(make_app(AFTER, at="4:16"), (160, 50)))
    monkeypatch.setattr(tui_data, "KEEP_FIRSTS", 0)  # as a run past it: no first token kept
    monkeypatch.setattr(tui_data, "FIRSTS_PER_PASS", 150)
    reads.clear()
    read = load_run(AFTER)
    got = read.fleet_ttft(lo, hi), read.fleet_ttft(read.t_us, read.t_us)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, got))
    assert not np.isnan(got[1]).all()
    assert asyncio.run(render_svg(make_app(AFTER, at="4:16"), (160, 50))) == shot
    assert read._firsts is None and read.table.held == [] and reads == []
