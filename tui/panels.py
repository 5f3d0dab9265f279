"""The dashboard's panels as pure functions of a Model and a size, returning rich Text: the same
input always draws the same picture (snapshot tests, --screenshot). Widgets only call these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
from rich.text import Text

from tui.charts import bar_cells, cells_text, chart_top, column_of, columns_of, cursor_cell
from tui.data import FLEET, RunData
from tui.model import SPEEDS, Model
from tui.observed_view import (MARK, OBS_STYLE, PARTED_STYLE, observed_at, observed_columns, overlay_of, parted_at,
                               parted_columns, scored_only_keys, timeline_marks)
from tui.timefmt import fmt_duration_ms, fmt_time
from tui.views import workload_of

LABEL_W = 18
VALUE_W = 20
# Past this width the value column grows (up to VALUE_W_MAX), so a value and its compare-mode
# delta show whole instead of cut at VALUE_W; up to it the layout is the one always drawn.
WIDE = 120
VALUE_W_MAX = 40
RUN_STYLES = ("cyan", "magenta")


def _num(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.1f}"


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _usd(v: float) -> str:
    return f"${v:,.2f}"


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    fmt: Callable[[float], str]
    how: str = "max"  # how a chart column reduces its ticks
    better: int = 0  # -1: lower is better; +1: higher is; 0: neither
    top: float | None = None  # fixed full scale (shares)


METRICS = (
    MetricSpec("waiting", "queue (waiting)", _num, better=-1),
    MetricSpec("running", "running", _num),
    MetricSpec("kv_usage", "KV cache used", _pct, top=1.0),
    MetricSpec("gpus", "replicas, GPUs", _num),
    MetricSpec("gpu_busy", "GPU-Util misleads", _pct, top=1.0),
    MetricSpec("arrivals_per_s", "requests/s", _num),
    MetricSpec("prompt_tokens_per_s", "prompt tok/s", _num),
    MetricSpec("output_tokens_per_s", "output tok/s", _num),
    MetricSpec("ttft_p50_ms", "TTFT p50 (window)", fmt_duration_ms, better=-1),
    MetricSpec("ttft_p99_ms", "TTFT p99 (window)", fmt_duration_ms, better=-1),
    MetricSpec("slo_attainment", "SLO met (window)", _pct, how="min", better=1, top=1.0),
    MetricSpec("cost_per_mtok_out_usd", "$/M out tok (win)", _usd, better=-1),
    MetricSpec("preemptions", "preemptions/tick", _num, better=-1),
    MetricSpec("rejected", "rejected/tick", _num, better=-1),
)
# The per-workload view (tui/views.py): what requests.parquet gives for one label, fleet-wide.
WORKLOAD_METRICS = (
    MetricSpec("arrivals_per_s", "requests/s", _num),
    MetricSpec("finished_per_s", "finished/s", _num),
    MetricSpec("ttft_p50_ms", "TTFT p50 (window)", fmt_duration_ms, better=-1),
    MetricSpec("ttft_p99_ms", "TTFT p99 (window)", fmt_duration_ms, better=-1),
    MetricSpec("tpot_p50_ms", "TPOT p50 (window)", fmt_duration_ms, better=-1),
    MetricSpec("tpot_p99_ms", "TPOT p99 (window)", fmt_duration_ms, better=-1),
    MetricSpec("slo_attainment", "SLO met (window)", _pct, how="min", better=1, top=1.0),
    MetricSpec("rejected_per_s", "rejected/s", _num, better=-1),
)


# Rows only an export brings (tui/observed.py SCORED_ONLY): the run's ticks have no ITL or E2E
# quantile; with an export both sides come from its scoring (histogram_quantile per rate window).
OBSERVED_METRICS = (
    MetricSpec("itl_p50_ms", "ITL p50 (rate win)", fmt_duration_ms, better=-1),
    MetricSpec("itl_p99_ms", "ITL p99 (rate win)", fmt_duration_ms, better=-1),
    MetricSpec("e2e_p50_ms", "E2E p50 (rate win)", fmt_duration_ms, better=-1),
    MetricSpec("e2e_p99_ms", "E2E p99 (rate win)", fmt_duration_ms, better=-1),
)


def metrics_of(model: Model) -> tuple[MetricSpec, ...]:
    if workload_of(model.view.scope) is not None:
        return WORKLOAD_METRICS
    extra = scored_only_keys(model)
    return METRICS + tuple(spec for spec in OBSERVED_METRICS if spec.key in extra) if extra else METRICS


def row_groups(model: Model, runs: int) -> int:
    """Charts per metric: one per run with the scope, and the export's line under them."""
    return runs + (1 if overlay_of(model) is not None else 0)


def value_width(width: int) -> int:
    return VALUE_W + min(max(width - WIDE, 0), VALUE_W_MAX - VALUE_W)


def _value_text(model: Model, run: RunData, spec: MetricSpec) -> str:
    v = model.value_at(run, spec.key)
    if v is None:
        return "-"
    if spec.key == "gpus":  # replicas by state with the GPUs they bill
        get = lambda k: int(model.value_at(run, k) or 0)  # noqa: E731
        return f"{get('replicas_active')}+{get('replicas_loading')}ld+{get('replicas_draining')}dr {int(v)}G"
    if spec.key == "cost_per_mtok_out_usd":
        cum = model.value_at(run, "cost_per_mtok_cum_usd")
        return f"{_usd(v)} cum {_usd(cum) if cum is not None else '-'}"
    return spec.fmt(v)


def _delta(spec: MetricSpec, a: float | None, b: float | None) -> Text:
    """B against A: the change, red where B is worse, green where better (bold past 10%)."""
    if a is None or b is None:
        return Text("")
    diff = b - a
    if abs(diff) < 1e-12:
        return Text(" =", "grey50")
    worse = spec.better != 0 and diff * spec.better < 0
    style = ("red" if worse else "green") if spec.better else "yellow"
    if spec.top == 1.0:
        text = f" {diff * 100:+.1f}pt"
    elif a:
        text = f" {diff / abs(a):+.0%}"
    else:
        text = f" {diff:+.3g}"
    big = abs(diff) > 0.1 * max(abs(a), 1e-9) if spec.top != 1.0 else abs(diff) > 0.05
    return Text(text, style + (" bold" if big else ""))


def _diff_styles(spec: MetricSpec, a: np.ndarray, b: np.ndarray) -> list[str | None]:
    """Per column of B's chart: red where B is worse than A by more than 10% (5 points for
    shares), green where better; the columns where the two runs differ stand out."""
    if not spec.better:
        return [None] * len(b)
    scale = np.where(np.isfinite(a), np.maximum(np.abs(a), 1e-9), np.inf)
    rel = (b - a) * spec.better / (1.0 if spec.top == 1.0 else scale)
    limit = 0.05 if spec.top == 1.0 else 0.1
    out: list[str | None] = []
    for r in np.nan_to_num(rel, nan=0.0).tolist():
        out.append("red" if r < -limit else "green" if r > limit else None)
    return out


def max_metric_offset(model: Model, height: int) -> int:
    """How far the metric rows scroll: until the last one shows (one line says there are more)."""
    runs = [run for run in model.runs if model.has_scope(run)]
    n = len(metrics_of(model))
    fit = max(height - (len(model.runs) - len(runs)), 1) // max(row_groups(model, len(runs)), 1)
    return 0 if fit >= n else n - max(fit - 1, 1)


@dataclass(frozen=True, eq=False)
class ChartRow:
    """One line of a metric's rows: label, chart line, value at the cursor (on the first line),
    all over the row's base style. The chart's cells come from a cache: between two seeks only the
    cursor and the values move, so a widget can keep what it drew of the rest."""

    label: str  # LABEL_W cells
    base: str  # the row's style, under all of it
    cells: tuple[tuple[str, ...], tuple[str, ...]]  # the chart line's characters and styles, without the cursor
    cursor: int
    value: Text | None

    def chart(self, cursor: int | None = None) -> Text:
        return cells_text(*self.cells, cursor)

    def cursor_style(self) -> str:
        chars, styles = self.cells
        return cursor_cell(chars[self.cursor], styles[self.cursor])

    def text(self) -> Text:
        row = Text(self.label, self.base)
        row.append_text(self.chart(self.cursor))
        if self.value is not None:
            row.append_text(self.value)
        return row


_CELLS: dict = {}
_CELLS_MAX = 4096


def _chart_cells(col: np.ndarray, top: float, rows: int, style: str, styles: list[str | None] | None):
    """bar_cells, cached by what it draws (a seek changes none of it)."""
    key = (col.tobytes(), top, rows, style, tuple(styles) if styles else None)
    held = _CELLS.get(key)
    if held is None:
        if len(_CELLS) >= _CELLS_MAX:
            _CELLS.clear()
        held = _CELLS[key] = tuple((tuple(chars), tuple(line_styles))
                                   for chars, line_styles in bar_cells(col, top, rows, style=style, col_styles=styles))
    return held


def metric_rows(model: Model, width: int, height: int) -> list[Text | ChartRow]:
    """One row per metric (two in compare mode, the run then the one compared): label, chart over
    the whole run with the cursor's column marked, value at the cursor. Rows grow taller on a tall
    terminal; when they do not all fit, the first shown is view.metric_offset."""
    value_w = value_width(width)
    chart_w = max(width - LABEL_W - value_w - 2, 4)
    lines: list[Text | ChartRow] = []
    scope = model.view.scope
    metrics = metrics_of(model)
    runs = [(k, run) for k, run in enumerate(model.runs) if model.has_scope(run)]
    for k, run in enumerate(model.runs):
        if not model.has_scope(run):
            wl = workload_of(scope)
            what = f"no requests of workload {wl!r}" if wl is not None else f"no pool {scope!r}"
            lines.append(Text(f"{'':<{LABEL_W}}{run.name} has {what}", RUN_STYLES[k] + " italic"))
    fit = max(height - len(lines), 1) // max(row_groups(model, len(runs)), 1)
    rows = min(max(fit // len(metrics), 1), 4)
    offset = min(model.view.metric_offset, max_metric_offset(model, height))
    shown = metrics if fit >= len(metrics) else metrics[offset:][: max(fit - 1, 1)]
    cursor_col = column_of(model.view.cursor_us, 0, model.t_end, chart_w)
    for spec in shown if runs else ():
        cols = [model.column_values(run, spec.key, chart_w, spec.how) for _, run in runs]
        observed = observed_columns(model, spec.key, chart_w, spec.how)
        top = chart_top(*cols, observed, fixed=spec.top)
        values = [model.value_at(run, spec.key) for _, run in runs]
        for n, ((k, run), col) in enumerate(zip(runs, cols)):
            styles = _diff_styles(spec, cols[0], col) if n == 1 else None
            chart = _chart_cells(col, top, rows, RUN_STYLES[k], styles)
            for r, cells in enumerate(chart):
                label = spec.label if (n == 0 and r == 0) else (f"  {run.name}" if r == 0 else "")
                lab_style = "bold" if n == 0 else RUN_STYLES[k]
                if spec.key == "gpu_busy" and n == 0 and r == 0:
                    lab_style = "bold yellow"
                value = None
                if r == 0:
                    value = Text(" " + _value_text(model, run, spec), "bold" if n == 0 else RUN_STYLES[k])
                    if n == 1:
                        value.append_text(_delta(spec, values[0], values[1]))
                    value.truncate(value_w + 2)
                lines.append(ChartRow(f"{label[:LABEL_W - 1]:<{LABEL_W}}", lab_style, cells, cursor_col, value))
        if observed is not None:
            lines += observed_rows(model, spec, observed, top, rows, cursor_col, value_w)
    if len(shown) < len(metrics):
        rest = len(metrics) - len(shown) - offset
        lines.append(Text(f"{'':<{LABEL_W}}↑↓ more metrics ({offset} above, {rest} below)", "grey50 italic"))
    return lines


def observed_rows(model: Model, spec: MetricSpec, observed: np.ndarray, top: float, rows: int, cursor_col: int,
                  value_w: int) -> list[ChartRow]:
    """The export's line under a metric's runs: its columns where it parts from the run in red,
    its value at the cursor with the replay's gap to it (red where that window parts)."""
    parted = parted_columns(model, spec.key, len(observed))
    styles = None if parted is None else [PARTED_STYLE if p else None for p in parted.tolist()]
    out = []
    for r, cells in enumerate(_chart_cells(observed, top, rows, OBS_STYLE, styles)):
        value = None
        if r == 0:
            v = observed_at(model, spec.key)
            shown = "-" if v is None else f"{v:.0f} replicas" if spec.key == "gpus" else spec.fmt(v)
            value = Text(f" {shown} obs", OBS_STYLE)
            replayed = model.value_at(model.runs[0], "replicas_active" if spec.key == "gpus" else spec.key)
            if spec.key == "gpus" and replayed is not None:
                replayed += model.value_at(model.runs[0], "replicas_loading") or 0.0
            if v is not None and replayed is not None and v:
                style = PARTED_STYLE if parted_at(model, spec.key) else "grey50"
                value.append(f" Δ{(replayed - v) / abs(v):+.0%}", style)
            value.truncate(value_w + 2)
        label = f"{'  observed' if r == 0 else '':<{LABEL_W}}"
        out.append(ChartRow(label, OBS_STYLE, cells, cursor_col, value))
    return out


def metric_lines(model: Model, width: int, height: int) -> list[Text]:
    """metric_rows as one Text per line."""
    return [row.text() if isinstance(row, ChartRow) else row for row in metric_rows(model, width, height)]


def header_text(model: Model, width: int) -> Text:
    v = model.view
    run = model.runs[0]
    t = Text()
    t.append(" llm-replay ", "bold reverse")
    t.append(f" {run.name}", RUN_STYLES[0] + " bold")
    if model.compare:
        t.append(" vs ", "grey50")
        t.append(model.runs[1].name, RUN_STYLES[1] + " bold")
    scopes = model.scopes
    scope = v.scope if v.scope != FLEET or len(scopes) > 1 else f"fleet ({', '.join(run.pools) or '-'})"
    wl = workload_of(v.scope)
    if wl is not None:
        names = model.workloads
        t.append(f"  workload {wl} [{names.index(wl) + 1}/{len(names)}]" if wl in names else f"  workload {wl}")
    else:
        t.append(f"  {scope} [{scopes.index(v.scope) + 1}/{len(scopes)}]" if v.scope in scopes else f"  {scope}")
    t.append(f"  {fmt_time(v.cursor_us)} / {fmt_time(model.t_end)}", "bold")
    t.append(f"  {'▶' if v.playing else '❚❚'} {SPEEDS[v.speed_index]}x")
    t.append_text(saturation_text(model))
    for r in model.runs:
        if r.live is not None:
            if r.live.state == "failed":
                t.append(f"  replay failed: {r.live.error}", "bold red")
            elif r.live.state == "compiling":
                about = f" (~{r.live.compile_estimate_s:.0f} s, once)" if r.live.compile_estimate_s else ""
                t.append(f"  compiling the engine{about}", "bold yellow")
            else:
                share = r.live.done_us / max(r.live.end_us, 1)
                t.append(f"  live {min(share, 1):.0%}" + (" following" if v.following else ""), "bold green")
    t.truncate(width)
    return t


SATURATION_STYLES = {"stable": "green", "backlogged": "bold yellow", "overloaded": "bold red"}


def saturation_text(model: Model) -> Text:
    """The scope's saturation class from each run's summary.json: a pool's own; for a fleet of
    several pools, the pools that were not stable by name (or `stable` when all were). Nothing for
    a run without it (recorded before the field, or still live)."""
    scope = model.view.scope
    t = Text()
    if not any(run.saturation for run in model.runs):
        return t
    for k, run in enumerate(model.runs):
        t.append(" vs " if k else "  ", "grey50")
        one = scope if scope != FLEET else (run.pools[0] if len(run.pools) == 1 else None)
        if one is not None:
            state = run.saturation.get(one)
            t.append(state or "-", SATURATION_STYLES.get(state, "grey50"))
            continue
        if not run.saturation:
            t.append("-", "grey50")
            continue
        worse = [(p, s) for p, s in run.saturation.items() if s != "stable"]
        for i, (pool, state) in enumerate(worse or [("", "stable")]):
            t.append((", " if i else "") + (f"{pool} " if pool else ""), RUN_STYLES[k])
            t.append(state, SATURATION_STYLES[state])
    return t


def timeline_lines(model: Model, width: int) -> list[Text]:
    """The run as one bar: elapsed up to the cursor, scaling decisions (▲ up, ▼ down) of the first
    run (of the second one too in compare mode, in its colour), the first SLO breach (!), and with
    an export, where the replay parts from it (≠)."""
    w = max(width, 2)
    t_end = model.t_end
    cur = column_of(model.view.cursor_us, 0, t_end, w)
    cells = [("━", "white") if i <= cur else ("─", "grey50") for i in range(w)]
    for col in timeline_marks(model, w):  # where the replay parts from the export (tui/observed.py)
        cells[col] = MARK
    for k, run in enumerate(model.runs):
        times, kinds = run.scaling_events(model.event_scope)
        for col, kind in zip(columns_of(times, 0, t_end, w).tolist(), kinds):
            cells[col] = ("▲" if kind == "scale_up" else "▼", RUN_STYLES[k] + " bold")
    run = model.runs[0]
    breach = model.first_breach()  # past the warm-up, as 'b' jumps
    if breach is not None:
        cells[column_of(int(run.t_us[breach]), 0, t_end, w)] = ("!", "bold red")
    cells[cur] = ("●", "bold yellow")
    bar = Text()
    for ch, st in cells:
        bar.append(ch, st)
    left, right = "0:00", fmt_time(t_end)
    message = model.view.message
    room = max(w - len(left) - len(right), 0)
    labels = Text(left, "grey50")
    labels.append(f"{message[: max(room - 2, 0)]:^{room}}", "italic")
    labels.append(right, "grey50")
    return [bar, labels]


def event_lines(model: Model, width: int, height: int) -> list[Text]:
    """The newest events at or before the cursor, in the scope, newest last: scaling decisions
    with their signals, replica state changes, rejections, preemptions ('v' keeps the first two)."""
    frames = []
    for k, run in enumerate(model.runs):
        ev, t = run.log_in(model.event_scope, model.view.decisions_only)
        end = int(np.searchsorted(t, model.view.cursor_us, side="right"))
        frames.append(ev.slice(max(end - height, 0), min(end, height)).with_columns(run=pl.lit(k)))
    rows = pl.concat(frames).sort("t_us", "run", maintain_order=True).tail(height) if frames else None
    lines = []
    styles = {"scale_up": "bold green", "scale_down": "bold yellow", "reject": "red", "preempt": "magenta",
              "preempt_swap": "magenta"}
    if rows is None or rows.height == 0:
        return [Text("no events yet at the cursor" + (" (decisions only: v)" if model.view.decisions_only else ""),
                     "grey50 italic")]
    # pool names are cut to 7 columns up to WIDE; a wider terminal shows them whole
    longest = max((len(p) for p in rows["pool"].drop_nulls().to_list()), default=7)
    pool_w = 7 if width <= WIDE else min(max(longest, 7), 24)
    for row in rows.iter_rows(named=True):
        line = Text()
        if model.compare:
            line.append("AB"[row["run"]] + " ", RUN_STYLES[row["run"]])
        line.append(f"{fmt_time(row['t_us']):>7} ", "grey70")
        line.append(f"{row['pool'] or '':<{pool_w}.{pool_w}} ", "cyan")
        line.append(f"{row['kind']:<16} ", styles.get(row["kind"], "white"))
        replica = f"r{row['replica']} " if row["replica"] is not None else ""
        line.append(replica + (row["detail"] or ""))
        line.truncate(width)
        lines.append(line)
    return lines


def hint_line(model: Model, width: int) -> Text:
    t = Text()
    keys = (("?", "help"), ("space", "play"), ("←→", "seek"), ("b", "breach"), ("w", "worst"), ("n", "scaling"),
            ("p", "pool"), ("d", "requests"), ("l", "workload"), ("r", "replicas"), ("q", "quit"))
    for key, what in keys:
        t.append(f" {key}", "bold reverse")
        t.append(f" {what} ")
    t.truncate(width)
    return t
