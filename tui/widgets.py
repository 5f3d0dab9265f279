"""Thin widgets: each draws one panel function of the app's Model at its own size; the two with a
time axis turn a mouse click into a seek."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.content import Content
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import Widget

from tui import panels
from tui.charts import time_of_column


class Panel(Widget):
    """Draws `panel(model, width, height)` (a list of lines, or one line)."""

    def __init__(self, panel, *, id: str | None = None):
        super().__init__(id=id)
        self.panel = panel

        self._lines: list[Text] | None = None
        self._drawn_for = None

    def _draw(self) -> list[Text]:
        w, h = self.size.width, self.size.height
        out = self.panel(self.app.model, w, h)
        return (out if isinstance(out, list) else [out])[:h]

    def redraw(self) -> None:
        """Draw again from the model; Textual repaints the panel only when what it shows changed."""
        lines = self._draw()
        drawn_for = (self.size, [(t.plain, str(t.style), t._spans) for t in lines])
        if drawn_for != self._drawn_for:
            self._lines, self._drawn_for = lines, drawn_for
            self.refresh()

    def render(self) -> Text:
        lines = self._lines if self._lines is not None and self._drawn_for[0] == self.size else self._draw()
        self._lines = None  # a repaint Textual asks for itself (a resize) draws afresh
        text = Text("\n").join(lines)
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
    """The metric rows; a click on a chart puts the cursor at that column's time.

    A seek moves only the cursor's column and the values at it, so the rows are drawn through
    Textual's line API from pieces kept between frames: each piece (label, chart line, value) is
    turned into segments the way Textual turns the whole panel's Text into segments (the same
    Content rendering, the same styles, each segment's style carrying its offset in the panel as
    Textual's text selection wants), and the cursor's cell is cut into the chart line's segments.
    The result is segment for segment what Panel.render would give (tests/tui/test_fast_render.py)."""

    def __init__(self, *, id: str | None = None):
        super().__init__(panels.metric_rows, id=id)
        self._strips: list[Strip] | None = None
        self._strips_for = None
        self._pieces: dict = {}

    def redraw(self) -> None:
        self._strips = None
        self.refresh()

    def render(self) -> Text:
        """The whole panel as one Text (what the line API above reproduces)."""
        text = Text("\n").join(row.text() if isinstance(row, panels.ChartRow) else row for row in self._draw())
        text.no_wrap = True
        text.overflow = "crop"
        return text

    def render_line(self, y: int) -> Strip:
        strips = self._frame()
        if y < len(strips):
            return strips[y]
        return Strip.blank(self.size.width, self.visual_style.rich_style)

    def _frame(self) -> list[Strip]:
        style = self.visual_style
        key = (self.size, style)
        if self._strips is not None and self._strips_for == key:
            return self._strips
        if self._strips_for is None or self._strips_for != key:
            self._pieces.clear()
        elif len(self._pieces) > 20_000:
            self._pieces.clear()
        self._strips_for = key
        rows = self._draw()
        width = self.size.width
        if any((row.text() if isinstance(row, panels.ChartRow) else row).cell_len > width for row in rows):
            # a line too long folds onto the next: leave that to Textual
            text = Text("\n").join(row.text() if isinstance(row, panels.ChartRow) else row for row in rows)
            self._strips = Visual.to_strips(self, Content.from_rich_text(text, console=self.app.console), width,
                                            self.size.height, style)
            return self._strips
        self._strips = [self._row_strip(row, y) for y, row in enumerate(rows)]
        return self._strips

    def _segments(self, key, text: Text, x0: int, y: int) -> list[Segment]:
        """`text`'s segments as they would be at (x0, y) of the panel, cached by `key`."""
        held = self._pieces.get((key, x0, y))
        if held is None:
            line = Text()  # as a line of the panel's Text (Text.join): its own style becomes a span
            line.append_text(text)
            content = Content.from_rich_text(line, console=self.app.console)
            held = []
            for strip in Visual.to_strips(self, content, max(self.size.width, 1), None, self.visual_style):
                held += _moved(list(strip), x0, y)
            self._pieces[(key, x0, y)] = held
        return held

    def _row_strip(self, row, y: int) -> Strip:
        if not isinstance(row, panels.ChartRow):
            return Strip(self._segments(("text", row.plain, str(row.style), tuple(row._spans)), row, 0, y))
        x = panels.LABEL_W
        segments = list(self._segments(("label", row.label, row.base), Text(row.label, row.base), 0, y))
        chart = Text(style=row.base)
        chart.append_text(row.chart())
        whole = self._segments(("chart", row.cells, row.base), chart, x, y)
        width = len(row.cells[0])
        c = row.cursor
        if 0 <= c < width:
            at = x
            for n, seg in enumerate(whole):  # the segment holding the cursor's cell: cut it in three
                if at + len(seg.text) > x + c:
                    cut = x + c - at
                    segments += whole[:n]
                    if cut:
                        segments.append(Segment(seg.text[:cut], seg.style))
                    cell = Text(style=row.base)
                    cell.append(row.cells[0][c], row.cursor_style())
                    segments += self._segments(("cell", cell.plain, row.base, cell._spans[0].style), cell, x + c, y)
                    if seg.text[cut + 1:]:
                        segments += _moved([Segment(seg.text[cut + 1:], seg.style)], x + c + 1, y)
                    segments += whole[n + 1:]
                    break
                at += len(seg.text)
        else:
            segments += whole
        if row.value is not None:
            value = Text(style=row.base)
            value.append_text(row.value)
            key = ("value", value.plain, row.base, tuple(value._spans))
            segments += self._segments(key, value, x + width, y)
        return Strip(segments)

    def on_click(self, event: events.Click) -> None:
        chart_w = max(self.size.width - panels.LABEL_W - panels.value_width(self.size.width) - 2, 4)
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


_OFFSETS: dict = {}


def _moved(segments: list[Segment], x0: int, y: int) -> list[Segment]:
    """Segments as Textual renders them from x0 on line y: each style's meta holds the segment's
    offset in the widget (what its text selection reads)."""
    out = []
    for text, style, control in segments:
        meta = _OFFSETS.get((x0, y))
        if meta is None:
            meta = _OFFSETS[(x0, y)] = Style.from_meta({"offset": (x0, y)})
        out.append(Segment(text, style + meta if style is not None else style, control))
        x0 += len(text)
    return out
