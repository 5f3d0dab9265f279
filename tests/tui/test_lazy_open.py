"""Opening a finished run reads of requests.parquet only what opening needs, checked whole in one
streaming pass; each view's columns are read when it first asks, from the file as it was opened."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest

from tests.tui.conftest import BEFORE
from tests.tui.test_validate import DAMAGES
from tui.data import OPENING, load_run
from tui.validate import REQUESTS, may_fail
from tui.views import REPLICA_COLUMNS, WORKLOAD_COLUMNS, replicas_of, workload_values, workloads


@pytest.fixture
def run(tmp_path):
    return shutil.copytree(BEFORE, tmp_path / "run")


def test_opening_reads_only_what_opening_needs(run):
    data = load_run(run)
    assert sorted(data.table.held) == sorted(OPENING)
    assert data.table.columns == list(pl.read_parquet_schema(run / "requests.parquet"))
    names = workloads(data)
    assert sorted(data.table.held) == sorted({*OPENING, "workload"})
    t = data.t_us[len(data.t_us) // 2:][:5]
    workload_values(data, names[0], "ttft_p99_ms", t, t)
    assert sorted(data.table.held) == sorted({*OPENING, *WORKLOAD_COLUMNS})
    replicas_of(data, data.pools[0])
    assert set(data.table.held) <= {*OPENING, *WORKLOAD_COLUMNS, *REPLICA_COLUMNS}


def test_the_table_is_the_file(run):
    data = load_run(run)
    assert data.requests.equals(pl.read_parquet(run / "requests.parquet"))


def test_a_run_replaced_after_it_was_opened_still_shows_what_was_opened(run):
    data = load_run(run)
    before = pl.read_parquet(run / "requests.parquet")
    replaced = before.with_columns(workload=pl.lit("other"))
    replaced.write_parquet(run / "requests.tmp")
    (run / "requests.tmp").replace(run / "requests.parquet")  # as the writer publishes: a rename
    assert data.table["workload"].equals(before["workload"])


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
