"""Terminal rendering for the CLI (rich): progress while replaying, tables afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from replay.outputs.verdict import SLO_WARN_BELOW


@contextlib.contextmanager
def progress_bar(console: Console, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """Yields a `progress(done_us, total_us)` callback, or None when there is no terminal. Past
    `total_us` (the last arrival) the fleet drains for an unknown time: the bar then pulses and
    counts the seconds drained, so a long drain never looks like a hang at 100%."""
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
            share, text = progress_state(done_us, total_us)
            if share is None:
                bar.update(task, total=None, sim=text)
            else:
                bar.update(task, completed=share, sim=text)

        yield update


def progress_state(done_us: int, total_us: int) -> tuple[float | None, str]:
    """The bar's share done (None: pulsing, the drain's length is unknown) and its text."""
    if done_us <= total_us:
        return done_us / max(total_us, 1), f"{done_us / 1e6:,.0f} / {total_us / 1e6:,.0f} s"
    return None, f"arrivals done; draining for {(done_us - total_us) / 1e6:,.0f} s"


def engine_ready(console: Console, *, terminal: bool, quiet: bool = False, variant: str = "plain") -> None:
    """Compile (first run after an install or upgrade) or load the numba kernels of `variant`
    (replay/engine/variants.py; replay.run.run_variant), saying which: a spinner with the elapsed
    time on a terminal; one line before and one after in a log."""
    import time

    from replay._numba_cache import compile_estimate_s, kernels_cached
    from replay.run import warm_up

    cached = kernels_cached(variant)
    if cached:
        with console.status("loading the engine", spinner="dots") if terminal else contextlib.nullcontext():
            warm_up(variant=variant)
        return
    estimate, basis = compile_estimate_s(variant)
    what = (f"compiling the engine's kernels (once per install or upgrade; about {estimate:.0f} s, {basis}; "
            "cached for later runs)")
    started = time.monotonic()
    if terminal:
        with Progress(TextColumn(what), TimeElapsedColumn(), console=console, transient=True) as bar:
            bar.add_task("compile", total=None)
            warm_up(variant=variant)
    else:
        if not quiet:
            console.print(f"llm-replay: {what}", soft_wrap=True, highlight=False)
        warm_up(variant=variant)
    took = time.monotonic() - started
    if not quiet:
        console.print(f"llm-replay: compiled the engine in {took:.0f} s", soft_wrap=True, highlight=False)


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


SUMMARY_ROWS = (
    ("requests", "requests", "count"), ("finished", "finished", "count"), ("rejected", "rejected", "count"),
    ("unfinished", "unfinished", "count"), ("TTFT p50", "ttft_p50_ms", "ms"), ("TTFT p99", "ttft_p99_ms", "ms"),
    ("TPOT p50", "tpot_p50_ms", "ms"), ("TPOT p99", "tpot_p99_ms", "ms"), ("E2E p99", "e2e_p99_ms", "ms"),
    ("SLO attainment", "slo_attainment", "share"), ("goodput", "goodput_rps", "req/s"),
    ("output tokens/s", "output_tokens_per_s", "rate"), ("GPU-hours", "gpu_hours", "hours"),
    ("cost", "cost_usd", "usd"), ("$ per M output tok", "cost_per_mtok_out_usd", "usd"),
    ("$ per M tokens (all)", "cost_per_mtok_all_usd", "usd"), ("preemptions", "preemptions", "count"),
    ("prefix hit rate", "prefix_hit_rate", "share"),
)


def human_ms(ms: float) -> str:
    """A latency in the unit a person reads it in: 0.42 ms, 95 ms, 36.2 s, 4.1 min, 2.3 h."""
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.{1 if ms >= 10_000 else 2}f} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:,.1f} h"


def human_span(seconds: float) -> str:
    """A simulated span: 42 s, 10 min 05 s, 1 h 00 min."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600:,} h {whole % 3600 // 60:02d} min"


def _cell(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return human_ms(value)
    if unit == "share":
        return f"{value:.2%}"
    if unit == "usd":
        return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"
    if unit == "req/s":
        return f"{value:,.2f} req/s"
    if unit == "rate":
        return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"
    if unit == "hours":
        return f"{value:,.2f}"
    return f"{value:,}"


SATURATION_STYLES = {"stable": "green", "backlogged": "yellow", "overloaded": "bold red"}


def saturation_cell(saturation: dict | None) -> str:
    """A pool's class as rich markup: red overloaded, yellow backlogged, green stable."""
    if not saturation:
        return "-"
    state = str(saturation.get("class"))
    return f"[{SATURATION_STYLES.get(state, 'default')}]{escape(state)}[/]"


def coverage_line(summary: dict) -> str:
    """Which requests the table's percentiles cover (a rejected or unfinished request has none)."""
    return (f"percentiles cover: TTFT the {summary.get('ttft_requests', 0):,} requests with a first token; TPOT "
            f"the {summary.get('tpot_requests', 0):,} finished with 2+ output tokens; E2E the "
            f"{summary.get('e2e_requests', 0):,} finished")


def print_summary(console: Console, summary: dict, out: Path, wall_s: float | None = None) -> None:
    """One column per pool (and the fleet when there are several), one row per figure, what the
    percentiles cover, then the verdict: what went wrong, if anything."""
    head = f"[bold]{escape(str(summary['trace']))}[/]: {human_span(summary['sim_span_s'])} simulated"
    console.print(head + (f" in {wall_s:.2f} s" if wall_s is not None else ""), soft_wrap=True)
    table = Table()
    table.add_column("")
    pools = summary["pools"]
    columns = list(pools.values())
    for name in pools:
        table.add_column(escape(name), justify="right")
    if len(pools) > 1:
        table.add_column("fleet", justify="right", style="bold")
        columns.append(summary)
    for label, key, unit in SUMMARY_ROWS:
        table.add_row(label, *(_cell(col.get(key), unit) for col in columns))
    # per pool only: the fleet's pools may be one stable and one overloaded (replay/fleet/saturation.py)
    table.add_row("saturation", *(saturation_cell(pool.get("saturation")) for pool in pools.values()),
                  *([""] if len(pools) > 1 else []))
    console.print(table)
    console.print(f"[dim]{coverage_line(summary)}[/]", soft_wrap=True)
    print_verdict(console, summary.get("verdict") or [])
    console.print(f"run written to [bold]{escape(str(out))}[/]", soft_wrap=True)


def print_verdict(console: Console, lines: list[str]) -> None:
    if not lines:
        console.print(f"[green]verdict: every request finished, none rejected, SLO met by "
                      f"{SLO_WARN_BELOW:.0%} or more[/]", soft_wrap=True)
        return
    for line in lines:
        console.print(f"[bold red]verdict:[/] {escape(line)}", soft_wrap=True)


def print_capacity(console: Console, cap) -> None:
    d = cap.to_dict()
    table = Table(title=f"{d['model']} on {d['tp']} x {d['gpu']}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    gb = 1e9
    source = "--gpu-memory-bytes" if d["gpu_memory_source"] == "override" else "as CUDA reports it"
    table.add_row("GPU memory", f"{d['gpu_memory_bytes'] / gb:,.2f} GB = {d['gpu_memory_bytes'] / 2**30:,.2f} GiB "
                                f"({source}); vLLM uses {d['gpu_memory_utilization']:g} of it")
    table.add_row("weights per GPU", f"{d['weights_bytes_per_gpu'] / gb:,.2f} GB ({d['weight_dtype']})")
    table.add_row("activation peak per GPU", f"{d['activation_peak_bytes'] / gb:,.2f} GB")
    table.add_row("non-torch memory per GPU", f"{d['overhead_bytes'] / gb:,.2f} GB")
    table.add_row("KV cache per GPU", f"{d['available_kv_bytes_per_gpu'] / gb:,.2f} GB")
    table.add_row("KV bytes per token", f"{d['kv_bytes_per_token']:,} ({d['kv_cache_dtype']}, whole model)")
    table.add_row("KV bytes per token per GPU", f"{d['kv_bytes_per_token_per_gpu']:,}")
    table.add_row("KV blocks", f"{d['kv_blocks']:,} x {d['block_size']} tokens")
    table.add_row("KV tokens per replica", f"{d['kv_tokens']:,}")
    console.print(table)


def print_inspect(console: Console, info: dict) -> None:
    """`trace inspect`'s table. Sources and labels are the user's text: escaped, never markup."""
    table = Table(title=escape(f"{info['source']} ({info['format']})"), show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in info.items():
        if key in ("source", "format", "notes"):
            continue
        table.add_row(key.replace("_", " "), escape(_inspect_value(value)))
    console.print(table)
    for note in info.get("notes", ()):
        console.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)


def _inspect_value(value) -> str:
    """A statistic as text: '-' for one that does not apply (the rate of a single instant, the
    prefix reuse of a trace without hashes), never Python's None."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_inspect_value(v)}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return _fmt(value, digits=3 if abs(value) < 1000 else 1)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


CATALOG_HEADERS = {
    "params_b": "params B", "active_params_b": "active B", "layers": "layers", "attention": "attn",
    "kv_heads": "kv heads", "head_dim": "head", "context_tokens": "context", "weight_dtype": "weights",
    "kv_bytes_per_token_bf16": "KV/token", "hbm_gb": "HBM GB", "cuda_total_gib": "CUDA GiB",
    "hbm_tb_per_s": "TB/s",
    "bf16_tflops": "BF16 TF", "fp8_tflops": "FP8 TF", "interconnect_gb_per_s": "link GB/s",
    "interconnect": "link", "price_usd_per_gpu_hour": "$/GPU-h",
}


def print_catalog(console: Console, rows: dict) -> None:
    for title, items in rows.items():
        if not items:
            continue
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        # The table keeps what fits 80 columns; --json has every field. A GPU's marketed size is in
        # its id (h100-sxm-80gb), so the table shows the memory CUDA reports instead.
        keys = [k for k in items[0] if k not in ("interconnect", "attention", "kv_heads", "head_dim", "hbm_gb")]
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


def print_model_details(console: Console, details: dict) -> None:
    """`catalog --model`: one model's fields, one per line (counts with thousands separators)."""
    table = Table(title=f"model {details['name'] or details['id']}", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in details.items():
        if value is None:
            text = "-"
        elif key == "kv_bytes_per_token":
            text = f"{value:,} B ({value / 1024:g} KiB)"
        elif key.startswith("params_"):
            text = f"{value:,} ({value / 1e9:.2f} B)"
        elif isinstance(value, int):
            text = f"{value:,}"
        else:
            text = str(value)
        table.add_row(key, text)
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


def _param(value: object) -> str:
    """A parameter's default as a config would write it: {prefix: 2, queue: 1}, not a Python repr."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_param(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_param(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def print_policies(console: Console, rows: list[dict]) -> None:
    """One short block per policy: it reads at 80 columns, where a table of long cells does not."""
    family = None
    for row in rows:
        if row["family"] != family:
            family = row["family"]
            console.print(f"\n[bold underline]{family}[/]")
        # a plugin's name and docstring are the user's text, never rich markup
        console.print(f"[bold]{escape(row['name'])}[/]: {escape(row['summary'])}", soft_wrap=False)
        if row["params"]:
            console.print("  [cyan]" + escape(", ".join(f"{k}={_param(v)}" for k, v in row["params"].items())) + "[/]")
        console.print(f"  [dim]{escape(row['source'])}[/]")
