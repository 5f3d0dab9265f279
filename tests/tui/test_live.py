"""Live runs: the writer's files are the finished run's (so the dashboard shows the same thing
during and after), the dashboard opens a run still being written and follows it to its end."""

from __future__ import annotations

import json

import polars as pl

from replay.live import LIVE_DIR, STATUS_FILE, LiveWriter
from replay.outputs import write_run
from replay.run import replay_trace
from tests.tui.conftest import screen_text, tiny_config, tiny_trace
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.data import load_run


class Stop(Exception):
    pass


def live_until(out, ticks: int | None):
    """Replay the tiny trace into out/live/, flushing at every tick; stop after `ticks` ticks
    (the directory is then a run still being written) or run to the end. Returns (writer, result)."""
    from replay.cluster import plan_pools

    trace, cfg = tiny_trace(), tiny_config()
    plans = plan_pools(cfg)
    writer = LiveWriter(out, trace.frame, cfg, plans, min_interval_s=0.0, cost_factor=0.0)
    writer.start()
    seen = []

    def on_tick(**kw):
        writer.on_tick(**kw)
        seen.append(kw["t_us"])
        if ticks is not None and len(seen) >= ticks:
            raise Stop

    try:
        result = replay_trace(trace, cfg, plans=plans, on_tick=on_tick)
    except Stop:
        return writer, None
    return writer, result


def test_the_last_flush_is_the_finished_run(tmp_path):
    writer, result = live_until(tmp_path / "run", None)
    writer.flush()
    live = tmp_path / "run" / LIVE_DIR
    assert pl.read_parquet(live / "ticks.parquet").equals(result.ticks)
    assert pl.read_parquet(live / "events.parquet").equals(result.events)
    assert pl.read_parquet(live / "requests.parquet").equals(result.requests)
    status = json.loads((live / STATUS_FILE).read_text())
    assert status["state"] == "running" and status["seq"] == writer.seq and status["done_us"] == result.ticks["t_us"].max()


def test_a_run_not_yet_flushed_opens_empty(tmp_path):
    trace, cfg = tiny_trace(), tiny_config()
    from replay.cluster import plan_pools

    LiveWriter(tmp_path / "run", trace.frame, cfg, plan_pools(cfg)).start()
    app = make_app(tmp_path / "run", follow=False)

    async def script(pilot):
        assert app.model.live and len(app.model.axis) == 0
        assert "live 0%" in screen_text(app)
        await pilot.press("right", "b", "w", "n", "p", "end", "d")
        await pilot.press("escape")

    drive(app, script)


def test_the_dashboard_follows_a_run_being_written_to_its_end(tmp_path):
    out = tmp_path / "run"
    live_until(out, 20)
    data = load_run(out)
    assert data.live.state == "running" and data.end_us == 20_000_000
    app = make_app(out, poll_s=0.02)
    _, final = live_until(tmp_path / "other", None)

    async def script(pilot):
        model = app.model
        assert model.live and model.view.following and model.view.cursor_us == 20_000_000
        assert "live" in screen_text(app)
        await pilot.press("left")  # looking back stops following
        assert not model.view.following and model.view.cursor_us == 19_000_000
        await pilot.press("end")
        assert model.view.following
        write_run(out, final, force=True)  # the finished run replaces the directory, live/ with it
        for _ in range(200):
            await pilot.pause(0.02)
            if model.runs[0].live is None:
                break
        assert model.runs[0].live is None and not model.live
        assert model.runs[0].end_us == final.ticks["t_us"].max()
        assert model.view.cursor_us == model.runs[0].end_us  # it was following: now on the last tick
        assert "live" not in screen_text(app)

    drive(app, script)
    assert not (out / LIVE_DIR).exists()


def test_a_failed_replay_shows_its_error(tmp_path):
    out = tmp_path / "run"
    live_until(out, 5)
    body = json.loads((out / LIVE_DIR / STATUS_FILE).read_text()) | {"state": "failed", "error": "trace.csv line 9: bad"}
    (out / LIVE_DIR / STATUS_FILE).write_text(json.dumps(body))
    app = make_app(out, follow=False)

    async def script(pilot):
        assert "replay failed: trace.csv line 9: bad" in screen_text(app)
        assert not app.model.live

    drive(app, script, size=(120, 30))


def test_live_files_beside_an_old_run_win(tmp_path, one_pool_run):
    """--force over an old run: while the new one replays, DIR/live/ is what the dashboard shows."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(one_pool_run, out)
    live_until(out, 7)
    assert load_run(out).live is not None and load_run(out).end_us == 7_000_000
