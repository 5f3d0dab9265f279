"""The metric panel draws through Textual's line API from cached pieces; what it draws must be,
segment for segment (styles and their offsets included), what Textual draws from the panel's Text."""

from __future__ import annotations

import asyncio

from textual.content import Content
from textual.visual import Visual

from tests.tui.conftest import AFTER, BEFORE
from tui.app import make_app
from tui.widgets import Metrics


def _reference(widget: Metrics):
    content = Content.from_rich_text(widget.render(), console=widget.app.console)
    return Visual.to_strips(widget, content, widget.size.width, widget.size.height, widget.visual_style)


def _check(app, size, keys):
    async def run():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for key in [None, *keys]:
                if key is not None:
                    await pilot.press(key)
                    await pilot.pause()
                widget = app.query_one(Metrics)
                expected = _reference(widget)
                for y in range(widget.size.height):
                    got = list(widget.render_line(y))
                    want = list(expected[y]) if y < len(expected) else list(widget.render_line(y))
                    assert got == want, (key, y)
                    assert [s.style._meta for s in got] == [s.style._meta for s in want], (key, y)
    asyncio.run(run())


def test_metric_rows_match_textual_rendering():
    keys = ["right", "left", "home", "end", "pagedown", "p", "down", "down", "P", "b", "w", "n"]
    _check(make_app(BEFORE, at="4:05"), (80, 24), keys)
    _check(make_app(AFTER, at="4:16"), (160, 50), keys)


def test_compare_rows_match_textual_rendering():
    _check(make_app(BEFORE, compare=AFTER, at="4:16"), (120, 40), ["right", "home", "end", "p", "left", "pageup"])


def test_narrow_terminal_rows_match_textual_rendering():
    _check(make_app(BEFORE, at="1:00"), (40, 20), ["right", "end"])
