"""What `plan` shows: the winner and the runners-up, the cost/attainment frontier as a table and a
terminal chart, a figure (matplotlib, the `plot` extra), and the winning config as YAML."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from replay.plan.driver import Trial
from replay.plan.plan import Fleet, Plan

RUNNERS_UP = 5


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.2f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _fleet_text(fleet: Fleet) -> str:
    return ", ".join(f"{pool}: {n} x {cand.label}" for pool, (cand, n) in fleet.choice.items())


def _pools(cfg) -> list[tuple[str, str]]:
    """(pool, "n x gpu tpN [weights]") per pool of a fleet config; an autoscaled pool shows its bound."""
    return [(p.name, f"{p.replicas if p.autoscaler is None else f'<={p.autoscaler.max_replicas}'} x {p.gpu} "
             f"tp{p.tensor_parallel_size}{f' {p.weight_dtype}' if p.weight_dtype else ''}") for p in cfg.pools]


def _numbers(s: dict) -> list[str]:
    return [f"${s['cost_per_mtok_all_usd']:.3f}", f"{s['gpu_hours']:,.2f}", f"${s['cost_usd']:,.2f}",
            _pct(s["slo_attainment"]), _ms(s["ttft_p99_ms"])]


def _table(title: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in ("pool", "fleet", "$/M tok", "GPU-h", "cost", "SLO met", "TTFT p99"):
        table.add_column(name, justify="left" if name in ("pool", "fleet") else "right", no_wrap=True)
    return table


def _add_fleet(table: Table, cfg, summary: dict, style: str | None = None) -> None:
    """One row per pool; the fleet's figures on its first."""
    rows = _pools(cfg)
    for i, row in enumerate(rows):
        numbers = _numbers(summary) if i == 0 else [""] * 5
        table.add_row(*row, *numbers, style=style, end_section=len(rows) > 1 and i == len(rows) - 1)


def print_plan(console: Console, plan: Plan, attainment: float, slo: dict[str, float]) -> None:
    target = ", ".join(f"{k}={v:g}" for k, v in slo.items())
    if plan.winner is None:
        console.print(f"[bold red]no fleet in the search space meets {_pct(attainment)} of requests within "
                      f"{target}[/]; the best found:")
        if plan.best_found is not None:
            table = _table("best found")
            _add_fleet(table, plan.best_found.cfg, plan.best_found.summary)
            console.print(table)
    else:
        table = _table(f"cheapest fleet meeting {_pct(attainment)} within {target} (bold), and the runners-up")
        _add_fleet(table, plan.winner.cfg, plan.winner.summary, style="bold")
        others = [f for f in plan.ranked if f.cfg.sha256() != plan.winner.cfg.sha256()][:RUNNERS_UP]
        for fleet in others:
            _add_fleet(table, fleet.cfg, fleet.summary)
        console.print(table)
    for out in plan.outcomes:
        if out.problem is not None:
            console.print(f"  {out.candidate.label}: not searched: {out.problem}", highlight=False, soft_wrap=True)
        elif out.replicas is not None and None in out.replicas.values():
            missed = [p for p, n in out.replicas.items() if n is None]
            console.print(f"  {out.candidate.label}: pool {', '.join(missed)} misses even at --max-replicas",
                          highlight=False)
    print_frontier(console, plan.frontier)
    console.print(f"{plan.replays} replays", highlight=False)


def print_frontier(console: Console, frontier: list[Trial]) -> None:
    table = _table("frontier: the fleets tried that no cheaper one attains as much as")
    for trial in frontier:
        _add_fleet(table, trial.cfg, trial.summary)
    console.print(table)
    console.print(terminal_chart(frontier), highlight=False)


def terminal_chart(frontier: list[Trial], width: int = 56, height: int = 12) -> str:
    """Attainment (rows) against cost (columns), one `*` per frontier fleet."""
    points = [(t.summary["cost_usd"], t.summary["slo_attainment"] or 0.0) for t in frontier]
    if not points:
        return ""
    (x0, x1), (y0, y1) = (min(p[0] for p in points), max(p[0] for p in points)), (min(p[1] for p in points), 1.0)
    grid = [[" "] * width for _ in range(height)]
    for x, y in points:
        col = 0 if x1 == x0 else round((x - x0) / (x1 - x0) * (width - 1))
        row = 0 if y1 == y0 else round((y1 - y) / (y1 - y0) * (height - 1))
        grid[row][col] = "*"
    lines = [f"{_pct(y1 - (y1 - y0) * i / (height - 1)) if i in (0, height - 1) else '':>8} |{''.join(r)}"
             for i, r in enumerate(grid)]
    lines.append(" " * 9 + "+" + "-" * width)
    left, right = f"${x0:,.2f}", f"${x1:,.2f}"
    lines.append(" " * 10 + left + " " * max(1, width - len(left) - len(right)) + right + "  cost")
    return "\n".join(lines)


def check_plot_path(path: str) -> None:
    """Before the search: a figure needs matplotlib and a .svg or .png name."""
    from common.errors import UserError

    if Path(path).suffix.lower() not in (".svg", ".png"):
        raise UserError(f"plan: --plot: got {path!r}, expected a file name ending in .svg or .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plan: --plot needs matplotlib: pip install 'llm-replay[plot]'") from None


def write_figure(path: str, plan: Plan, attainment: float) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no screen: a file only
    import matplotlib.pyplot as plt

    from replay.files import write_atomically

    fig, (cost_ax, ttft_ax) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    xs = [t.summary["cost_usd"] for t in plan.trials]
    cost_ax.scatter(xs, [100 * (t.summary["slo_attainment"] or 0) for t in plan.trials], s=12, c="0.6",
                    label="fleets tried")
    cost_ax.plot([t.summary["cost_usd"] for t in plan.frontier],
                 [100 * (t.summary["slo_attainment"] or 0) for t in plan.frontier], "o-", label="frontier")
    cost_ax.axhline(100 * attainment, color="0.3", linestyle="--", linewidth=0.8, label="target")
    ttft_ax.scatter(xs, [t.summary["ttft_p99_ms"] or 0 for t in plan.trials], s=12, c="0.6")
    ttft_ax.set_yscale("log")
    if plan.winner is not None:
        cost_ax.plot([plan.winner.summary["cost_usd"]], [100 * plan.winner.summary["slo_attainment"]], "r*",
                     markersize=14, label="winner")
        ttft_ax.plot([plan.winner.summary["cost_usd"]], [plan.winner.summary["ttft_p99_ms"]], "r*", markersize=14)
    cost_ax.set(xlabel="cost of the trace (USD)", ylabel="SLO attainment (%)", title="cost against attainment")
    ttft_ax.set(xlabel="cost of the trace (USD)", ylabel="TTFT p99 (ms)", title="cost against TTFT p99")
    cost_ax.legend(loc="lower right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lower().lstrip("."), metadata=_figure_metadata(path))
    plt.close(fig)
    write_atomically(path, lambda fh: fh.write(buffer.getvalue()), flag="--plot", binary=True)


def _figure_metadata(path: str) -> dict[str, Any]:
    # no creation date in the file: the same plan gives the same bytes
    return {"Date": None} if path.lower().endswith(".svg") else {"Software": "llm-replay"}


def plan_yaml(plan: Plan, trace: str, attainment: float, slo: dict[str, float]) -> str:
    assert plan.winner is not None
    s = plan.winner.summary
    head = (f"# llm-replay plan: the cheapest fleet found that meets {_pct(attainment)} of requests within "
            f"{', '.join(f'{k}={v:g}' for k, v in slo.items())} on {trace}\n"
            f"# {_fleet_text(plan.winner)}: ${s['cost_usd']:,.2f} for the trace, "
            f"${s['cost_per_mtok_all_usd']:.3f} per M tokens, attainment {_pct(s['slo_attainment'])}\n"
            f"# replay it: llm-replay run --config THIS_FILE\n")
    return head + yaml.safe_dump(plan.winner.cfg.to_dict(), sort_keys=False)
