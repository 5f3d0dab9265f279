"""`llm-replay`: run, capacity, trace inspect, catalog, calibrate, validate, profile.

A user mistake (a `UserError`) prints one line on stderr and exits with code 2, no traceback and
no output directory; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from traces.errors import UserError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line, as every other user mistake is: `llm-replay: error: run:
    MESSAGE (see llm-replay run --help)` and exit 2, not argparse's whole usage block."""

    def error(self, message: str):
        command = self.prog.removeprefix("llm-replay").strip()
        flag = message.removeprefix("argument ").partition(":")[0] if message.endswith(": expected one argument") else ""
        if flag.startswith("--"):  # argparse reads '-5:' as an option: the value must be joined to its flag
            example = "--window=-5:" if flag == "--window" else f"{flag}=VALUE"
            message += f" (a value that starts with '-' goes after '=': {example})"
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"llm-replay: error: {where}{message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        # argparse reports a subcommand's unknown flags from the top parser: name the subcommand
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            path = [getattr(namespace, d, None) for d in ("command", "trace_command", "demo_command")]
            parser = OneLineParser(prog=" ".join([self.prog, *filter(None, path)]), add_help=False)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace


def _parser() -> argparse.ArgumentParser:
    from replay import cli_calibrate, cli_profile, cli_validate
    from replay.cli_trace import add_trace_options
    from replay.cli_tui import add_tui_parser
    from traces import DEFAULT_TRACE

    p = OneLineParser(
        prog="llm-replay",
        description="Replay LLM request traces through a simulated fleet of vLLM-like engines.",
    )
    # every subcommand's parser (those of replay/cli_*.py too) is a OneLineParser
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)

    run = sub.add_parser("run", help="replay a trace on a fleet and write a run directory")
    run.add_argument("trace", nargs="?", default=None,
                     help=f"trace file or bundled trace name (default: the config's trace, else {DEFAULT_TRACE})")
    run.add_argument("--config", "-c", help="fleet config YAML (default: the built-in fleet)")
    run.add_argument("--out", "-o", help="run directory to write (default: runs/<trace>-<config>)")
    run.add_argument("--engine", choices=("numba", "reference"), default="numba",
                     help="numba (fast) or reference (slow pure Python, same outputs)")
    run.add_argument("--force", action="store_true", help="replace --out if it already exists")
    run.add_argument("--detailed-events", action="store_true",
                     help="also log every arrival, admission, first token and finish in events.parquet")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary table")
    run.add_argument("--json", action="store_true", help="print summary.json to stdout at the end")
    run.add_argument("--tui", action="store_true", help="watch the replay in the dashboard while it runs")
    add_plugin_option(run)
    add_trace_options(run)

    cap = sub.add_parser("capacity", help="weights, KV bytes per token and KV capacity of one replica; "
                                          "--break-even: the prefill/decode break-even KV link bandwidth")
    cap.add_argument("--model", help="catalog model (required, except with --break-even: every model)")
    cap.add_argument("--gpu", help="catalog GPU (required, except with --break-even and --flops)")
    cap.add_argument("--tp", type=int, default=1,
                     help="tensor parallel size: GPUs per replica (default 1)")
    cap.add_argument("--kv-cache-dtype", default="auto",
                     help="KV cache dtype as vLLM's --kv-cache-dtype: auto (the model's dtype), fp8, ... (default auto)")
    cap.add_argument("--weight-dtype", default=None,
                     help="weight dtype, e.g. bf16, fp8, int4 (default: the catalog model's own)")
    cap.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                     help="share of GPU memory vLLM may use, in (0, 1] (default 0.9)")
    cap.add_argument("--block-size", type=int, default=16,
                     help="tokens per KV block: a power of 2 up to 128 (default 16)")
    cap.add_argument("--max-num-batched-tokens", type=int, default=8192,
                     help="tokens per step, which sizes the activation memory reserved (default 8192)")
    cap.add_argument("--max-num-seqs", type=int, default=256,
                     help="sequences per step, which sizes the profile's sampler pass (default 256)")
    cap.add_argument("--gpu-memory-bytes", type=float, default=None,
                     help="memory per GPU in bytes, e.g. 80e9, instead of the total CUDA reports for --gpu "
                          "(79.22 GiB for an H100 80GB)")
    cap.add_argument("--num-gpu-blocks-override", type=int, default=None,
                     help="KV blocks per replica instead of what memory allows (vLLM's flag of that name)")
    cap.add_argument("--break-even", action="store_true",
                     help="print W* = kv_bytes_per_token x F / (2 x active params) per model, and the KV "
                          "transfer's share of the prefill over each link preset")
    cap.add_argument("--flops", type=float, default=None,
                     help="with --break-even: the achieved prefill FLOP/s F (default: the GPU's dense peak for "
                          "the model's weights x the MFU a pool of that GPU runs at by default)")
    cap.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")

    tr = sub.add_parser("trace", help="look at a trace")
    trsub = tr.add_subparsers(dest="trace_command", required=True, metavar="SUBCOMMAND", parser_class=OneLineParser)
    ins = trsub.add_parser("inspect", help="rows, span, rates, token percentiles, prefix reuse")
    ins.add_argument("trace", nargs="?", default=None,
                     help="trace file or bundled trace name (default: the --config's trace)")
    ins.add_argument("--config", "-c", help="take the trace: section of this fleet config")
    ins.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    add_trace_options(ins)

    demo = sub.add_parser("demo", help="replay a built-in scenario")
    demosub = demo.add_subparsers(dest="demo_command", required=True, metavar="SCENARIO", parser_class=OneLineParser)
    inc = demosub.add_parser("incident", help="TTFT p99 past 30 s on a shared GPU-Util-scaled pool, and the fix")
    inc.add_argument("--out", "-o", default="runs/incident", help="writes OUT/before and OUT/after")
    inc.add_argument("--force", action="store_true", help="replace existing runs")
    inc.add_argument("--engine", choices=("numba", "reference"), default="numba",
                     help="numba (fast) or reference (slow pure Python, same outputs)")

    pol = sub.add_parser("policies", help="every policy by family: parameters, defaults, upstream source")
    pol.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    add_plugin_option(pol, "also list the functions of MODULE that fit an autoscaler or a pool split")

    cat = sub.add_parser("catalog", help="the models and GPUs llm-replay knows")
    cat.add_argument("--model", metavar="ID|PATH",
                     help="show what is known of one model: a catalog id, or a Hugging Face config.json (or its folder)")
    cat.add_argument("--json", action="store_true", help="print the catalog as JSON instead of the tables")
    add_tui_parser(sub)
    cli_calibrate.add_parser(sub)
    cli_validate.add_parser(sub)
    cli_profile.add_parser(sub)
    return p


def add_plugin_option(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="allow a config's 'MODULE:function' policies to load this module (a module on the "
                        "Python path, or a .py file); a config alone never imports code (repeatable)"
                        + (f"; {extra}" if extra else ""))


def main(argv: list[str] | None = None) -> int:
    # SIGINT and SIGTERM end a command alike: one line, nothing partial (replay.rundir.Interrupted).
    import signal

    previous: dict = {}  # the handlers to restore (main may run inside a test process)
    try:
        from replay.cli_tui import cmd_run_tui, cmd_tui
        from replay.rundir import forget_signals, raise_interrupted

        forget_signals()
        if threading.current_thread() is threading.main_thread():
            previous.update({s: signal.signal(s, raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)})

        args = _parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args) if not args.tui else cmd_run_tui(args)
        if args.command == "tui":
            return cmd_tui(args)
        if args.command == "capacity":
            return _cmd_capacity(args)
        if args.command == "trace":
            return _cmd_inspect(args)
        if args.command == "catalog":
            return _cmd_catalog(args)
        if args.command == "demo":
            return _cmd_demo(args)
        if args.command == "policies":
            return _cmd_policies(args)
        if args.command == "calibrate":
            from replay import cli_calibrate

            return cli_calibrate.run(args)
        if args.command == "validate":
            from replay import cli_validate

            return cli_validate.run(args)
        if args.command == "profile":
            from replay import cli_profile

            return cli_profile.run(args)
    except UserError as exc:
        print(f"llm-replay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        # replay.rundir.Interrupted says which signal, and whether the run was already in place
        signum, written = getattr(exc, "signum", signal.SIGINT), getattr(exc, "written", None)
        what = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"llm-replay: {what}; " + (f"the run was written to {written}" if written else "nothing written"),
              file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
    return 0


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What `run` (with or without --tui) checked before it replays."""

    cfg: Any  # FleetConfig as run: its trace section with every CLI override applied
    source: str  # the config file, for messages
    plans: list  # cluster.PoolPlan per pool
    out: Path
    trace: Any  # traces.LoadedTrace
    inputs: tuple = ()  # every file the command reads: --force never deletes a folder holding one


def prepare_run(args: argparse.Namespace) -> RunInputs:
    """The config, the fleet (one that cannot start fails before the trace is read), --out, then
    the trace: every user mistake is a UserError before anything is replayed or written."""
    from replay.cli_trace import effective_trace, trace_limits
    from replay.cluster import check_tick_count, plan_pools
    from replay.config import load_config
    from replay.outputs import check_out_dir
    from traces import load_from_config

    cfg = load_config(args.config, plugins=args.plugin)
    source = args.config or "default fleet"
    plans = plan_pools(cfg, source)
    base_dir = Path(args.config).resolve().parent if args.config else None
    trace_cfg = effective_trace(cfg.trace, args, base_dir)
    # What ran is what config.yaml records: the trace section with every CLI override applied.
    cfg = dataclasses.replace(cfg, trace=effective_trace(cfg.trace, args, base_dir, absolute=True))
    if args.out is not None and not args.out.strip():
        raise UserError("--out: empty path; give a directory for the run")
    out = Path(args.out) if args.out else _default_out(args, cfg)
    inputs = command_inputs(args.config, cfg)
    check_out_dir(out, args.force, inputs)
    trace = load_from_config(trace_cfg, strict=args.strict, limits=trace_limits(args))
    check_tick_count(trace.frame, cfg)  # before the engine compiles, not after
    return RunInputs(cfg, source, plans, out, trace, inputs)


def command_inputs(config: str | None, cfg) -> tuple[str, ...]:
    """The files a run reads: the config, the trace and merged traces (bundled names are not
    files here), each pool's step-model profile and table (absolute in a loaded config)."""
    from traces import BUNDLED

    trace = cfg.trace
    paths = [config] if config else []
    if trace is not None:
        paths += [trace.path] + [m.path for m in trace.merge]
    paths += [p for pool in cfg.pools for p in (pool.step_model.profile, pool.step_model.table)]
    return tuple(p for p in paths if p and p not in BUNDLED)


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from replay.outputs import claimed, write_run
    from replay.report import engine_ready, print_summary, progress_bar
    from replay.rundir import raise_if_signalled
    from replay.run import replay_trace

    began = time.perf_counter()
    run = prepare_run(args)
    cfg, out, trace = run.cfg, run.out, run.trace
    timing = {"load_trace_s": time.perf_counter() - began}
    console = Console(stderr=True)
    _report_trace_fixes(console, trace)
    show = not args.quiet and console.is_terminal
    # One writer per --out from before the replay to the swap (replay.outputs.claimed).
    with claimed(out, args.force, run.inputs):
        began = time.perf_counter()
        if args.engine == "numba":
            engine_ready(console, terminal=show, quiet=args.quiet)
            raise_if_signalled()  # one that numba's loading swallowed
        timing["warm_up_s"] = time.perf_counter() - began
        with progress_bar(console, enabled=show) as progress:
            result = replay_trace(trace, cfg, engine=args.engine, detailed_events=args.detailed_events,
                                  progress=progress, plans=run.plans, config_source=run.source)
        raise_if_signalled()
        write_run(out, result, force=args.force, timing=timing)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    elif not args.quiet:
        print_summary(Console(), result.summary, out, wall_s=result.timing["replay_s"])
    if args.json or args.quiet:
        # a run that went wrong says so even when its table is not printed
        for line in result.summary["verdict"]:
            console.print(f"[bold red]verdict:[/] {escape(line)}", soft_wrap=True)
    return 0


def _rows(n: int) -> str:
    return "row" if n == 1 else "rows"


def _report_trace_fixes(console, trace) -> None:
    """Nothing is dropped or reordered silently, and nothing doubtful passes without a warning.
    The source is the user's text: escaped, so that '[/x]' in a path is printed, not parsed."""
    from rich.markup import escape

    source = escape(str(trace.source))
    for reason, count in trace.dropped.items():
        if count:
            console.print(f"[yellow]note:[/] {source}: dropped {count:,} {_rows(count)} ({reason})", soft_wrap=True)
    if trace.reordered:
        was = "row was" if trace.reordered == 1 else "rows were"
        console.print(f"[yellow]note:[/] {source}: {trace.reordered:,} {was} out of order and sorted by arrival "
                      "(--strict makes this an error)", soft_wrap=True)
    for note in trace.notes:
        console.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)


TRACE_FLAGS = ("trace", "format", "column_map", "time_unit", "workload", "merge", "window", "rate_scale",
               "sample", "seed", "only_workload", "max_prompt_tokens")


def _default_out(args: argparse.Namespace, cfg) -> Path:
    """runs/<trace>[-<config>], plus a short hash of the trace settings when flags changed them,
    so two different runs never share a default directory."""
    stem = Path(str(cfg.trace.path or "merged")).name.split(".")[0]
    if args.config:
        stem += "-" + Path(args.config).stem
    if any(getattr(args, flag, None) not in (None, []) for flag in TRACE_FLAGS if flag != "trace"):  # --seed 0 too
        stem += "-" + cfg.sha256()[:8]
    return Path("runs") / stem


# capacity's numeric flags and the config keys whose ranges they share (traces/bounds.py).
CAPACITY_FLAGS = {"tp": "tensor_parallel_size", "gpu_memory_utilization": "gpu_memory_utilization",
                  "block_size": "block_size", "max_num_batched_tokens": "max_num_batched_tokens",
                  "num_gpu_blocks_override": "num_gpu_blocks_override", "flops": "flops",
                  "max_num_seqs": "max_num_seqs", "gpu_memory_bytes": "gpu_memory_bytes"}


def _check_flag_ranges(args: argparse.Namespace, flags: dict[str, str]) -> None:
    """A flag refuses what its config key refuses, nan and inf included: one UserError naming it."""
    from traces.bounds import out_of_bounds

    for dest, key in flags.items():
        value = getattr(args, dest)
        problem = None if value is None else out_of_bounds(None, key, value)
        if problem is not None:
            flag = "--" + dest.replace("_", "-")
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            raise UserError(f"{args.command}: {flag}: got {shown}, expected {problem}")


def _cmd_capacity(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.memory import kv_capacity
    from replay.report import print_capacity
    from replay.specs import get_gpu, get_model

    _check_flag_ranges(args, CAPACITY_FLAGS)
    if args.break_even:
        return _cmd_break_even(args)
    if not args.model or not args.gpu:
        raise UserError("capacity: --model and --gpu are required (or use --break-even)")
    try:
        cap = kv_capacity(
            get_model(args.model), get_gpu(args.gpu), args.tp,
            gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
            kv_cache_dtype=args.kv_cache_dtype, weight_dtype=args.weight_dtype,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
            gpu_memory_bytes=args.gpu_memory_bytes,
        )
    except UserError as exc:
        # Name the flag the user typed, not the parameter behind it.
        text = str(exc)
        for flag in ("gpu_memory_utilization", "block_size", "kv_cache_dtype", "weight_dtype",
                     "num_gpu_blocks_override", "max_num_batched_tokens", "max_num_seqs", "gpu_memory_bytes",
                     "tensor_parallel_size"):
            text = text.replace(flag, "--tp" if flag == "tensor_parallel_size" else "--" + flag.replace("_", "-"))
        raise UserError(f"capacity: {text}") from None
    if args.json:
        print(json.dumps(cap.to_dict(), indent=2))
    else:
        print_capacity(Console(), cap)
    return 0


def _cmd_break_even(args: argparse.Namespace) -> int:
    """W* per model (ref 000 section 02): the link speed at which moving a prompt's KV costs as
    long as computing it."""
    from rich.console import Console
    from rich.table import Table

    from replay.config import LINK_PRESETS
    from replay.specs import MODELS, get_gpu, get_model, normalize_weight_dtype
    from replay.calprofile import default_coefficients
    from replay.stepmodel import DEFAULT_MFU
    from replay.stepterms import break_even_rows

    models = [get_model(args.model)] if args.model else list(MODELS.values())
    if args.flops is not None:
        flops = {m.id: args.flops for m in models}
        source = f"F = {args.flops:.3g} FLOP/s (--flops)"
    elif args.gpu:
        gpu = get_gpu(args.gpu)
        fp8 = {m.id: normalize_weight_dtype(args.weight_dtype or m.default_weight_dtype) == "fp8" and gpu.fp8_native
               for m in models}
        # the mfu a default pool of this GPU runs at (its Vidur-fitted default, else stepmodel's)
        mfu = (default_coefficients(gpu.id) or {}).get("mfu", DEFAULT_MFU)
        flops = {m.id: (gpu.fp8_flops if fp8[m.id] else gpu.bf16_flops) * mfu for m in models}
        source = f"F = {gpu.id} dense peak x MFU {mfu:g} (its default)"
    else:
        raise UserError("capacity: --break-even needs --gpu (F from its peak FLOP/s) or --flops")
    rows = [row for m in models for row in break_even_rows([m], flops[m.id], LINK_PRESETS)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"Break-even KV link W* = kv_bytes_per_token x F / (2 P); {source}; "
                        "then the transfer's % of the prefill per link", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("KV", no_wrap=True)
    for name in ("KiB/token", "W* GB/s", *LINK_PRESETS):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["model"], row["kv_cache_dtype"], f"{row['kv_bytes_per_token'] / 1024:,.0f}",
                      f"{row['break_even_bytes_per_s'] / 1e9:.2f}",
                      *(f"{share * 100:.1f}" for share in row["transfer_share"].values()))
    console = Console()
    Console(width=max(console.width, 104)).print(table)
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.cli_trace import effective_trace, trace_limits
    from replay.config import load_config
    from replay.report import print_inspect
    from traces import inspect_trace, load_from_config

    base = load_config(args.config).trace if args.config else None
    base_dir = Path(args.config).resolve().parent if args.config else None
    trace = load_from_config(effective_trace(base, args, base_dir), strict=args.strict, limits=trace_limits(args))
    info = inspect_trace(trace)
    info = {"source": str(trace.source), "format": trace.format, "sha256": trace.sha256,
            "dropped": dict(trace.dropped), "reordered": trace.reordered, **info, "notes": list(trace.notes)}
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print_inspect(Console(), info)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.demo import comparison, demo_config_path, run_incident
    from replay.report import engine_ready, print_comparison

    err = Console(stderr=True)
    if args.engine == "numba":
        engine_ready(err, terminal=err.is_terminal)
    with err.status("replaying the incident twice (before and after the fix)...", spinner="dots") \
            if err.is_terminal else contextlib.nullcontext():
        runs = run_incident(Path(args.out), force=args.force, engine=args.engine)
    print_comparison(Console(), comparison(runs), Path(args.out),
                     [demo_config_path("before"), demo_config_path("after")])
    return 0


def _cmd_policies(args: argparse.Namespace) -> int:
    from rich.console import Console

    from policies.plugins import load_plugins
    from policies.registry import policy_rows
    from replay.report import print_policies

    load_plugins(args.plugin)
    rows = policy_rows()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_policies(Console(), rows)
    return 0


def _cmd_catalog(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.report import print_catalog, print_model_details
    from replay.specs import catalog_rows, get_model, model_details

    if args.model is not None:
        details = model_details(get_model(args.model))
        if args.json:
            print(json.dumps(details, indent=2))
        else:
            print_model_details(Console(), details)
        return 0
    rows = catalog_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_catalog(Console(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
