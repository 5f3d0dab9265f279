"""Live runs: the writer's files are the finished run's (so the dashboard shows the same thing
during and after), the dashboard opens a run still being written and follows it to its end."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from replay.fleet.live import LIVE_DIR, STATUS_FILE, LiveWriter
from replay.outputs.write import write_run
from replay.run import replay_trace
from tests.tui.conftest import pd_config, screen_text, tiny_config, tiny_trace
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.data import LiveFollower, load_run
from tui.model import Model
from tui.panels import METRICS


class Stop(Exception):
    pass


def live_until(out, ticks: int | None):
    """Replay the tiny trace into out/live/, flushing at every tick; stop after `ticks` ticks
    (the directory is then a run still being written) or run to the end. Returns (writer, result)."""
    from replay.fleet.cluster import plan_pools

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


def chunk_frames(live, name: str) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(d / f"{name}.parquet") for d in sorted(live.glob("chunk-*"))])


@pytest.mark.parametrize("config", [tiny_config, pd_config], ids=["one-pool", "prefill-decode"])
def test_the_chunks_are_the_finished_run(tmp_path, config):
    """Chunks of irregular sizes, concatenated, are the finished run's rows: ticks and events
    as they are, each request once (ended ones in chunks, the rest in the newest in-flight file),
    each first token once; for a prefill/decode fleet too (its prefill pool's ticks count the
    requests it prefilled)."""
    from replay.fleet.cluster import plan_pools

    trace, cfg = tiny_trace(), config()
    plans = plan_pools(cfg)
    writer = LiveWriter(tmp_path / "run", trace.frame, cfg, plans, min_interval_s=1e9)
    writer.start()
    n = []

    def on_tick(**kw):
        writer.on_tick(**kw)  # flushes the first tick only (then never by itself)
        n.append(1)
        if len(n) < 5 or len(n) % 7 == 0:
            writer.flush()

    result = replay_trace(trace, cfg, plans=plans, on_tick=on_tick)
    writer.flush()
    live = tmp_path / "run" / LIVE_DIR
    assert writer.seq == len(list(live.glob("chunk-*"))) > 5
    assert chunk_frames(live, "ticks").equals(result.ticks)
    assert chunk_frames(live, "events").equals(result.events)
    inflight = pl.read_parquet(live / f"inflight-{writer.seq:06d}.parquet")
    ended = chunk_frames(live, "requests")
    assert ended["status"].is_in(["finished", "rejected"]).all()
    assert pl.concat([ended, inflight]).sort("request_id").equals(result.requests)
    firsts = chunk_frames(live, "firsts")
    got = result.requests.filter(pl.col("first_token_us").is_not_null())
    assert firsts["request_id"].is_unique().all() and firsts.height == got.height
    assert firsts.sort("request_id").equals(got.select(firsts.columns))
    assert sorted(p.name for p in live.glob("inflight-*")) == [f"inflight-{k:06d}.parquet"
                                                               for k in (writer.seq - 1, writer.seq)]
    status = json.loads((live / STATUS_FILE).read_text())
    assert status["state"] == "running" and status["seq"] == writer.seq
    assert status["done_us"] == result.ticks["t_us"].max()


def _same_run(a, b) -> None:
    assert a.pools == b.pools and np.array_equal(a.t_us, b.t_us)
    for scope, series in b.series.items():
        for key, values in series.items():
            if values is None:
                assert a.series[scope][key] is None
            else:
                assert np.allclose(a.series[scope][key], values, equal_nan=True, rtol=1e-9), (scope, key)
    assert a.requests.sort("request_id").equals(b.requests.sort("request_id").select(a.requests.columns))
    assert a.events.equals(b.events)
    for x, y in zip(a.firsts(), b.firsts()):
        assert np.array_equal(x, y)


def test_the_follower_reads_only_new_chunks_and_keeps_the_finished_run(tmp_path, monkeypatch):
    """Polls read the chunks added since the last one; what they add up to is what a fresh read
    of the directory gives, and, once the finished run replaces live/, that run."""
    from replay.fleet.cluster import plan_pools

    trace, cfg = tiny_trace(), tiny_config()
    plans = plan_pools(cfg)
    out = tmp_path / "run"
    writer = LiveWriter(out, trace.frame, cfg, plans, min_interval_s=0.0, cost_factor=0.0)
    writer.start()
    read: list[int] = []
    original = LiveFollower._read_chunk
    monkeypatch.setattr(LiveFollower, "_read_chunk", lambda self, src, k: read.append(k) or original(self, src, k))
    follower = model = None

    def on_tick(**kw):
        nonlocal follower, model
        writer.on_tick(**kw)
        if writer.seq == 10:
            follower = LiveFollower(out)
            assert read == list(range(1, 11))
            model = Model([follower.data])
            model.view.following = False
            for spec in METRICS:
                model.column_values(model.runs[0], spec.key, 50, spec.how)
        elif writer.seq in (11, 25):
            read.clear()
            data = follower.poll()
            assert read == (list(range(11, 12)) if writer.seq == 11 else list(range(12, 26)))
            assert follower.poll() is None  # nothing new
            _same_run(data, load_run(out))
            assert data.live.done_us == writer.done_us
            model.set_runs([data])  # charts: the columns kept from before, the rest redone
            fresh = Model([load_run(out)])
            for spec in METRICS:
                assert np.array_equal(model.column_values(data, spec.key, 50, spec.how),
                                      fresh.column_values(fresh.runs[0], spec.key, 50, spec.how), equal_nan=True)

    result = replay_trace(trace, cfg, plans=plans, on_tick=on_tick)
    writer.flush()
    writer.status("writing")
    live_data = follower.poll()
    assert live_data.live.state == "writing" and live_data.end_us == result.ticks["t_us"].max()
    write_run(out, result, force=True)
    read.clear()
    final = follower.poll()
    assert final.live is None and read == []
    assert final.series is live_data.series  # kept, not read again
    _same_run(final, load_run(out))
    assert follower.poll() is None


def test_a_run_not_yet_flushed_opens_empty(tmp_path):
    trace, cfg = tiny_trace(), tiny_config()
    from replay.fleet.cluster import plan_pools

    LiveWriter(tmp_path / "run", trace.frame, cfg, plan_pools(cfg)).start()
    app = make_app(tmp_path / "run", follow=False)

    async def script(pilot):
        assert app.model.live and len(app.model.axis) == 0
        assert "live 0%" in screen_text(app)
        await pilot.press("right", "b", "w", "n", "p", "end", "d")
        await pilot.press("escape")

    drive(app, script)


def test_a_replay_still_compiling_says_so_and_for_how_long(tmp_path):
    """run --tui on a fresh install: the child compiles for a minute and a half before its first
    tick; the dashboard says it is compiling, not "live 0%"."""
    trace, cfg = tiny_trace(), tiny_config()
    from replay.fleet.cluster import plan_pools

    writer = LiveWriter(tmp_path / "run", trace.frame, cfg, plan_pools(cfg))
    writer.start()
    writer.status("compiling", compile_estimate_s=95)
    app = make_app(tmp_path / "run", follow=False)

    async def script(pilot):
        assert "compiling the engine (~95 s, once)" in screen_text(app)
        assert "live 0%" not in screen_text(app)

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
    failed = {"state": "failed", "error": "trace.csv line 9: bad"}
    body = json.loads((out / LIVE_DIR / STATUS_FILE).read_text()) | failed
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


class FakeClock:
    """The dashboard's clock, moved by hand: what the test asserts never depends on how fast the
    machine runs it (only how long the real timers take to fire, which `until` waits out)."""

    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def until(pilot, condition, limit_s: float = 60.0) -> None:
    for _ in range(int(limit_s / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    pytest.fail(f"not within {limit_s} s")


def test_new_data_waits_while_keys_come_but_not_for_long(tmp_path):
    """A live run's next data is shown once keys stop for INPUT_QUIET_S (its redraw would delay
    the next key), and within LIVE_DEFER_MAX_S however fast keys come."""
    from tui.app import INPUT_QUIET_S, LIVE_DEFER_MAX_S, RunUpdated

    out = tmp_path / "run"
    live_until(out, 10)
    live_until(tmp_path / "more", 20)
    newer = load_run(tmp_path / "more")
    clock = FakeClock(64.0)
    app = make_app(out, follow=False)
    app.clock = clock

    async def script(pilot):
        first = app.model.runs[0]
        await pilot.press("left")
        app.post_message(RunUpdated(0, newer))
        await pilot.pause()
        assert app.model.runs[0] is first  # a key just came: the data waits
        await pilot.pause(3 * INPUT_QUIET_S)  # however often its timer fires: no time passed
        assert app.model.runs[0] is first
        clock.t += 1.5 * INPUT_QUIET_S  # no key for longer than INPUT_QUIET_S: the data comes
        await until(pilot, lambda: app.model.runs[0] is newer)

        # keys every INPUT_QUIET_S / 4: the data waits, but never past LIVE_DEFER_MAX_S
        began = clock.t
        await pilot.press("right")
        app.post_message(RunUpdated(0, first))
        await pilot.pause()  # it arrived at `began`
        step = INPUT_QUIET_S / 4
        for k in range(1, int(LIVE_DEFER_MAX_S / step)):
            clock.t = began + k * step
            await pilot.press("right")
            await pilot.pause()
            assert app.model.runs[0] is newer, f"shown after {k * step:.3f} s of keys"
        clock.t = began + LIVE_DEFER_MAX_S + step / 2
        await pilot.press("right")
        await until(pilot, lambda: app.model.runs[0] is first)

    drive(app, script)


def test_data_shown_at_the_defer_limit_leaves_no_stale_timer(tmp_path):
    """The live-key race (bench_tui under load): data held while keys come is shown at the
    LIVE_DEFER_MAX_S limit by the next reload itself; the timer set for the earlier one must not
    fire after that on a key just pressed (it used to read the reset defer start, None, and the
    dashboard died with a TypeError)."""
    from tui.app import INPUT_QUIET_S, LIVE_DEFER_MAX_S, RunUpdated

    out = tmp_path / "run"
    live_until(out, 10)
    live_until(tmp_path / "more", 20)
    newer = load_run(tmp_path / "more")
    clock = FakeClock(64.0)
    app = make_app(out, follow=False)
    app.clock = clock

    async def script(pilot):
        first = app.model.runs[0]
        await pilot.press("left")
        app.post_message(RunUpdated(0, newer))  # a key just came: held, a timer set
        await pilot.pause()
        assert app.model.runs[0] is first
        clock.t += LIVE_DEFER_MAX_S + INPUT_QUIET_S / 4
        await pilot.press("left")  # keys still coming, but the limit has passed
        app.post_message(RunUpdated(0, first))
        # Under load the first timer may fire (and show `newer`) before `first` is posted, which
        # is then held as after any key: time moves on while waiting, so that it is shown too.
        def shown() -> bool:
            clock.t += INPUT_QUIET_S / 4
            return app.model.runs[0] is first and app._deferred_since is None

        await until(pilot, shown)
        await pilot.pause(3 * INPUT_QUIET_S)  # the earlier timer's time comes and goes
        assert app.is_running and app.model.runs[0] is first
        await pilot.press("right")
        assert app.is_running

    drive(app, script)


def test_a_first_open_slower_than_the_writer_still_reads_the_run(tmp_path, monkeypatch):
    """bench_tui under load: opening a live run of many chunks takes long enough that the writer
    drops the in-flight file named by the status read before them (it keeps the newest two);
    the in-flight requests are read first, so the open does not fail five times over."""
    from replay.outputs.schema import LIVE_DIR
    from tui.data import LiveFollower

    out = tmp_path / "run"
    live_until(out, 10)
    read_chunk = LiveFollower._read_chunk

    def slow(self, src, k):  # the writer moves on while the chunks are read
        for file in (out / LIVE_DIR).glob("inflight-*.parquet"):
            file.unlink()
        return read_chunk(self, src, k)

    monkeypatch.setattr(LiveFollower, "_read_chunk", slow)
    data = LiveFollower(out).data
    assert data.live is not None and len(data.t_us) == 10
