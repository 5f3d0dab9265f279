"""`llm-replay calibrate --observed FILE... [--config C] [TRACE] --out keys.yaml`: replay the
trace, read what the observed export pins (replay/calibration/observed.py), replay again with
those keys applied, and print the keys as YAML to paste into the config with the divergence per
signal and pool before and after. --out gets the same YAML."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from common.errors import UserError

# Flags of the other two ways calibrate runs, meaningless here.
OTHER_FLAGS = (("experiments", None), ("model", None), ("gpu", None), ("tp", None), ("models", None),
               ("only", []), ("no_cv", False), ("format", "splitwise"))
PINNING = ("vllm:cache_config_info", "kube_deployment_status_replicas")


def _trace_args(trace: str | None) -> argparse.Namespace:
    """The trace flags of `run`, none given, with TRACE: the config's trace section as written."""
    from replay.cli.trace_options import add_trace_options

    parser = argparse.ArgumentParser(add_help=False)
    add_trace_options(parser)
    ns = parser.parse_args([])
    ns.trace = trace
    return ns


def _replay(trace, cfg, source: str):
    from replay.fleet.cluster import plan_pools
    from replay.run import replay_trace

    plans = plan_pools(cfg, source)
    return plans, replay_trace(trace, cfg, engine="numba", plans=plans, config_source=source)


def run_observed(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.calibration import observed as pin
    from replay.cli.observed import check_against_trace, print_notes, read_observed_files
    from replay.cli.trace_options import effective_trace, trace_limits
    from replay.config import load_config
    from replay.files import check_output_file
    from replay.fleet.cluster import plan_pools
    from replay.fleet.ticks import check_tick_count
    from replay.outputs.observed import run_grid, score_run
    from traces import load_from_config
    from traces.observed import align, select

    given = [f"--{name.replace('_', '-')}" for name, default in OTHER_FLAGS if getattr(args, name) != default]
    if given:
        raise UserError(f"calibrate --observed: fits the fleet config to an observed export, so it takes no "
                        f"{', '.join(given)} (those are for step times or --experiments)")
    cfg = load_config(args.config, plugins=[])
    source = args.config or "default fleet"
    names = [p.name for p in cfg.pools]
    plan_pools(cfg, source)  # a fleet that cannot start fails before anything is read
    ns = _trace_args(args.profile_csv)
    base_dir = Path(args.config).resolve().parent if args.config else None
    cfg = dataclasses.replace(cfg, trace=effective_trace(cfg.trace, ns, base_dir))
    inputs = [p for p in [args.config, args.profile_csv, *args.observed] if p]
    check_output_file(args.out, force=args.force, inputs=inputs)
    config, observed = read_observed_files(args.observed, cfg.observed, source, names)
    found = set(observed.series["metric"].to_list())
    if not found & set(PINNING):
        raise UserError(f"{', '.join(args.observed)}: no series that pins a config key (expected "
                        f"{' or '.join(PINNING)}; found {', '.join(sorted(found)) or 'none'})")
    cfg = dataclasses.replace(cfg, observed=config)
    trace = load_from_config(cfg.trace, strict=ns.strict, limits=trace_limits(ns))
    check_tick_count(trace.frame, cfg)
    check_against_trace(config, observed, names, trace.frame, cfg.max_drain_s)

    plans, before = _replay(trace, cfg, source)
    grid = run_grid(before.ticks, cfg.tick_s)
    mapped = select(observed, config, names, (grid.start_s, grid.start_s + grid.tick_s * (grid.n - 1)))
    aligned = align(mapped, grid, config).values
    suggestions, notes = [], []
    for i, plan in enumerate(plans):
        s, n = pin.kv_blocks(i, plan.name, mapped.gpu_blocks.get(plan.name, ()), int(plan.capacity.kv_blocks))
        suggestions += s
        notes += n
        if ("replicas", plan.name) in aligned:
            frame = before.ticks.filter(pl.col("pool") == plan.name).sort("t_us")
            ran = (frame["replicas_active"] + frame["replicas_loading"]).cast(pl.Float64).to_numpy()
            s, n = pin.replicas(i, plan.name, plan.config, aligned[("replicas", plan.name)], ran, grid.times())
            suggestions += s
            notes += n
    suggestions += pin.windows(config, pin.scrape_interval_s(mapped.samples.frame(), mapped.series))
    section_before, left_out = score_run(observed, config, before.ticks, before.requests, names, cfg.tick_s)
    section_after = section_before
    if suggestions:
        try:
            fixed = pin.apply(cfg, suggestions)
        except ValueError as exc:
            raise UserError(f"calibrate --observed: the suggested keys do not make a valid config: {exc}") from None
        _, after = _replay(trace, fixed, source)
        section_after, _ = score_run(observed, fixed.observed, after.ticks, after.requests, names, cfg.tick_s)
    text = pin.as_yaml(suggestions, names)
    document = {"suggested": {s.path: s.value for s in suggestions}, "why": {s.path: s.why for s in suggestions},
                "mape": _mape(section_before, section_after), "notes": notes}
    Path(args.out).write_text(text or "# the observed export pins nothing the config does not already set\n",
                              encoding="utf-8")
    print_notes(Console(stderr=True), left_out)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print(Console(), text, document, args.out)
    return 0


def _mape(before: dict, after: dict) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for signal in sorted(set(before["signals"]) | set(after["signals"])):
        for pool in sorted(set(before["signals"].get(signal, {})) | set(after["signals"].get(signal, {}))):
            pick = (lambda s: s["signals"].get(signal, {}).get(pool, {}).get("mape"))
            out.setdefault(signal, {})[pool] = {"before": pick(before), "after": pick(after)}
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.1%}"


def _print(console: Any, text: str, document: dict, out: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    if not console.is_terminal:  # a file or pipe gets whole lines, not folded YAML
        console = type(console)(width=max(console.width, 160))
    if text:
        console.print("config keys the observed export pins (merge into the config):")
        console.print(escape(text), soft_wrap=True, highlight=False)
    else:
        console.print("the observed export pins nothing the config does not already set")
    table = Table(title="MAPE before and after the keys" if text else "MAPE, observed vs replayed")
    for name, justify in (("signal", "left"), ("pool", "left"), ("before", "right"), ("after", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for signal, pools in document["mape"].items():
        for pool, m in pools.items():
            table.add_row(escape(signal), escape(pool), _pct(m["before"]), _pct(m["after"]))
    console.print(table)
    for line in document["notes"]:
        console.print(f"note: {escape(line)}", soft_wrap=True, highlight=False)
    console.print(f"written to {out}")
