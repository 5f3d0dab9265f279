"""Every key of the dashboard, pressed through Textual's Pilot on the committed incident runs.
`test_every_binding_is_tested` keeps this table and Dashboard.BINDINGS in step."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from textual import events

from tests.tui.conftest import AFTER, BEFORE, screen_text
from tui.app import Dashboard, make_app
from tui.model import DEFAULT_SPEED, SPEEDS
from tui.screens import GotoScreen, HelpScreen, RequestsScreen

S = 1_000_000
TESTED_KEYS = {"space", "plus", "equals_sign", "minus", "right", "left", "shift+right", "shift+left", "pagedown",
               "pageup", "home", "end", "g", "b", "w", "n", "N", "p", "P", "f", "down", "up", "v", "d",
               "question_mark", "q",
               "l", "L", "r",  # tests/tui/test_review_views.py
               "o"}  # tests/tui/test_observed.py


def drive(app, script, size=(100, 30)):
    async def run():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(run())


def test_every_binding_is_tested():
    keys = {k for b in Dashboard.BINDINGS for k in b.key.split(",")}
    assert keys == TESTED_KEYS


@pytest.mark.parametrize("key, moved_s", [("right", 1), ("left", -1), ("shift+right", 60), ("shift+left", -60),
                                          ("pagedown", 192), ("pageup", -179)])
def test_seek_keys(key, moved_s):
    app = make_app(BEFORE, at="3:00")

    async def script(pilot):
        await pilot.press(key)
        # the fixture run spans 0:01 to 6:12: ten minutes either way stops at an end
        assert app.model.view.cursor_us == (180 + moved_s) * S

    drive(app, script)


def test_home_end():
    app = make_app(BEFORE, at="3:00")

    async def script(pilot):
        await pilot.press("end")
        assert app.model.view.cursor_us == app.model.runs[0].end_us
        await pilot.press("home")
        assert app.model.view.cursor_us == 1 * S  # the first tick ends at one second

    drive(app, script)


def test_play_pause_and_speed():
    app = make_app(BEFORE, at="1:00")

    async def script(pilot):
        view = app.model.view
        await pilot.press("plus")
        assert view.speed_index == DEFAULT_SPEED + 1
        await pilot.press("minus", "minus")
        assert view.speed_index == DEFAULT_SPEED - 1
        await pilot.press("equals_sign")
        assert view.speed_index == DEFAULT_SPEED
        await pilot.press("space")
        assert view.playing
        # one playback step of a second, driven here (the timer's own steps depend on the clock)
        before = view.cursor_us
        app.model.advance(1.0)
        assert view.cursor_us == before + SPEEDS[DEFAULT_SPEED] * S
        await pilot.press("space")
        assert not view.playing

    drive(app, script)


def test_playing_stops_at_the_end_and_restarts_from_the_start():
    app = make_app(BEFORE, at="6:10")

    async def script(pilot):
        await pilot.press("space")
        app.model.advance(10.0)
        assert app.model.view.cursor_us == app.model.runs[0].end_us and not app.model.view.playing
        await pilot.press("space")
        assert app.model.view.playing and app.model.view.cursor_us < 60 * S  # back near 0:01

    drive(app, script)


def test_goto_time():
    app = make_app(BEFORE)

    async def script(pilot):
        await pilot.press("g")
        assert isinstance(app.screen, GotoScreen)
        await pilot.press(*"4:3x", "enter")
        assert "expected a time" in screen_text(app)  # stays open with the error
        await pilot.press("backspace", "0", "enter")
        assert not isinstance(app.screen, GotoScreen)
        assert app.model.view.cursor_us == 270 * S

    drive(app, script)


def test_first_breach_and_worst_window():
    app = make_app(BEFORE, at="6:00")

    async def script(pilot):
        run = app.model.runs[0]
        slo = run.series["fleet"]["slo_attainment"]
        await pilot.press("b")
        # past the warm-up (by default the first metrics window: the breach at 0:06 is the start-up's)
        first = next(i for i, v in enumerate(slo) if v < 0.99 and run.t_us[i] >= run.window_us)
        assert app.model.view.cursor_us == run.t_us[first]
        assert "first SLO breach" in screen_text(app)
        await pilot.press("w")
        worst = min(range(len(slo)), key=lambda i: (slo[i] if slo[i] == slo[i] else 2, i))
        assert app.model.view.cursor_us == run.t_us[worst]
        assert "worst window" in screen_text(app)

    drive(app, script)


def test_next_and_previous_scaling_event():
    app = make_app(AFTER, at="0:10")

    async def script(pilot):
        await pilot.press("n")
        assert app.model.view.cursor_us == 256 * S  # hpa scales chat up at 4:16
        await pilot.press("n")
        assert app.model.view.cursor_us == 256 * S and "no scaling event after" in screen_text(app)
        await pilot.press("end", "N")
        assert app.model.view.cursor_us == 256 * S
        await pilot.press("N")
        assert "no scaling event before" in screen_text(app)

    drive(app, script)


def test_pool_keys():
    app = make_app(AFTER, at="3:00")

    async def script(pilot):
        view = app.model.view
        await pilot.press("p")
        assert view.scope == "chat" and "chat [2/4]" in screen_text(app)
        await pilot.press("p", "p", "p")
        assert view.scope == "fleet"
        await pilot.press("P")
        assert view.scope == "batch"
        await pilot.press("f")
        assert view.scope == "fleet"

    drive(app, script)


def test_metric_rows_scroll_when_they_do_not_fit():
    app = make_app(BEFORE, at="3:00")

    async def script(pilot):
        assert "↑↓ more metrics" in screen_text(app)
        assert "rejected/tick" not in screen_text(app)
        await pilot.press(*["down"] * 20)
        last = app.model.view.metric_offset
        assert 0 < last < 13 and "rejected/tick" in screen_text(app) and "0 below" in screen_text(app)
        await pilot.press("up")
        assert app.model.view.metric_offset == last - 1 and "rejected/tick" not in screen_text(app)

    drive(app, script, size=(80, 16))


def test_event_log_filter():
    app = make_app(AFTER, at="6:14")

    async def script(pilot):
        assert "preempt" in screen_text(app)
        await pilot.press("v")
        assert app.model.view.decisions_only
        text = screen_text(app)
        assert "scale_up" in text and "preempt " not in text
        await pilot.press("v")
        assert not app.model.view.decisions_only

    drive(app, script, size=(120, 40))


def test_help_lists_every_key_and_closes():
    app = make_app(BEFORE)

    async def script(pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for binding in Dashboard.BINDINGS:  # a long description drops its "(...)" aside
            assert binding.description.split(" (")[0] in text
        # all of it fits an 80x24 terminal: nothing to scroll to, nothing cut at the right
        assert app.screen.query_one("VerticalScroll").max_scroll_y == 0
        assert "quit" in text and "warm-up" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive(app, script, size=(80, 24))


def test_drill_down_key_and_quit():
    app = make_app(BEFORE, at="3:00")

    async def script(pilot):
        await pilot.press("d")
        assert isinstance(app.screen, RequestsScreen)
        await pilot.press("escape", "q")

    drive(app, script)
    assert app.return_code == 0 and not app.is_running


def test_mouse_click_and_wheel_seek_and_scroll():
    """Every entry of the help's mouse section: a click on the timeline or a chart puts the cursor
    at that time, the wheel on the timeline seeks by a minute, on the metrics scrolls them."""
    from tui.charts import time_of_column
    from tui.panels import LABEL_W, VALUE_W

    app = make_app(BEFORE)

    async def script(pilot):
        model = app.model
        timeline = app.query_one("#timeline")
        width = timeline.size.width
        await pilot.click("#timeline", offset=(width // 2, 0))
        model_at = model.view.cursor_us
        assert model_at == model.axis[np.searchsorted(model.axis, time_of_column(width // 2, 0, model.t_end, width))]
        await pilot.click("#metrics", offset=(LABEL_W, 0))  # the first chart column
        chart_w = app.query_one("#metrics").size.width - LABEL_W - VALUE_W - 2
        assert model.view.cursor_us == model.axis[np.searchsorted(model.axis, time_of_column(0, 0, model.t_end,
                                                                                              chart_w))]
        before = model.view.cursor_us
        await pilot.mouse_down("#metrics", offset=(2, 0))  # on a label: no seek
        assert model.view.cursor_us == before
        await pilot._post_mouse_events([events.MouseScrollDown], "#timeline")  # Pilot has no wheel helper
        await pilot.pause()
        assert model.view.cursor_us == before + 60 * S
        await pilot._post_mouse_events([events.MouseScrollUp], "#timeline")
        await pilot.pause()
        assert model.view.cursor_us == before

    drive(app, script, size=(120, 40))

    small = make_app(BEFORE, AFTER)

    async def scroll(pilot):
        await pilot._post_mouse_events([events.MouseScrollDown], "#metrics")
        await pilot.pause()
        assert small.model.view.metric_offset == 1  # 80x24 of two runs: the rows do not all fit
        await pilot._post_mouse_events([events.MouseScrollUp], "#metrics")
        await pilot.pause()
        assert small.model.view.metric_offset == 0

    drive(small, scroll, size=(80, 24))
