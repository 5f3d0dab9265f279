"""Charts as text: a metric over time, downsampled to the columns it has, drawn with block
characters. Pure numpy and rich; a chart never holds more than `width` values, whatever the run's
length. Times are int64 microseconds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.text import Text

BLOCKS = " ▁▂▃▄▅▆▇█"


def column_edges(t0_us: int, t1_us: int, width: int) -> np.ndarray:
    """width + 1 times; column i covers (edges[i], edges[i + 1]]."""
    return np.linspace(t0_us, t1_us, max(width, 1) + 1).round().astype(np.int64)


def column_of(t_us: int, t0_us: int, t1_us: int, width: int) -> int:
    """The column whose span holds t (the first for t at or before t0)."""
    if t1_us <= t0_us or width <= 1:
        return 0
    return int(np.clip(np.ceil((t_us - t0_us) / (t1_us - t0_us) * width) - 1, 0, width - 1))


def columns_of(t_us: np.ndarray, t0_us: int, t1_us: int, width: int) -> np.ndarray:
    """column_of for many times at once."""
    t = np.asarray(t_us, np.float64)
    if t1_us <= t0_us or width <= 1:
        return np.zeros(len(t), np.int64)
    return np.clip(np.ceil((t - t0_us) / (t1_us - t0_us) * width) - 1, 0, width - 1).astype(np.int64)


def time_of_column(col: int, t0_us: int, t1_us: int, width: int) -> int:
    """The end of column col's span: where a click on that column puts the cursor."""
    col = min(max(col, 0), max(width, 1) - 1)
    return int(round(t0_us + (t1_us - t0_us) * (col + 1) / max(width, 1)))


def downsample(t_us: np.ndarray, values: np.ndarray, edges: np.ndarray, how: str = "max") -> np.ndarray:
    """One value per column: the max (or min) of the ticks in its span, so a peak (or a dip in
    SLO attainment) is never averaged away; a column narrower than a tick takes the tick that
    covers it. NaN where nothing is known (past the run's end, a window with no request)."""
    width = len(edges) - 1
    out = np.full(width, np.nan)
    if not len(t_us):
        return out
    lo = np.searchsorted(t_us, edges[:-1], side="right")
    hi = np.searchsorted(t_us, edges[1:], side="right")
    full = hi > lo
    if full.any():
        # Spans are consecutive (hi[i] == lo[i + 1]), so each non-empty span runs from its start
        # to the next non-empty span's start: exactly what reduceat reduces, once cut at hi[-1].
        vals = values[: hi[full][-1]].astype(np.float64)
        reduce = np.fmax if how == "max" else np.fmin
        out[full] = reduce.reduceat(vals, lo[full])
    inside = ~full & (hi < len(t_us))
    out[inside] = values[hi[inside]]
    return out


def levels(values: np.ndarray, top: float, rows: int) -> np.ndarray:
    """Eighths of a character cell per column, 0..8 * rows; a value above zero shows at least one."""
    if not np.isfinite(top) or top <= 0:
        top = 1.0
    v = np.nan_to_num(values, nan=0.0)
    lv = np.clip(np.round(v / top * 8 * rows), 0, 8 * rows).astype(np.int64)
    lv[(v > 0) & (lv == 0)] = 1
    return lv


def bar_cells(values: np.ndarray, top: float, rows: int, style: str = "cyan",
              col_styles: list[str | None] | None = None) -> list[tuple[list[str], list[str]]]:
    """`rows` lines of (characters, styles), one per column, top line first, without a cursor;
    unknown values (NaN) as a dim dot on the bottom line."""
    lv = levels(values, top, rows)
    unknown = np.flatnonzero(np.isnan(values)).tolist()
    styles = [(s or style) for s in col_styles] if col_styles else [style] * len(lv)
    lines = []
    for r in range(rows - 1, -1, -1):
        chars = [BLOCKS[c] for c in np.clip(lv - 8 * r, 0, 8).tolist()]
        line_styles = list(styles)
        if r == 0:
            for i in unknown:
                chars[i], line_styles[i] = "·", "grey30"
        lines.append((chars, line_styles))
    return lines


def cursor_cell(char: str, style: str, cursor_style: str = "reverse") -> str:
    """The style of the cursor's cell: the cell's own, reversed; a blank cell shaded instead."""
    return f"{style} {cursor_style}" if char != " " else "on grey35"


def cells_text(chars: Sequence[str], styles: Sequence[str], cursor: int | None = None,
               cursor_style: str = "reverse") -> Text:
    """One chart line as Text, the cursor column (if any) in cursor_style. Runs of one style are
    one span: a frame of charts is a few hundred spans, not one per cell."""
    if cursor is not None and 0 <= cursor < len(chars):
        styles = list(styles)
        styles[cursor] = cursor_cell(chars[cursor], styles[cursor], cursor_style)
    text = Text()
    start = 0
    for i in range(1, len(chars) + 1):
        if i == len(chars) or styles[i] != styles[start]:
            text.append("".join(chars[start:i]), styles[start])
            start = i
    return text


def bars(values: np.ndarray, top: float, rows: int, cursor: int | None, style: str = "cyan",
         col_styles: list[str | None] | None = None, cursor_style: str = "reverse") -> list[Text]:
    """`rows` lines of block characters, top line first; the cursor column drawn in cursor_style;
    unknown values (NaN) as a dim dot on the bottom line."""
    return [cells_text(chars, styles, cursor, cursor_style)
            for chars, styles in bar_cells(values, top, rows, style, col_styles)]


def chart_top(*arrays: np.ndarray, fixed: float | None = None) -> float:
    """The value the chart's full height stands for: fixed (1.0 for shares), else the largest."""
    if fixed is not None:
        return fixed
    peaks = [float(np.nanmax(a)) for a in arrays if a is not None and len(a) and not np.isnan(a).all()]
    return max(peaks) if peaks and max(peaks) > 0 else 1.0
