"""The observed overlay as the dashboard draws it: one value per chart column of a row's observed
signal (and, for the rows only an export brings, the replayed side from the scoring), the
columns where they part, the timeline's marks and the divergence table. Pure functions of a
Model; the overlay is the first run's (compare mode: the export is scored against the run, and
its line is drawn under both runs' rows of each chart)."""

from __future__ import annotations

import numpy as np
from rich.text import Text

from replay.cli.observed import divergence_figure as fig
from tui.charts import column_edges, columns_of, downsample
from tui.observed import SCORED_ONLY, SIGNALS
from tui.timefmt import fmt_time
from tui.views import workload_of

OBS_STYLE = "yellow"
PARTED_STYLE = "bold red"
MARK = ("≠", "bold yellow")


def overlay_of(model):
    """The model's overlay where the scope can have one (a pool or the fleet, not a workload)."""
    overlay = getattr(model, "observed", None)
    return None if overlay is None or workload_of(model.view.scope) is not None else overlay


def has_observed(model, key: str) -> bool:
    overlay = overlay_of(model)
    return overlay is not None and overlay.series(model.view.scope, key) is not None


def _columns(model, values: np.ndarray | None, tag: str, key: str, width: int, how: str) -> np.ndarray | None:
    overlay = overlay_of(model)
    if overlay is None or values is None:
        return None
    memo = (tag, model.view.scope, key, width, how, model.t_end)
    held = overlay._memo.get(memo)
    if held is None:
        reduce = "max" if how == "any" else how
        held = downsample(overlay.t_us, values.astype(np.float64), column_edges(0, model.t_end, width), reduce)
        overlay._memo[memo] = held
    return held


def observed_columns(model, key: str, width: int, how: str = "max") -> np.ndarray | None:
    overlay = overlay_of(model)
    return None if overlay is None else _columns(model, overlay.series(model.view.scope, key), "ocols", key, width, how)


def replayed_columns(model, key: str, width: int, how: str = "max") -> np.ndarray:
    """A row only an export brings (ITL, E2E quantiles): the replayed side from the scoring,
    as histogram_quantile over the rate window gives it (NaN until scored)."""
    overlay = overlay_of(model)
    values = None if overlay is None else overlay.replayed_series(model.view.scope, key)
    got = _columns(model, values, "rcols", key, width, how)
    return got if got is not None else np.full(max(width, 1), np.nan)


def parted_columns(model, key: str, width: int) -> np.ndarray | None:
    """Per column: whether any of its ticks is in a window where the two part (None until scored)."""
    overlay = overlay_of(model)
    marks = None if overlay is None else overlay.marks(model.view.scope, key)
    got = _columns(model, marks, "parted", key, width, "any")
    return None if got is None else np.nan_to_num(got, nan=0.0) > 0


def _at(model, values: np.ndarray | None) -> float | None:
    overlay = overlay_of(model)
    if overlay is None or values is None:
        return None
    i = overlay.index_at(model.view.cursor_us)
    if i is None or not np.isfinite(values[i]):
        return None
    return float(values[i])


def observed_at(model, key: str) -> float | None:
    overlay = overlay_of(model)
    return None if overlay is None else _at(model, overlay.series(model.view.scope, key))


def replayed_at(model, key: str) -> float | None:
    overlay = overlay_of(model)
    return None if overlay is None else _at(model, overlay.replayed_series(model.view.scope, key))


def parted_at(model, key: str) -> bool:
    overlay = overlay_of(model)
    marks = None if overlay is None else overlay.marks(model.view.scope, key)
    i = None if marks is None else overlay.index_at(model.view.cursor_us)
    return bool(marks[i]) if i is not None else False


def timeline_marks(model, width: int) -> list[int]:
    """The timeline's columns where some row of the scope parts from the export."""
    overlay = overlay_of(model)
    if overlay is None or not overlay.scored:
        return []
    memo = ("timeline", model.view.scope, width, model.t_end)
    if memo not in overlay._memo:
        hot = np.zeros(len(overlay.t_us), dtype=bool)
        for key in SIGNALS:
            marks = overlay.marks(model.view.scope, key)
            if marks is not None:
                hot |= marks
        overlay._memo[memo] = sorted(set(columns_of(overlay.t_us[hot], 0, model.t_end, width).tolist()))
    return overlay._memo[memo]


def scored_only_keys(model) -> tuple[str, ...]:
    """The rows only an export brings that it has a signal for in the scope."""
    return tuple(k for k in SCORED_ONLY if has_observed(model, k))


def divergence_rows(overlay) -> list[tuple[str, str, dict]]:
    """(signal, pool, its Divergence fields), in the section's order."""
    section = overlay.section or {}
    return [(signal, pool, d) for signal, pools in section.get("signals", {}).items() for pool, d in pools.items()]


HEADERS = ("signal", "pool", "MAPE", "r", "largest gap", "at", "observed", "replayed")


def divergence_cells(overlay) -> list[tuple[Text, ...]]:
    """The per-signal divergence as `validate RUN --observed` prints it (trace time only), a row
    whose MAPE is over the threshold in red."""
    out = []
    for signal, pool, d in divergence_rows(overlay):
        r = "-" if d["correlation"] is None else f"{d['correlation']:.2f}"
        at = "-" if d["gap_at_s"] is None else fmt_time(round(d["gap_at_s"] * 1e6))
        style = "red" if d["mape"] is not None and d["mape"] > overlay.threshold else ""
        cells = (signal, pool, fig(d["mape"], pct=True), r, fig(d["gap"]), at, fig(d["observed_at_gap"]),
                 fig(d["replayed_at_gap"]))
        out.append(tuple(Text(c, style, justify="left" if i < 2 else "right") for i, c in enumerate(cells)))
    return out


def divergence_title(overlay) -> Text:
    files = ", ".join(overlay.files)
    t = Text(f" observed vs replayed ", "bold reverse")
    if overlay.section is not None:
        t.append(f"  {files}: {overlay.section['window_s']:g} s windows; marked where they part by more than "
                 f"{overlay.threshold:.0%}")
    elif overlay.error is not None:
        t.append(f"  {files}: not scored: {overlay.error}", "red")
    else:
        t.append(f"  {files}: scored when the replay ends (the observed line is drawn meanwhile)", "italic")
    return t
