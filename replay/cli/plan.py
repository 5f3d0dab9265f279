"""`llm-replay plan`: the cheapest fleet that meets an SLO on a trace (replay/plan/)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from common.errors import UserError
from replay.cli.parsing import add_plugin_option
from replay.cli.trace_options import add_trace_options


def add_parser(sub: Any) -> None:
    from traces import DEFAULT_TRACE

    p = sub.add_parser("plan", help="the cheapest fleet (GPU, TP, precision, replicas per pool) that meets an "
                                    "SLO on a trace")
    p.add_argument("trace", nargs="?", default=None,
                   help=f"trace file or bundled trace name (default: the config's trace, else {DEFAULT_TRACE})")
    p.add_argument("--config", "-c", help="base fleet config: its pools, policies and engine settings are kept "
                                          "(default: the built-in fleet)")
    p.add_argument("--slo", help="targets to meet, e.g. ttft_ms=2000,tpot_ms=100 (default: the config's slo)")
    p.add_argument("--attainment", type=float, default=0.99,
                   help="share of requests that must meet the SLO, in (0, 1] (default 0.99)")
    p.add_argument("--gpu", help="GPUs to try, comma-separated (default: the config's)")
    p.add_argument("--tp", help="tensor-parallel sizes to try, e.g. 1,2,4,8 (default: the config's)")
    p.add_argument("--quantization", default="none",
                   help="weight precisions to try: none (the checkpoint's own), fp8, int8, int4, bf16 (default none)")
    p.add_argument("--max-replicas", type=int, default=64, help="most replicas per pool to try (default 64)")
    p.add_argument("--workers", type=int, default=None,
                   help="replays at once, in worker processes (default: one per core, at most one per candidate; "
                        "with ray and no --address, the local cluster's CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local worker processes (default), or a Ray cluster (pip install 'llm-replay[ray]')")
    p.add_argument("--address", metavar="ADDR", help="--backend ray: the cluster's HOST:PORT (default: start a local one)")
    p.add_argument("--out", "-o", help="write the winning fleet config here (YAML), for llm-replay run --config")
    p.add_argument("--plot", metavar="FILE", help="also draw cost against attainment and TTFT p99 (.svg or .png; "
                                                   "needs the plot extra: pip install 'llm-replay[plot]')")
    p.add_argument("--force", action="store_true", help="replace --out or --plot if it exists")
    p.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    add_plugin_option(p)
    add_trace_options(p)


def _space(args: argparse.Namespace, base) -> Any:
    from replay.plan.space import build_space, parse_gpus, parse_quantizations, parse_tps

    gpus = parse_gpus(args.gpu) if args.gpu else sorted({p.gpu or base.gpu for p in base.pools})
    tps = parse_tps(args.tp) if args.tp else sorted({p.tensor_parallel_size for p in base.pools})
    return build_space(args.slo, args.attainment, gpus, tps, parse_quantizations(args.quantization),
                       args.max_replicas)


def _check_outputs(args: argparse.Namespace, inputs: tuple) -> None:
    from replay.files import check_output_file
    from replay.plan.report import check_plot_path

    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            if not path.strip():
                raise UserError(f"plan: {flag}: empty path")
            check_output_file(path, force=args.force, inputs=inputs, flag=flag)
    if args.plot:
        check_plot_path(args.plot)
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise UserError(f"plan: --workers: got {args.workers}, expected 1 .. 256")
    from replay.sweep.ray_backend import check_backend

    check_backend(args.backend, args.address, "plan: ")  # before the trace is read


def _prepare(args: argparse.Namespace):
    """Config, search space, outputs, then the trace: every mistake before anything replays."""
    from replay.cli.run import command_inputs
    from replay.cli.trace_options import effective_trace, trace_limits
    from replay.config import load_config
    from replay.fleet.ticks import check_tick_count
    from replay.plan.fleet import with_slo
    from traces import load_from_config

    # The base need not run as it is (its GPU or TP may not fit the model): the candidates replace
    # both, and a candidate that cannot be built is reported with its reason.
    base = load_config(args.config, plugins=args.plugin)
    if base.split.prefill_pool is not None:
        raise UserError(f"plan: {args.config}: split.prefill_pool: a prefill/decode fleet's pools depend on each "
                        "other; plan searches workload pools only")
    space = _space(args, base)
    base_dir = Path(args.config).resolve().parent if args.config else None
    trace_cfg = effective_trace(base.trace, args, base_dir)
    base = dataclasses.replace(with_slo(base, space.slo),
                               trace=effective_trace(base.trace, args, base_dir, absolute=True))
    _check_outputs(args, command_inputs(args.config, base))
    trace = load_from_config(trace_cfg, strict=args.strict, limits=trace_limits(args))
    check_tick_count(trace.frame, base)
    return base, space, trace


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from replay.outputs.report import engine_ready
    from replay.plan.driver import default_workers, executor
    from replay.plan.plan import make_plan
    from replay.plan.report import plan_yaml, print_plan, write_figure
    from replay.files import write_atomically

    base, space, trace = _prepare(args)
    err = Console(stderr=True)
    from replay.plan.fleet import start_replicas, uniform
    from replay.run import fleet_variants

    fleets = ((uniform(base, c, start_replicas(base)), "plan") for c in space.candidates)
    for variant in fleet_variants(fleets):  # compiled here once, so that no two workers compile
        engine_ready(err, terminal=err.is_terminal, variant=variant)
    workers = args.workers or default_workers(len(space.candidates))
    started = time.monotonic()
    on = " on Ray" if args.backend == "ray" else ""
    err.print(f"plan: {len(space.candidates)} candidates on {trace.frame.height:,} requests, {workers} "
              f"worker{'s' if workers > 1 else ''}{on}", highlight=False)

    def progress(trial) -> None:
        s = trial.summary
        err.print(f"  {time.monotonic() - started:6.1f} s  {', '.join(_fleet_of(trial))}: attainment "
                  f"{100 * (s['slo_attainment'] or 0):.2f}%, ${s['cost_usd']:,.2f}", highlight=False)

    with executor(trace, workers, list(args.plugin or []), "numba", args.backend, args.address) as pool:
        plan = make_plan(base, space, pool, "numba", on_trial=progress)
    slo = {"ttft_ms": base.slo.ttft_ms, "tpot_ms": base.slo.tpot_ms}
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
    else:
        print_plan(Console(), plan, space.attainment, slo)
    if plan.winner is not None and args.out:
        write_atomically(args.out, lambda fh: fh.write(plan_yaml(plan, str(trace.source), space.attainment, slo)))
        err.print(f"winning config written to {args.out}", highlight=False)
    if args.plot:
        write_figure(args.plot, plan, space.attainment)
        err.print(f"figure written to {args.plot}", highlight=False)
    return 0 if plan.winner is not None else 1


def _fleet_of(trial) -> list[str]:
    return [f"{p.name} {p.replicas if p.autoscaler is None else f'<={p.autoscaler.max_replicas}'} x {p.gpu} "
            f"tp{p.tensor_parallel_size} {p.weight_dtype or 'native'}" for p in trial.cfg.pools]


def plan_json(plan) -> dict:
    def fleet(f):
        return None if f is None else {
            "pools": {p: {"gpu": c.gpu, "tensor_parallel_size": c.tp, "weight_dtype": c.weight_dtype, "replicas": n}
                      for p, (c, n) in f.choice.items()},
            **{k: f.summary[k] for k in ("cost_usd", "cost_per_mtok_all_usd", "gpu_hours", "slo_attainment",
                                         "ttft_p99_ms", "tpot_p99_ms")},
        }

    return {
        "winner": fleet(plan.winner),
        "ranked": [fleet(f) for f in plan.ranked],
        "best_found": fleet(plan.best_found),
        "candidates": [{"gpu": o.candidate.gpu, "tensor_parallel_size": o.candidate.tp,
                        "weight_dtype": o.candidate.weight_dtype, "replicas": o.replicas, "problem": o.problem}
                       for o in plan.outcomes],
        "frontier": [{"fleet": _fleet_of(t), "cost_usd": t.summary["cost_usd"],
                      "slo_attainment": t.summary["slo_attainment"], "ttft_p99_ms": t.summary["ttft_p99_ms"]}
                     for t in plan.frontier],
        "replays": plan.replays,
    }

