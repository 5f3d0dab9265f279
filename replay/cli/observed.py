"""`--observed FILE...` of `run` and `validate RUN`: the option, the checks made before anything
replays or is written, and the divergence table printed after the run's own."""

from __future__ import annotations

import argparse
from typing import Any

OBSERVED_HELP = ("observed serving metrics of the trace's window (Prometheus query_range JSON, Prometheus/"
                 "Grafana CSV, OpenMetrics text); the run's summary.json gains `observed`, the divergence "
                 "per signal and pool (several after one flag, so put the trace before it, or the flag repeated; the "
                 "config's `observed:` section says how to read them)")


def add_observed_option(p: argparse.ArgumentParser, required: bool = False, help: str = OBSERVED_HELP) -> None:
    p.add_argument("--observed", action="extend", nargs="+", default=[] if not required else None,
                   required=required, metavar="FILE", help=help)


def read_observed_files(paths: list[str], cfg_observed, source: str, pools: list[str]):
    """(the config section, the files read): every mistake in them is a UserError here, before
    the replay. Mapping to pools and the trace's window are checked once the grid is known
    (after the replay, before the run is written)."""
    from replay.outputs.observed import observed_config
    from traces.observed import read_observed

    config = observed_config(cfg_observed, source, pools)
    return config, read_observed(paths)


def check_against_trace(config, observed, pools: list[str], trace_frame, max_drain_s: float) -> None:
    """Before the replay: every used series maps to a pool and has samples where the run's ticks
    can be (from the first arrival to the last arrival plus the drain), so a wrong label or
    offset fails in a second, not after the replay. The run's own window is checked again
    once its ticks are known (replay.outputs.observed.score_run)."""
    from traces.observed import select

    last_s = float(trace_frame["arrival_us"].max() or 0) / 1e6
    select(observed, config, pools, (0.0, last_s + max_drain_s))


def divergence_figure(value: float | None, pct: bool = False) -> str:
    """A divergence table's figure as the CLI and the dashboard's `o` screen print it."""
    if value is None:
        return "-"
    if pct:
        return f"{value:.1%}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"



def _when(seconds: float | None, offset_s: float | None) -> str:
    """Trace time as [h:]mm:ss, and the wall-clock time (UTC) the observed export has there."""
    import datetime as dt

    if seconds is None:
        return "-"
    whole = round(seconds)
    clock = f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}" if whole >= 3600 \
        else f"{whole // 60}:{whole % 60:02d}"
    if offset_s is None:
        return clock
    return f"{clock} ({dt.datetime.fromtimestamp(offset_s + seconds, dt.timezone.utc):%H:%M:%S}Z)"


def print_divergence(console: Any, section: dict) -> None:
    """One row per signal and pool: MAPE over the windows, Pearson's r, the largest gap and the
    end of its window (trace time), with both values there."""
    from rich.markup import escape
    from rich.table import Table

    if not console.is_terminal:  # a file or pipe gets whole rows, not squeezed cells
        console = type(console)(width=max(console.width, 120))
    table = Table(title=f"observed vs replayed ({section['window_s']:g} s windows)",
                  caption="at: the end of the window with the largest gap (trace time, wall time UTC)")
    for name, justify in (("signal", "left"), ("pool", "left"), ("MAPE", "right"), ("r", "right"),
                          ("largest gap", "right"), ("at", "right"), ("observed", "right"), ("replayed", "right")):
        table.add_column(name, justify=justify, no_wrap=name in ("signal", "at"))
    for signal, pools in section["signals"].items():
        for pool, d in pools.items():
            r = "-" if d["correlation"] is None else f"{d['correlation']:.2f}"
            at = _when(d["gap_at_s"], section.get("offset_s"))
            fig = divergence_figure
            table.add_row(escape(signal), escape(pool), fig(d["mape"], pct=True), r, fig(d["gap"]), at,
                          fig(d["observed_at_gap"]), fig(d["replayed_at_gap"]))
    if not section["signals"]:
        console.print("[yellow]observed:[/] no signal of the export was replayed for any pool", soft_wrap=True)
        return
    console.print(table)


def print_notes(console: Any, notes: list[str]) -> None:
    from rich.markup import escape

    for line in notes:
        console.print(f"[yellow]note:[/] {escape(line)}", soft_wrap=True)
