"""Terminal rendering for the CLI (rich): progress while replaying, tables afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich import box
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


SUMMARY_ROWS = (
    ("requests", "requests", ""), ("finished", "finished", ""), ("rejected", "rejected", ""),
    ("unfinished", "unfinished", ""), ("TTFT p50", "ttft_p50_ms", " ms"), ("TTFT p99", "ttft_p99_ms", " ms"),
    ("TPOT p50", "tpot_p50_ms", " ms"), ("TPOT p99", "tpot_p99_ms", " ms"), ("E2E p99", "e2e_p99_ms", " ms"),
    ("SLO attainment", "slo_attainment", "%"), ("goodput", "goodput_rps", " req/s"),
    ("output tokens/s", "output_tokens_per_s", ""), ("GPU-hours", "gpu_hours", ""), ("cost", "cost_usd", " $"),
    ("$ per M output tok", "cost_per_mtok_out_usd", ""), ("$ per M tokens (all)", "cost_per_mtok_all_usd", ""),
    ("preemptions", "preemptions", ""), ("prefix hit rate", "prefix_hit_rate", "%"),
)


def print_summary(console: Console, summary: dict, out: Path, timing: dict) -> None:
    """One column per pool (and the fleet when there are several), one row per figure."""
    console.print(f"[bold]{summary['trace']}[/]: {summary['sim_span_s']:,.0f} s simulated in {timing['replay_s']:.2f} s")
    table = Table()
    table.add_column("")
    pools = summary["pools"]
    columns = list(pools.values())
    for name in pools:
        table.add_column(name, justify="right")
    if len(pools) > 1:
        table.add_column("fleet", justify="right", style="bold")
        columns.append(summary)
    for label, key, unit in SUMMARY_ROWS:
        cells = []
        for col in columns:
            value = col.get(key)
            if value is None:
                cells.append("-")
            elif unit == "%":
                cells.append(f"{value:.2%}")
            elif isinstance(value, float):
                cells.append(f"{value:,.{0 if unit == ' ms' and value >= 100 else 2}f}{unit}")
            else:
                cells.append(f"{value:,}{unit}")
        table.add_row(label, *cells)
    console.print(table)
    console.print(f"run written to [bold]{out}[/]")


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


CATALOG_HEADERS = {
    "params_b": "params B", "active_params_b": "active B", "layers": "layers", "attention": "attn",
    "kv_heads": "kv heads", "head_dim": "head", "context_tokens": "context", "weight_dtype": "weights",
    "kv_bytes_per_token_bf16": "KV/token", "hbm_gb": "HBM GB", "hbm_tb_per_s": "TB/s",
    "bf16_tflops": "BF16 TF", "fp8_tflops": "FP8 TF", "interconnect_gb_per_s": "link GB/s",
    "interconnect": "link", "price_usd_per_gpu_hour": "$/GPU-h",
}


def print_catalog(console: Console, rows: dict) -> None:
    for title, items in rows.items():
        if not items:
            continue
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        # The table keeps what fits 80 columns; --json has every field.
        keys = [k for k in items[0] if k not in ("interconnect", "attention", "kv_heads", "head_dim")]
        for key in keys:
            table.add_column(CATALOG_HEADERS.get(key, key), justify="left" if key == "id" else "right",
                             no_wrap=key == "id")
        for item in items:
            cells = []
            for key in keys:
                value = item[key]
                if value is None:
                    cells.append("-")
                elif key == "context_tokens":
                    cells.append(f"{value // 1024}K")
                elif key == "kv_bytes_per_token_bf16":
                    cells.append(f"{value / 1024:g} KiB")
                elif isinstance(value, float):
                    cells.append(f"{value:,.2f}".rstrip("0").rstrip("."))
                elif isinstance(value, int) and key != "id":
                    cells.append(f"{value:,}")
                else:
                    cells.append(str(value))
            table.add_row(*cells)
        console.print(table)


def print_comparison(console: Console, table_rows, out: Path, configs: list[Path]) -> None:
    """The incident demo's before/after table."""
    table = Table(title="incident: one shared pool on GPU-Util (before) vs pools per workload (after)")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for row in table_rows.iter_rows(named=True):
        cells = []
        for key in ("before", "after"):
            value, unit = row[key], row["unit"]
            if value is None:
                cells.append("-")
            elif unit == "share":
                cells.append(f"{value:.1%}")
            elif unit == "ms":
                cells.append(f"{value:,.0f} ms")
            elif unit in ("h", "req/s"):
                cells.append(f"{value:,.2f} {unit}")
            elif unit == "USD":
                cells.append(f"${value:,.2f}")
            else:
                cells.append(f"{value:,.0f}")
        table.add_row(row["metric"], *cells)
    console.print(table)
    console.print(f"runs written to [bold]{out}/before[/] and [bold]{out}/after[/]; fleets: "
                  + ", ".join(str(c) for c in configs), soft_wrap=True)


def print_policies(console: Console, rows: list[dict]) -> None:
    """One short block per policy: it reads at 80 columns, where a table of long cells does not."""
    family = None
    for row in rows:
        if row["family"] != family:
            family = row["family"]
            console.print(f"\n[bold underline]{family}[/]")
        console.print(f"[bold]{row['name']}[/]: {row['summary']}", soft_wrap=False)
        if row["params"]:
            console.print("  [cyan]" + ", ".join(f"{k}={v}" for k, v in row["params"].items()) + "[/]")
        console.print(f"  [dim]{row['source']}[/]")
