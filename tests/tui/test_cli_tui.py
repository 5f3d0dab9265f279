"""`llm-replay tui` and `run --tui` from the command line: bad input is exit code 2 and one line,
--screenshot needs no terminal, and a replay watched live ends as a finished run directory."""

from __future__ import annotations

import asyncio

import pytest

from tests.tui.conftest import AFTER, BEFORE
from tui.app import Dashboard

TRACE = "arrival_s,prompt,output\n" + "".join(f"{i * 0.1:.1f},{300 + (i * 53) % 900},{20 + i % 90}\n"
                                                for i in range(300))
FLEET = ("model: llama-3.1-8b\ngpu: h100-sxm-80gb\ntrace: {path: trace.csv, format: csv, time_unit: s,\n"
         "  column_map: {arrival: arrival_s, prompt_tokens: prompt, output_tokens: output}}\n"
         "pools:\n  - {name: default, replicas: 1, engine: {num_gpu_blocks_override: 600, max_model_len: 8000}}\n")


@pytest.mark.parametrize("argv, fragment", [
    (["nope"], "nope: no such run directory"),
    ([BEFORE / "summary.json"], "is a file; expected a run directory"),
    ([BEFORE.parent], "not a run directory (missing ticks.parquet"),
    ([BEFORE, "--compare", "nope"], "nope: no such run directory"),
    ([BEFORE, "--at", "99:00"], "--at 99:00: outside the run (0:00 to 6:12)"),
    ([BEFORE, "--at", "5 min"], "--at '5 min': expected a time from the run's start"),
    ([BEFORE, "--at", "4:61"], "seconds must be below 60"),
    ([BEFORE, "--screenshot", "shot.png"], "expected a file name ending in .svg"),
    ([BEFORE, "--screenshot", "no/such/dir/shot.svg"], "does not exist"),
    ([BEFORE, "--screenshot", "x.svg", "--size", "20x5"], "--size '20x5': expected COLUMNSxROWS"),
    ([BEFORE, "--warmup", "-5"], "--warmup -5: expected a number of seconds, 0 or more"),
    ([BEFORE, "--warmup", "nan"], "--warmup nan: expected a number of seconds"),
])
def test_bad_input_is_one_line_and_exit_2(cli, argv, fragment):
    code, out, err = cli("tui", *argv)
    assert code == 2
    assert err.startswith("llm-replay: error: ") and err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err and not out


def test_missing_file_in_a_run(cli, tmp_path):
    import shutil

    shutil.copytree(BEFORE, tmp_path / "broken")
    (tmp_path / "broken" / "requests.parquet").unlink()
    code, _, err = cli("tui", "broken")
    assert code == 2 and "broken: not a run directory (missing requests.parquet)" in err


def test_screenshot_without_a_terminal(cli, tmp_path):
    code, out, err = cli("tui", BEFORE, "--compare", AFTER, "--at", "4:16", "--screenshot", "shot.svg",
                         "--size", "100x30")
    assert code == 0, err
    svg = (tmp_path / "shot.svg").read_text()
    assert svg.startswith("<svg") and "incident" in svg and "4:16" in svg
    assert "shot.svg" in out


def _headless(stop):
    """Dashboard.run for tests: the same app, headless, until stop(app) says so (or 3 minutes)."""

    def run(self):
        async def go():
            async with self.run_test(size=(100, 30)) as pilot:
                for _ in range(1800):
                    await pilot.pause(0.1)
                    if stop(self) or not self.is_running:
                        break
                if self.is_running:
                    await pilot.press("right", "q")

        asyncio.run(go())

    return run


def _finished(app):
    return app.model.runs[0].live is None


def test_run_tui_watches_the_replay_to_a_finished_run(cli, tmp_path, monkeypatch):
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    monkeypatch.setattr(Dashboard, "run", _headless(_finished))
    code, out, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui")
    assert code == 0, err
    assert "run written to watched" in out
    # the same table as `run` once the dashboard has left the screen
    for label in ("TTFT p99", "SLO attainment", "percentiles cover", "verdict"):
        assert label in out
    assert sorted(p.name for p in (tmp_path / "watched").iterdir()) == sorted(
        ["config.yaml", "events.parquet", "requests.parquet", "summary.json", "ticks.parquet", "timing.json"])


def _no_dashboard(self):
    pytest.fail("the dashboard should not start")


@pytest.mark.parametrize("trace, fragment", [
    (TRACE + "oops,1\n", "trace.csv"),
    ("arrival_s,prompt\n0.1,30\n", "output"),
])
def test_run_tui_bad_trace_fails_before_the_dashboard(cli, tmp_path, monkeypatch, trace, fragment):
    (tmp_path / "trace.csv").write_text(trace)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    monkeypatch.setattr(Dashboard, "run", _no_dashboard)
    code, out, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui")
    assert code == 2 and err.startswith("llm-replay: error: ") and fragment in err and err.count("\n") == 1
    assert "Traceback" not in err and not out
    assert not (tmp_path / "watched").exists()


def test_run_tui_missing_trace_fails_before_the_dashboard(cli, tmp_path, monkeypatch):
    (tmp_path / "fleet.yaml").write_text(FLEET)
    monkeypatch.setattr(Dashboard, "run", _no_dashboard)
    code, _, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui")
    assert code == 2 and "trace.csv" in err and err.count("\n") == 1
    assert not (tmp_path / "watched").exists()


def test_run_tui_bad_out_fails_before_the_dashboard(cli, tmp_path, monkeypatch):
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    monkeypatch.setattr(Dashboard, "run", _no_dashboard)
    code, _, err = cli("run", "--config", "fleet.yaml", "--out", "taken", "--tui")
    assert code == 2 and "--out taken: already exists" in err and err.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["x"]


def test_a_failing_replay_is_exit_2_and_leaves_nothing(cli, tmp_path, monkeypatch):
    """A failure the child meets (here: a UserError raised by the replay) still reaches the user
    as one line after the dashboard closes, and nothing stays behind."""
    (tmp_path / "trace.csv").write_text(TRACE)
    scaled = FLEET.replace("replicas: 1,", "replicas: 1, autoscaler: {policy: 'tests.tui.failing_scaler:fails', "
                           "min_replicas: 1, max_replicas: 2},")
    (tmp_path / "fleet.yaml").write_text(scaled)
    monkeypatch.setattr(Dashboard, "run", _headless(lambda app: False))  # the app exits by itself
    code, _, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui", "--plugin", "tests.tui.failing_scaler")
    assert code == 2 and err == "llm-replay: error: tests.tui.failing_scaler:fails: the replay ran out of luck\n"
    assert not (tmp_path / "watched").exists()


def test_run_tui_bad_config_fails_before_the_dashboard(cli, tmp_path, monkeypatch):
    (tmp_path / "fleet.yaml").write_text("model: no-such-model\npools: [{name: a}]\n")
    monkeypatch.setattr(Dashboard, "run", lambda self: pytest.fail("the dashboard should not start"))
    code, _, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui")
    assert code == 2 and "no-such-model" in err and not (tmp_path / "watched").exists()


def test_quitting_early_stops_the_replay_and_leaves_nothing(cli, tmp_path, monkeypatch):
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    monkeypatch.setattr(Dashboard, "run", _headless(lambda app: True))  # quit at once
    code, _, err = cli("run", "--config", "fleet.yaml", "--out", "watched", "--tui")
    assert code == 130 and "nothing written" in err
    assert not (tmp_path / "watched").exists()
