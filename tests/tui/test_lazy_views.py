"""The per-workload view, the replica view and the observed overlay's scoring read only what they
show (no column of requests.parquet read whole) and show the numbers a computation over the
whole frame gives, on a run whose file has many row groups, mixed statuses and rows out of
time order (tests/tui/test_lazy_open.py's _many_row_groups)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import yaml

from bench.bench_tui import observed_export, synthetic_run
from tests.tui.conftest import screen_text
from tests.tui.test_keys import drive
from tests.tui.test_lazy_open import _many_row_groups, reads  # noqa: F401 - (reads: a fixture)
from tui.app import make_app
from tui.charts import column_edges
from tui.data import load_run
from tui.model import Model
from tui.screens import ReplicasScreen
from tui.views import replica_queue_columns, replica_state

S = 1_000_000
NEVER = np.iinfo(np.int64).max
KEYS = ("arrivals_per_s", "finished_per_s", "rejected_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
        "tpot_p99_ms", "slo_attainment")


@pytest.fixture
def fleet(tmp_path):
    """(run directory, its requests as a whole frame): 3 pools, 30,000 requests over 600 s."""
    run = synthetic_run(tmp_path / "fleet", 600, 3, 30_000, seed=3)
    _many_row_groups(run, seed=3)
    # every 5th request's times on a whole second, as the ticks and the cursor are: windows' edges hit
    frame = pl.read_parquet(run / "requests.parquet")
    on_tick = (pl.int_range(pl.len()) % 5 == 0)
    frame.with_columns(pl.when(on_tick).then(pl.col(c) // S * S).otherwise(pl.col(c)).alias(c)
                       for c in ("arrival_us", "first_token_us", "finished_us")
                       ).write_parquet(run / "requests.parquet", row_group_size=1_000)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "metrics_window_s": 20.0}))
    return run, pl.read_parquet(run / "requests.parquet")


@pytest.fixture
def by_spans(monkeypatch):
    """As a run past KEEP_FIRSTS requests: each view's figures read a span of time at a time."""
    import tui.data as tui_data

    monkeypatch.setattr(tui_data, "KEEP_FIRSTS", 0)
    monkeypatch.setattr(tui_data, "FIRSTS_PER_PASS", 2_000)


def _workload_reference(frame: pl.DataFrame, workload: str, key: str, lo, hi, tick_us: int, window_us: int):
    """A workload's figure per window (lo, hi], window by window over the whole frame."""
    mine = frame.filter(pl.col("workload") == workload)
    within = lambda c, a, b: (pl.col(c) > a) & (pl.col(c) <= b)  # noqa: E731
    out = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        if key.endswith("_per_s"):
            status = {"arrivals_per_s": None, "finished_per_s": "finished", "rejected_per_s": "rejected"}[key]
            column = "finished_us" if status == "finished" else "arrival_us"
            rows = mine.filter(within(column, a - tick_us, b) & (True if status is None else pl.col("status") == status))
            out.append(rows.height / ((b - a + tick_us) / 1e6))
        elif key == "slo_attainment":
            ended = mine.filter(pl.col("status") != "unfinished").with_columns(
                e=pl.coalesce("finished_us", "arrival_us")).filter(within("e", a - window_us, b))
            out.append(ended["slo_met"].fill_null(False).mean() if ended.height else np.nan)
        else:
            t, v = ("first_token_us", "ttft_us") if key.startswith("ttft") else ("finished_us", "tpot_us")
            rows = mine.filter(within(t, a - window_us, b))
            if t == "finished_us":
                rows = rows.filter(pl.col("status") == "finished")
            values = (rows[v].drop_nulls().cast(pl.Float64) / 1000.0).to_numpy()
            out.append(np.percentile(values, 50 if "p50" in key else 99) if len(values) else np.nan)
    return np.array(out, np.float64)


def test_the_workload_view_reads_a_span_at_a_time_and_shows_the_whole_frames_figures(fleet, by_spans, reads):
    run, frame = fleet
    data = load_run(run)
    model = Model([data], at_us=300 * S)
    model.cycle_workload(1)
    workload = model.view.scope.removeprefix("workload:")
    edges = column_edges(0, model.t_end, 37)
    lo, hi = np.minimum(edges[:-1] + 1, data.end_us), edges[1:]
    t = np.array([model.view.cursor_us])
    for key in KEYS:
        want = _workload_reference(frame, workload, key, lo, hi, data.tick_us, data.window_us)
        want[edges[:-1] >= data.end_us] = np.nan
        assert np.array_equal(model.column_values(data, key, 37, "max"), want, equal_nan=True), key
        at = _workload_reference(frame, workload, key, t, t, data.tick_us, data.window_us)[0]
        got = model.value_at(data, key)
        assert (got is None and np.isnan(at)) or got == at, key
    want = _workload_reference(frame, workload, "slo_attainment", data.t_us[::7], data.t_us[::7], data.tick_us,
                               data.window_us)
    assert np.array_equal(model.slo_series(data)[::7], want, equal_nan=True)
    assert data.table.held == [] and reads == []  # no column read whole


def _workload_screen(run) -> str:
    app = make_app(run, at="5:00")
    shown = []

    async def script(pilot):
        await pilot.press("l")
        await pilot.pause()
        assert app.model.view.scope.startswith("workload:")
        shown.append(screen_text(app))

    drive(app, script, size=(160, 50))
    return shown[0]


def test_the_workload_view_draws_the_same_screen_read_by_spans_as_held(fleet, monkeypatch):
    run, _ = fleet
    held = _workload_screen(run)
    import tui.data as tui_data

    monkeypatch.setattr(tui_data, "KEEP_FIRSTS", 0)
    monkeypatch.setattr(tui_data, "FIRSTS_PER_PASS", 2_000)
    assert _workload_screen(run) == held
    assert "TPOT p99 (window)" in held and "finished/s" in held


def _replica_reference(frame: pl.DataFrame, pool: str, t_us: int, edges: np.ndarray):
    """Per replica (as they first appear in the file): (queued, running, KV held) at t, as the
    view computed them from its pool's whole columns, and its queue at each edge after the first."""
    req = frame.filter((pl.col("pool") == pool) & pl.col("replica").is_not_null() & (pl.col("status") != "rejected"))
    state, queues = {}, {}
    for (replica,), part in req.group_by(["replica"], maintain_order=True):
        arrive = part["arrival_us"].to_numpy()
        sched = part["first_scheduled_us"].fill_null(NEVER).to_numpy()
        end = part["finished_us"].fill_null(NEVER).to_numpy()
        first = part["first_token_us"].fill_null(NEVER).to_numpy()
        order = np.argsort(sched, kind="stable")
        k = np.searchsorted(sched[order], t_us, side="right")
        live = end[order][:k] > t_us
        f, e = first[order][:k][live], end[order][:k][live]
        done = np.clip((t_us - f) / np.maximum(e - f, 1).astype(np.float64), 0.0, 1.0)
        held = (part["prompt_tokens"].to_numpy()[order].astype(np.float64)[:k][live].sum()
                + (part["output_tokens"].to_numpy()[order].astype(np.float64)[:k][live] * done).sum())
        state[int(replica)] = (int((arrive <= t_us).sum() - (sched <= t_us).sum()),
                               int((sched <= t_us).sum() - (end <= t_us).sum()), float(held))
        queues[int(replica)] = np.array([(arrive <= x).sum() - (sched <= x).sum() for x in edges[1:]], np.float64)
    return state, queues


def test_the_replica_view_counts_the_rows_at_the_cursor_as_the_whole_frame_does(fleet, reads):
    run, frame = fleet
    app = make_app(run, at="5:00")

    async def script(pilot):
        reads.clear()  # (the first screen's fleet TTFT: the first tokens of a run this small, kept)
        await pilot.press("p", "r")  # the first pool's replicas
        await pilot.pause()
        assert isinstance(app.screen, ReplicasScreen)
        model, data = app.model, app.model.runs[0]
        text = screen_text(app)
        state, _ = _replica_reference(frame, "pool0", model.view.cursor_us, column_edges(0, model.t_end, 40))
        assert "replicas of pool pool0" in text and "at 5:00" in text
        for replica, (queued, running, _held) in state.items():
            line = next(x for x in text.splitlines() if x.strip().startswith(f"r{replica} ") and "queue" in x)
            assert line.split("queue")[1].split()[1] == str(queued)
            assert line.split("running")[1].split()[1] == str(running)
        for t_s in (300, 301, 17, 599, 900):
            t = t_s * S
            edges = column_edges(0, model.t_end, 40)
            state, queues = _replica_reference(frame, "pool0", t, edges)
            got = replica_state(data, "pool0", t)
            assert got == state and list(got) == list(state)
            columns = replica_queue_columns(data, "pool0", edges)
            assert list(columns) == list(queues) and all(np.array_equal(columns[r], queues[r]) for r in queues)
        assert data.table.held == [] and reads == []

    drive(app, script, size=(160, 40))


def test_the_overlay_is_scored_a_batch_at_a_time_as_from_the_whole_frame(fleet, tmp_path, by_spans, reads,
                                                                        monkeypatch):
    import replay.outputs.observed as replayed
    from replay.outputs import schema
    from tui.observed import _TICK_COLUMNS, load_overlay, score

    run, frame = fleet
    export = observed_export(run, tmp_path)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    ticks = pl.read_parquet(run / schema.TICKS_FILE, columns=list(_TICK_COLUMNS))
    want = score(load_overlay([str(export)], load_run(run), cfg), ticks, frame)
    monkeypatch.setattr(replayed, "BATCH_ROWS", 4_000)  # the file read in several batches, the frame in one
    app = make_app(run, at="5:00", observed=[str(export)])

    async def script(pilot):
        await app.workers.wait_for_complete()
        await pilot.pause()
        got = app.model.observed
        assert got.error is None and got.section == want.section and got.section["signals"]
        assert got.replayed.keys() == want.replayed.keys()
        assert all(np.array_equal(got.replayed[k], want.replayed[k], equal_nan=True) for k in want.replayed)
        assert app.model.runs[0].table.held == []

    reads.clear()
    drive(app, script, size=(160, 50))
    assert reads == []
