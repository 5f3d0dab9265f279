"""Terminal rendering for the CLI (rich): progress while replaying, tables afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@contextlib.contextmanager
def progress_bar(console: Console, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """Yields a `progress(done_us, total_us)` callback, or None when there is no terminal."""
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("replaying"),
        BarColumn(),
        TextColumn("{task.fields[sim]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("replay", total=1.0, sim="")

        def update(done_us: int, total_us: int) -> None:
            bar.update(task, completed=done_us / max(total_us, 1), sim=f"{done_us / 1e6:,.0f} / {total_us / 1e6:,.0f} s")

        yield update


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def print_summary(console: Console, summary: dict, out: Path) -> None:
    table = Table(title=f"llm-replay: {summary['trace']} ({summary['sim_span_s']:,.0f} s simulated "
                        f"in {summary['wall_s']:.2f} s)")
    table.add_column("pool")
    for name in ("requests", "finished", "rejected", "unfinished", "TTFT p50", "TTFT p99", "TPOT p50",
                 "TPOT p99", "SLO met", "GPU-h", "$/Mtok out", "preempt"):
        table.add_column(name, justify="right")

    def row(name: str, s: dict, style: str | None = None) -> None:
        table.add_row(
            name, _fmt(s["requests"]), _fmt(s["finished"]), _fmt(s["rejected"]), _fmt(s["unfinished"]),
            _fmt(s["ttft_p50_ms"], " ms", 0), _fmt(s["ttft_p99_ms"], " ms", 0),
            _fmt(s["tpot_p50_ms"], " ms", 1), _fmt(s["tpot_p99_ms"], " ms", 1),
            "-" if s["slo_attainment"] is None else f"{s['slo_attainment']:.1%}",
            _fmt(s["gpu_hours"], "", 2), _fmt(s["cost_per_mtok_out_usd"], "", 2), _fmt(s["preemptions"]),
            style=style,
        )

    pools = summary["pools"]
    for name, s in pools.items():
        row(name, s)
    if len(pools) > 1:
        row("fleet", summary, style="bold")
    console.print(table)
    console.print(f"run written to [bold]{out}[/]  (requests.parquet, ticks.parquet, events.parquet, summary.json)")


def print_capacity(console: Console, cap) -> None:
    d = cap.to_dict()
    table = Table(title=f"{d['model']} on {d['tp']} x {d['gpu']}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    gb = 1e9
    table.add_row("weights per GPU", f"{d['weights_bytes_per_gpu'] / gb:,.2f} GB ({d['weight_dtype']})")
    table.add_row("activation peak per GPU", f"{d['activation_peak_bytes'] / gb:,.2f} GB")
    table.add_row("other overhead per GPU", f"{d['overhead_bytes'] / gb:,.2f} GB")
    table.add_row("KV cache per GPU", f"{d['available_kv_bytes_per_gpu'] / gb:,.2f} GB")
    table.add_row("KV bytes per token", f"{d['kv_bytes_per_token']:,} ({d['kv_cache_dtype']}, whole model)")
    table.add_row("KV bytes per token per GPU", f"{d['kv_bytes_per_token_per_gpu']:,}")
    table.add_row("KV blocks", f"{d['kv_blocks']:,} x {d['block_size']} tokens")
    table.add_row("KV tokens per replica", f"{d['kv_tokens']:,}")
    console.print(table)


def print_inspect(console: Console, info: dict) -> None:
    table = Table(title=f"{info['source']} ({info['format']})", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in info.items():
        if key in ("source", "format"):
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {_fmt(v, digits=2)}" for k, v in value.items()) or "-"
        elif isinstance(value, float):
            value = _fmt(value, digits=3)
        table.add_row(key.replace("_", " "), str(value))
    console.print(table)


def print_catalog(console: Console, rows: dict) -> None:
    for title, items in rows.items():
        if not items:
            continue
        table = Table(title=title)
        for col in items[0]:
            table.add_column(str(col), justify="left" if col in ("id", "name") else "right")
        for item in items:
            table.add_row(*(_fmt(v, digits=2) if isinstance(v, float) else str(v) for v in item.values()))
        console.print(table)
