"""`llm-replay calibrate --experiments DIR`: fit the step model's overheads and memory efficiency and
the serving terms by replaying real vLLM experiments whole (replay/calibration/requests.py), print
the config keys found and the leave-one-model-out error, and write them to --out."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any

import yaml

FORMAT = "llm-replay-request-fit/1"
# Where the fit starts: vLLM-like overheads and an H100-like share of HBM bandwidth.
START = {"mbu": 0.8, "attention_mbu": 0.8, "per_step_overhead_us": 500.0, "per_seq_overhead_us": 10.0, "allreduce_latency_us": 6.0,
         "expert_mbu": 0.8}
ZERO_SERVING = {"api_server_us": 0.0, "tokenize_us_per_token": 0.0, "token_return_us": 0.0}


def shortened(exp: Any, max_stage_s: float | None) -> Any:
    """`exp` with each stage cut to at most `max_stage_s` seconds at its own rate."""
    if not max_stage_s:
        return exp
    stages = tuple(dataclasses.replace(s, duration_s=min(s.duration_s, max_stage_s),
                                       requests=max(1, int(s.rate_rps * min(s.duration_s, max_stage_s))))
                   for s in exp.stages)
    return dataclasses.replace(exp, stages=stages)


def targets(experiments: list[Any], max_stage_s: float | None, engine: str = "numba") -> list[Any]:
    """One calibration target per experiment: replays with the serving terms at zero, read as the
    harness read the real server (replay/measured/run.py)."""
    from replay.calibration.requests import METRICS, EngineMeans, Target
    from replay.measured import POOL, WHOLE_RUN, replay_experiment
    from replay.measured.workload import prompt_lengths

    out = []
    for exp in experiments:
        short = shortened(exp, max_stage_s)

        def replay(step_model: dict[str, float], short: Any = short) -> EngineMeans:
            r = replay_experiment(short, {"pools": {POOL: {"step_model": step_model, "serving": ZERO_SERVING}}},
                                  engine=engine)
            f = r.figures[WHOLE_RUN]
            return EngineMeans(float(f["ttft_mean"]), float(f["e2e_mean"]), short.output_tokens_counted(WHOLE_RUN),
                               r.unfinished)

        measured = {k: exp.measured[WHOLE_RUN][k] for k in METRICS}
        out.append(Target(exp.id, exp.model, measured, replay, float(prompt_lengths(exp)[1].mean())))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_requests(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.calibration.requests import METRICS, cross_validate, error_pct, fit, mape
    from replay.files import check_output_file
    from replay.measured import load_experiments
    from replay.cli.validate_measured import experiments_ready
    from common.errors import UserError

    if args.out is None:
        raise UserError("calibrate --experiments: --out FILE is required (the fit is written there)")
    folder = Path(args.experiments)
    experiments = load_experiments(folder, args.models)
    if args.only:
        known = {e.id for e in experiments}
        unknown = [i for i in args.only if i not in known]
        if unknown:
            raise UserError(f"--only {unknown[0]}: no experiment of {folder} has that exp_id")
        experiments = [e for e in experiments if e.id in args.only]
    gpus = sorted({e.gpu for e in experiments})
    if len(gpus) != 1:
        raise UserError(f"calibrate --experiments: the experiments run on {', '.join(gpus)}; a fit is for one GPU "
                        "(its memory efficiency is the GPU's): choose them with --only")
    if not any(e.tp > 1 for e in experiments):  # what the replays would find, said before any runs
        raise UserError("calibrate --experiments: the experiments cannot pin step_model.allreduce_latency_us (every "
                        "one runs at tensor_parallel_size 1; it needs an experiment at tensor_parallel_size > 1); "
                        "nothing written")
    if len(experiments) < 2:
        raise UserError(f"calibrate --experiments: {len(experiments)} experiment cannot pin the step-model terms and the "
                        "serving time; give at least 2")
    if not args.no_cv and len({e.model for e in experiments}) < 2:
        raise UserError("calibrate --experiments: cross-validation by model needs experiments of at least two models "
                        "(or --no-cv)")
    if args.max_stage_s is not None and not args.max_stage_s > 0:
        raise UserError(f"--max-stage-s: got {args.max_stage_s:g}, expected seconds > 0")
    inputs = [folder / "experiments.csv", folder / "ground_truth.csv"]
    check_output_file(args.out, force=args.force, inputs=inputs)
    err = Console(stderr=True)
    experiments_ready(err, experiments, terminal=err.is_terminal)

    def log(line: str) -> None:
        print(f"llm-replay calibrate: {line}", file=sys.stderr, flush=True)

    tgs = targets(experiments, args.max_stage_s)
    models = len({t.model for t in tgs})
    log(f"fitting {len(tgs)} experiments of {models} model{'s' if models > 1 else ''} on {gpus[0]}")
    result = fit(tgs, START, log=log)
    in_sample = {t.name: error_pct(result.predicted[t.name], t.measured) for t in tgs}
    cv = None if args.no_cv else cross_validate(tgs, result.step_model, log=log)
    document = {
        "format": FORMAT,
        "gpu": gpus[0],
        "step_model": result.step_model,
        "serving": result.serving,
        "not_pinned": result.unpinned,
        # one client-side time is fitted; its split is the rule of replay/calibration/requests.py _serving
        "serving_fitted": "api_server_us + tokenize_us_per_token x prompt + token_return_us, as one sum: "
                          "api_server_us and tokenize_us_per_token are vLLM's (replay/model/serving.py), "
                          "the rest returns",
        "experiments": [{"exp_id": e.id, "model": e.model, "tensor_parallel_size": e.tp,
                         "vllm_version": e.vllm_version, "workload": e.workload} for e in experiments],
        "fit": {"cost": round(result.cost, 5), "iterations": result.iterations,
                "mape_pct": {k: round(v, 2) for k, v in mape(list(in_sample.values())).items()},
                "error_pct": {name: {k: round(v, 2) for k, v in e.items()} for name, e in in_sample.items()}},
        "provenance": {
            "data": folder.name, **{f"{p.name}_sha256": _sha256(p) for p in inputs},
            "method": ("Levenberg-Marquardt on the squared log errors of each experiment's whole-run mean TTFT, ITL "
                       f"and E2E, every experiment replayed whole with each stage cut to {args.max_stage_s:g} s; "
                       "the serving time solved per replay; cross-validation leaves one model out"),
            "command": "llm-replay calibrate --experiments " + folder.name
                       + "".join(f" --only {i}" for i in args.only) + f" --max-stage-s {args.max_stage_s:g}",
        },
    }
    if cv is not None:
        document["cross_validation"] = {
            "by": cv["by"], "folds": cv["folds"], "mape_pct": {k: round(v, 2) for k, v in cv["mape_pct"].items()},
            "error_pct": {r["experiment"]: {k: round(v, 2) for k, v in r["error_pct"].items()} for r in cv["rows"]}}
    Path(args.out).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    _print(Console(width=max(Console().width, 100)), document, METRICS, args.out)
    return 0


def _print(console: Any, doc: dict[str, Any], metrics: tuple[str, ...], out: str) -> None:
    from rich.table import Table

    t = Table(title=f"request-level fit on {doc['gpu']}: error of the whole-run means")
    t.add_column("experiment")
    for k in metrics:
        t.add_column(f"{k.split('_')[0]} in-sample", justify="right")
        if "cross_validation" in doc:
            t.add_column(f"{k.split('_')[0]} held out", justify="right")
    cv = doc.get("cross_validation", {}).get("error_pct", {})
    for name, e in doc["fit"]["error_pct"].items():
        cells = []
        for k in metrics:
            cells.append(f"{e[k]:+.1f}%")
            if "cross_validation" in doc:
                cells.append(f"{cv[name][k]:+.1f}%")
        t.add_row(name, *cells)
    console.print(t)
    console.print("MAPE in-sample: " + ", ".join(f"{k} {v:.1f}%" for k, v in doc["fit"]["mape_pct"].items()))
    if "cross_validation" in doc:
        console.print(f"MAPE leave-one-model-out ({doc['cross_validation']['folds']} models): "
                      + ", ".join(f"{k} {v:.1f}%" for k, v in doc["cross_validation"]["mape_pct"].items()))
    console.print("config keys (a pool's step_model: and serving:):")
    console.print(yaml.safe_dump({"step_model": doc["step_model"], "serving": doc["serving"]}, sort_keys=False))
    console.print(f"written to {out}")
