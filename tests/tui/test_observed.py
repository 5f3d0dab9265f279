"""The dashboard over an observed export (issue 13): the observed line under each chart it has a
signal for, marked where the replay parts from it, the divergence screen (o), a request log's
observed latencies in the drill-down, and `tui --observed` / `run --tui --observed` from the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.e2e.test_observed_cli import OFFSET, export_of
from tests.tui.conftest import screen_text
from tests.tui.test_cli_tui import FLEET, TRACE, _headless
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.observed_view import parted_columns, timeline_marks
from tui.screens import ObservedScreen, RequestLifeScreen

S = 1_000_000
SECTION = f"observed: {{offset_s: {OFFSET}, window_s: 5, rate_window_s: 5}}\n"
STALL = (10, 20)  # the export's fleet had 10 more waiting than the replay from 10 s to 20 s


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory) -> tuple[Path, Path]:
    """(a run whose config has an `observed:` section, an export of it with a stall put in)."""
    from llm_replay.app import main

    d = tmp_path_factory.mktemp("observed")
    (d / "trace.csv").write_text(TRACE)
    (d / "fleet.yaml").write_text(FLEET + SECTION)
    assert main(["run", "--config", str(d / "fleet.yaml"), "--out", str(d / "run"), "-q"]) == 0
    export = export_of(pl.read_parquet(d / "run" / "ticks.parquet"), d / "export.json", extra=10, between=STALL)
    return d / "run", export


async def _scored(pilot):
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def test_the_observed_line_is_drawn_under_its_charts_and_marked_where_it_parts(observed_run):
    run, export = observed_run
    app = make_app(run, at="0:15", observed=[str(export)])

    async def script(pilot):
        await _scored(pilot)
        model = app.model
        assert model.observed.scored
        text = screen_text(app)
        assert text.count("observed") >= 4  # waiting, running, KV, replicas, GPU-Util rows
        # at 0:15 the export waits 10 more than the replay
        replayed = model.value_at(model.runs[0], "waiting")
        assert f"{replayed + 10:.0f} obs" in text
        width = 40
        parted = parted_columns(model, "waiting", width)
        cols = np.flatnonzero(parted)
        t_end = model.t_end
        # the marked columns are those of the stall's windows, nothing before 10 s or after 20 s
        assert len(cols) and cols.min() * t_end / width >= (STALL[0] - 5) * S
        assert (cols.max() + 1) * t_end / width <= (STALL[1] + 5) * S
        assert not parted_columns(model, "running", width).any()  # running was not changed
        assert timeline_marks(model, 100) and "≠" in text

    drive(app, script, size=(120, 40))


def test_a_threshold_of_one_marks_nothing(observed_run):
    run, export = observed_run
    app = make_app(run, observed=[str(export)], diverge_threshold=1.0)

    async def script(pilot):
        await _scored(pilot)
        assert not parted_columns(app.model, "waiting", 40).any()
        assert not timeline_marks(app.model, 100)

    drive(app, script)


def test_the_divergence_screen_lists_each_signal_and_goes_to_the_gap(observed_run):
    run, export = observed_run
    app = make_app(run, observed=[str(export)])

    async def script(pilot):
        await _scored(pilot)
        await pilot.press("o")
        assert isinstance(app.screen, ObservedScreen)
        text = screen_text(app)
        for word in ("MAPE", "largest gap", "waiting", "running", "25%"):
            assert word in text
        section = app.model.observed.section
        gap = section["signals"]["waiting"]["default"]
        assert STALL[0] <= gap["gap_at_s"] <= STALL[1] + 5 and gap["gap"] == pytest.approx(10, abs=1)
        row = [s for s, _, _ in app.screen.rows].index("waiting")
        for _ in range(row):
            await pilot.press("down")
        await pilot.press("enter")
        assert not isinstance(app.screen, ObservedScreen)
        assert app.model.view.cursor_us == round(gap["gap_at_s"] * S)

    drive(app, script, size=(120, 40))


def test_compare_mode_draws_the_export_under_both_runs_scored_against_the_first(observed_run, one_pool_run):
    run, export = observed_run
    app = make_app(run, compare=one_pool_run, observed=[str(export)])

    async def script(pilot):
        await _scored(pilot)
        lines = screen_text(app).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("queue (waiting)"))
        assert "one-pool" in lines[at + 1] and "observed" in lines[at + 2]
        assert app.model.observed.section["signals"]["waiting"]["default"]["windows"] > 0

    drive(app, script, size=(120, 50))


def test_the_drill_down_shows_a_request_logs_observed_latencies(one_pool_run, tmp_path):
    run = tmp_path / "logged"
    shutil.copytree(one_pool_run, run)
    req = pl.read_parquet(run / "requests.parquet")
    req.with_columns(observed_ttft_us=pl.col("ttft_us") * 2,
                     observed_e2e_us=(pl.col("finished_us") - pl.col("arrival_us")) // 2).write_parquet(
        run / "requests.parquet")
    app = make_app(run, at="0:20")

    async def script(pilot):
        await pilot.press("d")
        text = screen_text(app)
        assert "obs TTFT" in text and "obs E2E" in text
        await pilot.press("enter")
        assert isinstance(app.screen, RequestLifeScreen)
        life = screen_text(app)
        assert "observed TTFT" in life and "observed E2E" in life and "in the request log" in life
        assert "-50%" in life  # the replayed TTFT against an observed one twice as long

    drive(app, script, size=(120, 40))


def _no_run(self):
    pytest.fail("the dashboard should not start")


@pytest.mark.parametrize("extra, fragment", [
    (["--observed", "nope.json"], "nope.json"),
    (["--observed", "bad.json"], "bad.json"),
    (["--observed", "EXPORT", "--diverge-threshold", "2"], "--diverge-threshold 2: expected a share"),
    (["--diverge-threshold", "0.5"], "--diverge-threshold: applies to an observed export"),
])
def test_tui_observed_bad_input_is_one_line_and_exit_2(cli, observed_run, tmp_path, monkeypatch, extra, fragment):
    from tui.app import Dashboard

    monkeypatch.setattr(Dashboard, "run", _no_run)
    run, export = observed_run
    (tmp_path / "bad.json").write_text("{not json")
    argv = [str(export) if a == "EXPORT" else a for a in extra]
    code, out, err = cli("tui", run, *argv)
    assert code == 2, err
    assert err.startswith("llm-replay: error: ") and err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err and not out


def test_tui_observed_needs_the_runs_offset(cli, one_pool_run, observed_run, monkeypatch):
    from tui.app import Dashboard

    monkeypatch.setattr(Dashboard, "run", _no_run)
    code, _, err = cli("tui", one_pool_run, "--observed", observed_run[1])
    assert code == 2 and "observed.offset_s: not set" in err and err.count("\n") == 1


def test_tui_observed_screenshot(cli, observed_run, tmp_path):
    run, export = observed_run
    code, out, err = cli("tui", run, "--observed", export, "--at", "0:15", "--screenshot", "shot.svg")
    assert code == 0, err
    assert "observed" in (tmp_path / "shot.svg").read_text()


def test_run_tui_observed_draws_the_export_and_scores_the_finished_run(cli, observed_run, tmp_path, monkeypatch):
    from tui.app import Dashboard

    seen = {}

    def scored(app):
        overlay = app.model.observed
        seen.setdefault("drawn_live", overlay is not None and app.model.runs[0].live is not None)
        return overlay is not None and overlay.scored

    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "fleet.yaml").write_text(FLEET + SECTION)
    monkeypatch.setattr(Dashboard, "run", _headless(scored))
    code, out, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui", "--observed", observed_run[1])
    assert code == 0, err
    assert seen["drawn_live"]  # the observed line is there while the replay runs
    assert "observed vs replayed" in out  # the table `run --observed` prints
    import json

    summary = json.loads((tmp_path / "watched" / "summary.json").read_text())
    assert summary["observed"]["signals"]["waiting"]["default"]["gap"] == pytest.approx(10, abs=1)


def test_snapshot_of_the_overlay(snap_compare, observed_run):
    """The observed line under each chart, red where it parts, the timeline's ≠ (a run scored)."""
    run, export = observed_run

    async def scored(pilot):
        await _scored(pilot)

    assert snap_compare(make_app(run, at="0:15", observed=[str(export)]), run_before=scored, terminal_size=(120, 40))


def test_run_tui_on_a_request_log_keeps_its_observed_latencies(cli, tmp_path, monkeypatch):
    """`run --tui` writes a request log's TTFT/E2E into requests.parquet as `run` does, and the
    finished run's drill-down shows them (the dashboard stops once the run is whole)."""
    from tests.tui.test_cli_tui import _finished
    from tui.app import Dashboard
    from tui.requests import columns_of

    log = Path(__file__).parents[1] / "fixtures" / "traces" / "inference_perf_per_request_lifecycle_metrics.json"
    seen = {}

    def finished(app):
        if _finished(app):
            seen["columns"] = columns_of(app.model.runs[0])
            return True
        return False

    monkeypatch.setattr(Dashboard, "run", _headless(finished))
    code, out, err = cli("run", log, "--out", "watched", "--tui")
    assert code == 0, err
    assert "observed ttft: 1 requests" in out  # the comparison `run` prints
    assert pl.read_parquet(tmp_path / "watched" / "requests.parquet").columns[-2:] == \
        ["observed_ttft_us", "observed_e2e_us"]
    assert "obs TTFT" in seen["columns"]
