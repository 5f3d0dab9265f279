"""Thin widgets: each draws one panel function of the app's Model at its own size; the two with a
time axis turn a mouse click into a seek."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widget import Widget

from tui import panels
from tui.charts import time_of_column


class Panel(Widget):
    """Draws `panel(model, width, height)` (a list of lines, or one line)."""

    def __init__(self, panel, *, id: str | None = None):
        super().__init__(id=id)
        self.panel = panel

    def render(self) -> Text:
        w, h = self.size.width, self.size.height
        out = self.panel(self.app.model, w, h)
        lines = out if isinstance(out, list) else [out]
        text = Text("\n").join(lines[:h])
        text.no_wrap = True
        text.overflow = "crop"
        return text


def header(model, width, height):
    return panels.header_text(model, width)


def hints(model, width, height):
    return panels.hint_line(model, width)


def timeline(model, width, height):
    return panels.timeline_lines(model, width)


class Timeline(Panel):
    """Click (or wheel) to seek: the bar spans the whole run."""

    def __init__(self, *, id: str | None = None):
        super().__init__(timeline, id=id)

    def on_click(self, event: events.Click) -> None:
        model = self.app.model
        self.app.seek_to(time_of_column(event.x, 0, model.t_end, self.size.width))

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.app.action_seek(60)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.app.action_seek(-60)


class Metrics(Panel):
    """The metric rows; a click on a chart puts the cursor at that column's time."""

    def __init__(self, *, id: str | None = None):
        super().__init__(panels.metric_lines, id=id)

    def on_click(self, event: events.Click) -> None:
        chart_w = max(self.size.width - panels.LABEL_W - panels.VALUE_W - 2, 4)
        col = event.x - panels.LABEL_W
        if 0 <= col < chart_w:
            self.app.seek_to(time_of_column(col, 0, self.app.model.t_end, chart_w))

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.app.action_scroll_metrics(1)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.app.action_scroll_metrics(-1)


class Events(Panel):
    def __init__(self, *, id: str | None = None):
        super().__init__(panels.event_lines, id=id)
