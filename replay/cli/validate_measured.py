"""`llm-replay validate vllm-s2r --data DIR`: replay the real vLLM experiments of a measurements
folder (replay/measured/) and print measured vs replayed TTFT, ITL and E2E per experiment and stage,
then the MAPE per metric family for each set. Exit 0 when it ran (the set has no pass/fail
tolerance), 2 for bad input."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

NAME = "vllm-s2r"
NO_DATA = (f"validate {NAME}: pass the measurements folder with --data DIR (the folder holding experiments.csv "
           "and ground_truth.csv, e.g. ../shared/measurements/vllm-s2r; its files may not be shipped, so there "
           "is no default)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.measured import load_experiments, replay_experiment
    from replay.measured.compare import compare, mape
    from common.errors import UserError

    if args.data is None:
        raise UserError(NO_DATA)
    experiments = load_experiments(args.data, args.models)
    if args.only:
        known = [e.id for e in experiments]
        unknown = [name for name in args.only if name not in known]
        if unknown:
            raise UserError(f"--only {unknown[0]}: no experiment of {args.data} has that exp_id; known: "
                            f"{', '.join(known)}")
        experiments = [e for e in experiments if e.id in args.only]
    err = Console(stderr=True)
    show = err.is_terminal and not args.json
    if args.engine == "numba":
        experiments_ready(err, experiments, terminal=show, quiet=args.json)
    results, rows = [], []
    with err.status("loading the experiments", spinner="dots") if show else contextlib.nullcontext() as status:
        for i, exp in enumerate(experiments, start=1):
            if status is not None:
                status.update(f"experiment {i}/{len(experiments)}: {exp.id} ({exp.model}, TP{exp.tp})")
            result = replay_experiment(exp, engine=args.engine)
            results.append(result)
            rows.extend(compare(result))
    errors = mape(rows)
    if args.json:
        print(json.dumps({"set": NAME, "data": str(args.data), "experiments": [_describe(r) for r in results],
                          "rows": [r.to_dict() for r in rows], "mape": errors}, indent=2))
    else:
        console = Console()
        if not console.is_terminal:  # a file or pipe gets whole rows, not wrapped cells
            console = Console(width=200)
        print_table(console, results, rows, errors)
    return 0


def _describe(result: Any) -> dict[str, Any]:
    exp = result.experiment
    return {
        "id": exp.id, "set": exp.set, "model_hf": exp.model_hf, "model": exp.model, "gpu": exp.gpu, "tp": exp.tp,
        "workload": exp.workload, "stages_rps": [s.rate_rps for s in exp.stages], "unsafe": exp.unsafe,
        "not_modelled": list(exp.not_modelled()), "unfinished": result.unfinished,
        "replay_wall_s": round(result.wall_s, 3),
        "saturation": _saturation(result),
        "measured": {str(stage): figures for stage, figures in sorted(exp.measured.items())},
        "replayed": {str(stage): figures for stage, figures in sorted(result.figures.items())},
    }


def _saturation(result: Any) -> dict[str, Any]:
    from replay.measured.compare import measured_class, replayed_classes

    replayed = replayed_classes(result)
    want = measured_class(result.experiment)
    return {"measured": want, "replayed": {str(k): v for k, v in sorted(replayed.items())},
            "differs": replayed[-1] != want}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0f}%" if abs(v) >= 100 else f"{v:+.1f}%"


def print_table(console: Any, results: list, rows: list, errors: dict) -> None:
    from rich.table import Table

    by_key = {(r.experiment, r.stage, r.metric): r for r in rows}
    t = Table(title=f"validation: {NAME} (real vLLM v0.15.1, measured at the client; times in ms)")
    for name in ("experiment", "set", "model", "stage"):
        t.add_column(name, justify="left")
    for family in ("TTFT", "ITL", "E2E"):
        t.add_column(f"{family} meas", justify="right")
        t.add_column("replay", justify="right")
        t.add_column("err", justify="right")
    t.add_column("class", justify="left")
    t.add_column("notes", justify="left")
    differs = []
    for result in results:
        exp = result.experiment
        sat = _saturation(result)
        if sat["differs"]:
            differs.append(f"{exp.id} (replayed {sat['replayed']['-1']}, measured {sat['measured']})")
        stages = [-1, *(s.index for s in exp.stages)] if len(exp.stages) > 1 else [-1]
        for stage in stages:
            label = "all" if stage == -1 else f"{stage}: {exp.stages[stage].rate_rps:g}/s"
            if stage == -1 and len(exp.stages) == 1:
                label = f"all: {exp.stages[0].rate_rps:g}/s"
            cells = []
            for metric in ("ttft_mean", "itl_mean", "e2e_mean"):
                row = by_key.get((exp.id, stage, metric))
                cells += [_ms(row.measured if row else None), _ms(row.replayed if row else None),
                          _pct(row.error_pct if row else None)]
            notes = []
            if stage == -1:
                notes += (["unsafe: overloaded for real"] if exp.unsafe else []) + list(exp.not_modelled())
                if result.unfinished:
                    notes.append(f"{result.unfinished} unfinished")
            head = (exp.id, exp.set, f"{exp.model} TP{exp.tp}") if stage == -1 else ("", "", "")
            cls = sat["replayed"][str(stage)] if str(stage) in sat["replayed"] else sat["replayed"]["-1"]
            if stage == -1 and sat["differs"]:
                cls = f"[red]{cls} (measured {sat['measured']})[/]"
            t.add_row(*head, label, *cells, cls, "; ".join(notes))
    console.print(t)
    console.print(f"saturation: {len(results) - len(differs)} of {len(results)} runs replay in their measured class"
                  + (f"; differs: {', '.join(differs)}" if differs else ""), soft_wrap=True)
    m = Table(title="MAPE of the means (|replayed - measured| / measured)")
    for name in ("set", "over", "rows", "TTFT", "ITL", "E2E"):
        m.add_column(name, justify="left" if name in ("set", "over") else "right")
    for set_name, scopes in errors.items():
        for scope, families in scopes.items():
            n = max(f["rows"] for f in families.values())
            if not n:
                continue
            cells = [f"{f['mape_pct']:.1f}%" if f["mape_pct"] is not None else "-" for f in families.values()]
            m.add_row(set_name, "whole runs" if scope == "whole_run" else "stages", str(n), *cells)
    console.print(m)


def experiments_ready(err, experiments, *, terminal: bool, quiet: bool = False) -> None:
    """The numba kernels of every variant the experiments' replays run, compiled or loaded."""
    from replay.outputs.report import engine_ready

    for variant in experiment_variants(experiments):
        engine_ready(err, terminal=terminal, quiet=quiet, variant=variant)


def experiment_variants(experiments) -> list[str]:
    """The kernel variants the experiments' replays run (replay.run.fleet_variants); an
    experiment whose fleet cannot be built counts for none (its replay says why)."""
    from replay.measured.fleet import experiment_fleet
    from replay.run import fleet_variants
    from common.errors import UserError

    fleets = []
    for exp in experiments:
        try:
            fleets.append((experiment_fleet(exp), exp.id))
        except UserError:
            continue
    return fleet_variants(fleets)
