"""Compare mode: two runs on one time axis, the differences marked."""

from __future__ import annotations

import numpy as np

from tests.tui.conftest import AFTER, BEFORE, screen_text
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.panels import METRICS, _delta, _diff_styles

S = 1_000_000


def test_one_axis_for_both_runs():
    app = make_app(BEFORE, compare=AFTER, at="6:12")
    model = app.model
    before, after = model.runs
    assert model.axis[-1] == max(before.end_us, after.end_us) == 374 * S
    assert set(before.t_us) | set(after.t_us) == set(model.axis)
    assert model.scopes == ["fleet", "chat", "docs", "batch"]  # the union: 'shared' is the before's one pool
    assert model.value_at(before, "waiting") == before.series["fleet"]["waiting"][-1]
    model.seek_to(374 * S)
    assert model.value_at(before, "waiting") is None  # past the before run's end


def test_compare_screen_shows_both_and_the_change():
    app = make_app(BEFORE, compare=AFTER, at="5:00")

    async def script(pilot):
        text = screen_text(app)
        assert "incident-before vs incident-after" in text
        assert "  incident-after" in text  # the second run's row under each metric
        assert "pt" in text or "%" in text
        await pilot.press("p")  # chat: the before run has no such pool
        assert "incident-before has no pool 'chat'" in screen_text(app)
        await pilot.press("f", "d")
        screen = app.screen
        await pilot.press("c")
        assert screen.run_index == 1 and "incident-after" in screen_text(app)

    drive(app, script, size=(120, 40))


def test_worse_is_red_and_better_green():
    slo = next(m for m in METRICS if m.key == "slo_attainment")
    queue = next(m for m in METRICS if m.key == "waiting")
    assert _delta(slo, 0.6, 0.9).style.startswith("green") and "+30.0pt" in _delta(slo, 0.6, 0.9).plain
    assert _delta(queue, 10, 20).style.startswith("red")
    styles = _diff_styles(queue, np.array([10.0, 10.0, 10.0, np.nan]), np.array([10.0, 30.0, 2.0, 5.0]))
    assert styles == [None, "red", "green", None]
