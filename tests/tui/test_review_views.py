"""The incident-review views (tui/views.py) through Pilot on the committed incident runs, whose pool
layouts differ: before has one pool 'shared', after has 'chat' and 'docs' (batch goes to docs)."""

from __future__ import annotations

import numpy as np
import polars as pl

from tests.tui.conftest import AFTER, BEFORE, screen_text
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.data import load_run
from tui.model import Model
from tui.panels import VALUE_W, ChartRow, event_lines, metric_rows
from tui.screens import ReplicasScreen

S = 1_000_000


def test_workload_keys_cycle_through_the_labels_of_either_run():
    app = make_app(BEFORE, compare=AFTER, at="4:16")

    async def script(pilot):
        seen = []
        for _ in range(4):
            await pilot.press("l")
            seen.append(app.model.view.scope)
        assert seen == ["workload:batch", "workload:chat", "workload:docs", "fleet"]
        await pilot.press("L")
        assert app.model.view.scope == "workload:docs"
        assert "workload docs [3/3]" in screen_text(app)

    drive(app, script)


def test_compare_chat_before_vs_after_across_pool_layouts():
    """The flagship comparison: 'chat' is a pool of after only, but a workload of both runs."""
    app = make_app(BEFORE, compare=AFTER, at="4:16")

    async def script(pilot):
        await pilot.press("p")  # the pool 'chat' (after's first): before has no such pool
        assert app.model.view.scope == "chat"
        assert "incident-before has no pool 'chat'" in screen_text(app)
        await pilot.press("f", "l", "l")
        assert app.model.view.scope == "workload:chat"
        text = screen_text(app)
        assert "has no pool" not in text and "has no requests" not in text
        assert "TTFT p99 (window)" in text and "TPOT p99 (window)" in text
        before, after = (app.model.value_at(run, "ttft_p99_ms") for run in app.model.runs)
        assert before is not None and after is not None and before > after  # the fix helped chat

    drive(app, script, size=(120, 40))


def test_workload_values_are_the_requests_of_that_label():
    run = load_run(BEFORE)
    model = Model([run], at_us=250 * S)
    model.view.scope = "workload:chat"
    t = model.view.cursor_us
    chat = run.requests.filter(pl.col("workload") == "chat")
    ttft = chat.filter(pl.col("first_token_us").is_between(t - run.window_us + 1, t))["ttft_us"].to_numpy() / 1e3
    assert model.value_at(run, "ttft_p99_ms") == np.percentile(ttft, 99)
    arrived = chat.filter(pl.col("arrival_us").is_between(t - run.tick_us + 1, t)).height
    assert model.value_at(run, "arrivals_per_s") == arrived / (run.tick_us / 1e6)
    ended = chat.filter((pl.col("status") != "unfinished")).with_columns(
        e=pl.coalesce("finished_us", "arrival_us")).filter(pl.col("e").is_between(t - run.window_us + 1, t))
    assert model.value_at(run, "slo_attainment") == ended["slo_met"].mean()


def test_replica_view_shows_each_replica_and_follows_the_cursor():
    app = make_app(BEFORE, at="4:00")

    async def script(pilot):
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ReplicasScreen)
        run = app.model.runs[0]
        t = app.model.view.cursor_us
        text = screen_text(app)
        assert "replicas of pool shared" in text and "at 4:00" in text
        req = run.requests.filter(pl.col("pool") == "shared")
        for replica in req["replica"].drop_nulls().unique().to_list():
            mine = req.filter(pl.col("replica") == replica)
            queued = mine.filter((pl.col("arrival_us") <= t)
                                 & ~(pl.col("first_scheduled_us") <= t).fill_null(False)).height
            running = mine.filter((pl.col("first_scheduled_us") <= t)
                                  & ~(pl.col("finished_us") <= t).fill_null(False)).height
            line = next(x for x in text.splitlines() if x.strip().startswith(f"r{replica} ") and "queue" in x)
            assert line.split("queue")[1].split()[1] == str(queued)
            assert line.split("running")[1].split()[1] == str(running)
        await pilot.press("shift+right")  # the dashboard's seek keys work here and redraw it
        await pilot.pause()
        assert "at 5:00" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ReplicasScreen)

    drive(app, script, size=(120, 30))


def test_replica_view_in_compare_mode_names_the_run_without_the_pool():
    app = make_app(AFTER, compare=BEFORE, at="4:00")

    async def script(pilot):
        await pilot.press("p", "r")  # after's pool 'chat'
        await pilot.pause()
        text = screen_text(app)
        assert "replicas of pool chat" in text and "incident-before has no pool 'chat'" in text

    drive(app, script, size=(120, 30))


def test_first_breach_skips_the_warm_up():
    run = load_run(BEFORE)
    slo = run.series["fleet"]["slo_attainment"]
    early = run.t_us[np.flatnonzero(slo < 0.99)[0]]
    assert early < run.window_us  # the start-up transient the warm-up is for
    for warmup_s, least in ((None, run.window_us), (0, 0), (120, 120 * S)):
        app = make_app(BEFORE, at="6:00", warmup_s=warmup_s)
        assert app.model.jump_first_breach()
        at = app.model.view.cursor_us
        assert at >= least and slo[run.index_at(at)] < 0.99
        assert not (slo[(run.t_us >= least) & (run.t_us < at)] < 0.99).any()
    assert make_app(BEFORE, warmup_s=0).model.jump_first_breach() and early == run.t_us[run.index_at(early)]


def test_values_and_event_texts_show_whole_past_120_columns():
    run = load_run(BEFORE)
    other = load_run(AFTER)
    for r, scale in ((run, 1000.0), (other, 3000.0)):  # dollars with more digits than VALUE_W holds
        for key in ("cost_per_mtok_out_usd", "cost_per_mtok_cum_usd"):
            r.series["fleet"][key] = r.series["fleet"][key] * scale
    model = Model([run, other], at_us=250 * S)

    def cost_value(width):
        rows = [x for x in metric_rows(model, width, 60) if isinstance(x, ChartRow) and x.value is not None]
        return rows[[x.label.strip() for x in rows].index("$/M out tok (win)") + 1].value.plain.strip()

    whole = cost_value(200)
    assert whole.startswith("$") and whole.count("$") == 2 and whole.endswith("%")  # value, cum, delta
    assert len(whole) > VALUE_W + 1
    assert cost_value(120) == whole[:len(cost_value(120))] and len(cost_value(120)) < len(whole)
    # a long pool name: cut to 7 columns up to 120, whole on a wider terminal
    run.events = run.events.with_columns(pool=pl.lit("shared-long-pool"))
    run._memo.clear()
    one = Model([run], at_us=250 * S)
    assert all("shared-long-pool" not in x.plain for x in event_lines(one, 120, 5))
    assert any("shared-long-pool" in x.plain for x in event_lines(one, 160, 5))
