"""`llm-replay run`: replay a trace on a fleet and write a run directory (with --tui, watched in
the dashboard while it runs: replay/cli/live_run.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from common.errors import UserError
from replay.cli.observed import add_observed_option
from replay.cli.parsing import add_plugin_option
from replay.cli.trace_options import add_trace_options, size_bytes


def add_parser(sub: Any) -> None:
    from traces import DEFAULT_TRACE

    p = sub.add_parser("run", help="replay a trace on a fleet and write a run directory")
    p.add_argument("trace", nargs="?", default=None,
                     help=f"trace file or bundled trace name (default: the config's trace, else {DEFAULT_TRACE})")
    p.add_argument("--config", "-c", help="fleet config YAML (default: the built-in fleet)")
    p.add_argument("--out", "-o", help="run directory to write (default: runs/<trace>-<config>)")
    p.add_argument("--engine", choices=("numba", "reference"), default="numba",
                     help="numba (fast) or reference (slow pure Python, same outputs)")
    p.add_argument("--force", action="store_true", help="replace --out if it already exists")
    p.add_argument("--detailed-events", action="store_true",
                     help="also log every arrival, admission, first token and finish in events.parquet")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary table")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout at the end")
    p.add_argument("--tui", action="store_true", help="watch the replay in the dashboard while it runs")
    p.add_argument("--max-memory", type=size_bytes, metavar="SIZE",
                   help="refuse, before it starts, a run whose estimated peak memory exceeds SIZE, e.g. 8GiB "
                        "(default: what the machine has, MemAvailable or the cgroup's limit)")
    p.add_argument("--jobs", "-j", type=jobs_count, default=None, metavar="N",
                   help="replay pools that share nothing in up to N processes, with the same outputs "
                        "(default: the cores this process may use that the load leaves idle; 1: one process)")
    add_observed_option(p)
    add_plugin_option(p)
    add_trace_options(p)


def jobs_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes from 1 to 1024, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.tui:
        from replay.cli.live_run import cmd_run_tui

        return cmd_run_tui(args)
    return _replay(args)


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What `run` (with or without --tui) checked before it replays."""

    cfg: Any  # FleetConfig as run: its trace section with every CLI override applied
    source: str  # the config file, for messages
    plans: list  # cluster.PoolPlan per pool
    out: Path
    trace: Any  # traces.LoadedTrace
    inputs: tuple = ()  # every file the command reads: --force never deletes a folder holding one
    observed: Any = None  # (ObservedConfig, traces.observed.Observed) with --observed


def prepare_run(args: argparse.Namespace, stream: bool = False) -> RunInputs:
    """The config, the fleet (one that cannot start fails before the trace is read), --out, then
    the trace: every user mistake is a UserError before anything is replayed or written.
    `stream`: the trace may come read in batches (LoadedTrace.stream), for `replay_trace`."""
    from replay.cli.trace_options import effective_trace, trace_limits
    from replay.fleet.cluster import plan_pools
    from replay.fleet.streamed import replays_in_batches
    from replay.fleet.ticks import check_tick_count
    from replay.config import load_config
    from replay.memory import check_fits
    from replay.outputs.write import check_out_dir
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
    observed_files = getattr(args, "observed", None) or []
    inputs = command_inputs(args.config, cfg) + tuple(observed_files)
    check_out_dir(out, args.force, inputs)
    observed = None
    if observed_files:
        from replay.cli.observed import read_observed_files

        observed = read_observed_files(observed_files, cfg.observed, source, [p.name for p in cfg.pools])
    limits = trace_limits(args)
    # a canonical Parquet trace is read in batches as the replay goes (traces/stream.py), where
    # nothing before the replay needs its rows (replay/fleet/streamed.py)
    stream = stream and observed is None and replays_in_batches(cfg, plans, args.engine, getattr(args, "jobs", None))
    check_fits(trace_cfg, getattr(args, "max_memory", None), source, limits.max_bytes,  # before the load
               streamed=stream, lora=any(p.terms.lora_slots for p in plans))
    trace = load_from_config(trace_cfg, strict=args.strict, limits=limits, stream=stream)
    check_tick_count(trace.frame if trace.stream is None else trace.stream.ends(), cfg)  # before the engine compiles
    if cfg.trace is not None and cfg.trace.closed_loop:
        from replay.fleet.sessions import with_session_notes

        trace = with_session_notes(trace, source)
    if observed is not None:
        from replay.cli.observed import check_against_trace

        check_against_trace(*observed, [p.name for p in cfg.pools], trace.frame, cfg.max_drain_s)
    return RunInputs(cfg, source, plans, out, trace, inputs, observed)


def command_inputs(config: str | None, cfg) -> tuple[str, ...]:
    """The files a run reads: the config, the trace and merged traces (bundled names are not
    files here), each pool's step-model profile and table (absolute in a loaded config)."""
    from traces import BUNDLED

    trace = cfg.trace
    paths = [config] if config else []
    if trace is not None:
        paths += [trace.path] + [m.path for m in trace.merge]
        paths += [spec for spec in (trace.synthetic, trace.whatif and trace.whatif.add_tenant) if isinstance(spec, str)]
    paths += [p for pool in cfg.pools for p in (pool.step_model.profile, pool.step_model.table)]
    return tuple(p for p in paths if p and p not in BUNDLED)


def _replay(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from replay.outputs.write import claimed, write_run
    from replay.outputs.report import engine_ready, print_summary, progress_bar
    from replay.outputs.rundir import raise_if_signalled
    from replay.run import replay_trace, run_variant

    began = time.perf_counter()
    checked = prepare_run(args, stream=True)
    cfg, out, trace = checked.cfg, checked.out, checked.trace
    timing = {"load_trace_s": time.perf_counter() - began}
    console = Console(stderr=True)
    report_trace_fixes(console, trace)
    show = not args.quiet and console.is_terminal
    # One writer per --out from before the replay to the swap (replay.outputs.write.claimed).
    with claimed(out, args.force, checked.inputs):
        began = time.perf_counter()
        if args.engine == "numba":
            engine_ready(console, terminal=show, quiet=args.quiet,
                         variant=run_variant(cfg, checked.plans, trace.frame, checked.source))
            raise_if_signalled()  # one that numba's loading swallowed
        timing["warm_up_s"] = time.perf_counter() - began
        from replay.fleet.parallel import auto_jobs

        jobs, busy = (args.jobs, None) if args.jobs is not None else auto_jobs()
        with progress_bar(console, enabled=show) as progress:
            result = replay_trace(trace, cfg, engine=args.engine, detailed_events=args.detailed_events,
                                  progress=progress, plans=checked.plans, config_source=checked.source, jobs=jobs,
                                  spill_dir=out)
        execution = result.execution or (busy and len(cfg.pools) > 1 and
                                         f"replayed the {len(cfg.pools)} pools in one process: {busy}")
        if execution and not args.quiet:
            console.print(f"[yellow]note:[/] {escape(execution)}", soft_wrap=True, highlight=False)
        raise_if_signalled()
        result, notes = with_observed(result, checked)
        write_run(out, result, force=args.force, timing=timing)
    if notes:
        from replay.cli.observed import print_notes

        print_notes(console, notes)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    elif not args.quiet:
        print_summary(Console(), result.summary, out, wall_s=result.timing["replay_s"])
        print_observed(Console(), result.summary)
    if args.json or args.quiet:
        # a run that went wrong says so even when its table is not printed
        for line in result.summary["verdict"]:
            console.print(f"[bold red]verdict:[/] {escape(line)}", soft_wrap=True)
    return 0


def with_observed(result, checked: RunInputs):
    """The run with what was observed: a request log's own TTFT/E2E per request, and the export
    of --observed scored, before the run is written (an export that maps to no pool, or lies
    outside the run's window, leaves no directory behind). (result, the notes to print)."""
    result = _with_observed_requests(result, checked.trace.frame)
    if checked.observed is None:
        return result, []
    return _score_observed(result, checked)


def print_observed(console, summary: dict) -> None:
    """The tables under the run's: the divergence from the export, the per-request comparison."""
    if "observed" in summary:
        from replay.cli.observed import print_divergence

        print_divergence(console, summary["observed"])
    if "observed_requests" in summary:
        from replay.outputs.observed_requests import print_comparison

        print_comparison(console, summary["observed_requests"])


def _with_observed_requests(result, trace_frame):
    """A trace from a request log with observed TTFT/E2E: compare them request by request."""
    from replay.outputs.observed_requests import compare, has_observed, with_observed

    if not has_observed(trace_frame):
        return result
    from replay.outputs.rows import RequestRows

    requests = with_observed(result.requests, trace_frame)
    return dataclasses.replace(result, request_rows=RequestRows.of(requests),
                               summary={**result.summary, "observed_requests": compare(requests)})


def _score_observed(result, checked: RunInputs):
    from replay.outputs.observed import score_run

    config, observed = checked.observed
    section, notes = score_run(observed, config, result.ticks, result.requests,
                               [p.name for p in checked.cfg.pools], checked.cfg.tick_s)
    return dataclasses.replace(result, summary={**result.summary, "observed": section}), notes


def _rows(n: int) -> str:
    return "row" if n == 1 else "rows"


def report_trace_fixes(console, trace) -> None:
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
