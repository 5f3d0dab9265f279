"""`llm-replay calibrate`: fit the step model to measured step times, print the cross-validated
error per measured column, and write a profile a config can use (`step_model: {profile: ...}`)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from replay.calibration.data import FORMATS, GENERIC_HELP
from replay.cli.observed import add_observed_option

DESCRIPTION = f"""\
Fit the step model's efficiencies and overheads (mfu, mbu, per-step, per-sequence and prefill
overheads) to measured step times and report k-fold cross-validated error (MAPE) per measured
column; folds hold out whole configurations, repetitions included. Where the data bend, the fit
also places a matmul knee: tokens of a step past knee_tokens compute at past_knee_mfu (the
position is searched on a grid and kept only if it predicts held-out configurations better;
the search is repeated inside every cross-validation fold).

splitwise: SplitwiseSim's perf_model.csv (model, hardware, prompt_size, batch_size, token_size,
prompt_time, token_time, e2e_time, tensor_parallel; times in ms). prompt_time is read as one
prefill step of batch_size x prompt_size tokens, token_time as one decode step of batch_size
sequences at the mean context prompt_size + generated/2. Names map to the catalog: llama2-70b ->
llama-2-70b, a100-80gb -> a100-sxm-80gb, h100-80gb -> h100-sxm-80gb. h100-80gb-pcap rows (derived,
not measured) and TP 2 batch 64 rows (anomalous) are excluded and counted. Without --tp every TP
in the file gets its own fit.

{textwrap.fill(GENERIC_HELP, 100)}

Request level (--experiments DIR, instead of PROFILE.csv): replay real vLLM experiments whole (a
measurements folder as `validate vllm-s2r` reads it) and fit the step model's memory efficiency
(mbu), per-step and per-sequence overheads and all-reduce latency, and the serving terms, to the
client-measured mean TTFT, ITL and E2E; then leave-one-model-out cross-validation. Prints the
config keys it found and writes them (with the errors) to --out. One GPU per fit.

Observed (--observed FILE... [--config C] [TRACE], instead of PROFILE.csv): replay the trace on
the fleet, read what the observed export pins (the KV block count from vllm:cache_config_info's
num_gpu_blocks, replica counts from kube_deployment_status_replicas, the PromQL windows from its
scrape interval), replay again with those keys applied, and print them as YAML to merge into
the config (also written to --out) with the MAPE per signal and pool before and after.
"""


def add_parser(sub: Any) -> None:
    cal = sub.add_parser("calibrate", help="fit the step model to measured step times (writes a profile)",
                         description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    cal.add_argument("profile_csv", metavar="PROFILE.csv", nargs="?",
                     help="measured step times (with --observed: the trace, default the config's)")
    cal.add_argument("--model", help="catalog model id (llm-replay catalog); step times only")
    cal.add_argument("--gpu", help="catalog GPU id (llm-replay catalog); step times only")
    cal.add_argument("--experiments", metavar="DIR",
                     help="request level: a folder of real vLLM experiments (experiments.csv, ground_truth.csv)")
    cal.add_argument("--models", metavar="DIR", help="request level: folder of config.json files for models "
                                                      "not in the catalog")
    cal.add_argument("--only", action="append", default=[], metavar="ID",
                     help="request level: fit only these exp_ids (repeatable)")
    cal.add_argument("--max-stage-s", type=float, default=240.0, metavar="S",
                     help="request level: replay at most S seconds of each stage while fitting (default 240; "
                          "the rate, not the length, sets a stage's latencies)")
    cal.add_argument("--no-cv", action="store_true", help="request level: skip the cross-validation")
    cal.add_argument("--tp", type=int, default=None,
                     help="tensor parallel size of the measurements (splitwise: keep only this TP; generic: 1)")
    cal.add_argument("--format", choices=FORMATS, default="splitwise", help="CSV layout (default: splitwise)")
    cal.add_argument("--folds", type=int, default=5, help="k of the k-fold cross-validation (default 5)")
    cal.add_argument("--out", "-o", required=True, help="profile YAML to write (a new file, or with --force an existing one)")
    cal.add_argument("--force", action="store_true", help="replace --out if it already exists (never an input)")
    cal.add_argument("--json", action="store_true", help="print the profile as JSON instead of the table")
    cal.add_argument("--config", "-c", help="observed: the fleet config to fit (default: the built-in fleet)")
    add_observed_option(cal, help="observed serving metrics of the trace's window: suggest the config keys they "
                                  "pin (several after one flag, so put the trace before it)")


def run(args: argparse.Namespace) -> int:
    from common.errors import UserError

    if args.observed:
        from replay.cli.calibrate_observed import run_observed

        return run_observed(args)
    if args.config is not None:
        raise UserError("calibrate --config: applies with --observed (fit a fleet config to an observed export)")
    if args.experiments is not None:
        if args.profile_csv is not None or args.model or args.gpu or args.tp is not None:
            raise UserError("calibrate --experiments: fits whole experiments, so it takes no PROFILE.csv, --model, "
                            "--gpu or --tp (each experiment names its own)")
        from replay.cli.calibrate_requests import run_requests

        return run_requests(args)
    if args.profile_csv is None:
        raise UserError("calibrate: give PROFILE.csv (measured step times) with --model and --gpu, or --experiments "
                        "DIR (real vLLM experiments)")
    for flag in ("model", "gpu"):
        if getattr(args, flag) is None:
            raise UserError(f"calibrate {args.profile_csv}: --{flag} is required with step times")
    return _run_steps(args)


def _run_steps(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.calibration.steps import check_fit, cross_validate, fit_knee, step_shape, terms, unit_params
    from replay.calibration.data import read_generic, read_splitwise
    from replay.calibration.profiles import profile_document, write_profile
    from replay.files import check_output_file
    from replay.model.specs import get_gpu, get_model
    from replay.model.stepmodel import DEFAULT_ALLREDUCE_LATENCY_US
    from common.errors import UserError

    model, gpu = get_model(args.model).id, get_gpu(args.gpu).id
    if args.tp is not None and args.tp <= 0:
        raise UserError(f"--tp: got {args.tp}, expected a whole number > 0")
    if args.folds < 2:
        raise UserError(f"--folds: got {args.folds}, expected at least 2")
    path = Path(args.profile_csv)
    # before the fit: an --out that is the input, a FIFO or an existing file is refused, not replaced
    check_output_file(args.out, force=args.force, inputs=[path])
    if args.format == "splitwise":
        data = read_splitwise(path, model, gpu, args.tp)
        weight_dtype = "fp16"  # the Splitwise profile ran FP16 checkpoints
    else:
        data = read_generic(path, args.tp or 1)
        weight_dtype = None
    fits, notes = [], []
    for tp in sorted(set(data.tp.tolist())):
        sub = data.take(data.tp == tp)
        try:
            params = unit_params(step_shape(model, gpu, tp, weight_dtype), DEFAULT_ALLREDUCE_LATENCY_US)
        except UserError as exc:
            raise UserError(f"{path}: tensor_parallel {tp}: {exc}") from None
        t = terms({tp: params}, sub)
        coef = fit_knee(t, sub.step_us, sub.config)
        check_fit(t, coef, f"{path}: tensor_parallel {tp}")
        errors = cross_validate(t, sub, k=args.folds, coef=coef)
        configs = len(set(sub.config.tolist()))
        if configs < args.folds:
            notes.append(f"tensor_parallel {tp}: {configs} batch compositions, so {configs}-fold cross-validation "
                         f"(one composition held out at a time), not {args.folds}-fold")
        fits.append({
            "tensor_parallel_size": int(tp),
            "step_model": {**{k: round(float(v), 6) for k, v in coef.items()}, "knee_tokens": int(coef["knee_tokens"]),
                           "allreduce_latency_us": DEFAULT_ALLREDUCE_LATENCY_US},
            "points": len(sub),
            "error": [{"column": e.column, "points": e.points, "cv_mape_pct": round(e.cv_mape_pct, 2),
                       "fit_mape_pct": round(e.fit_mape_pct, 2), "noise_mape_pct": round(e.noise_mape_pct, 2),
                       "cv_max_ape_pct": round(e.cv_max_ape_pct, 1)} for e in errors],
        })
    provenance = {
        "source_file": path.name,
        "source_sha256": data.sha256,
        "format": args.format,
        "weight_dtype": weight_dtype or get_model(model).default_weight_dtype,
        "rows_read": data.rows_read,
        "rows_used": int(data.rows_read - sum(data.excluded.values())),
        "rows_excluded": dict(sorted(data.excluded.items())),
        "method": (f"{min(args.folds, len(set(data.config.tolist())))}-fold cross-validation, folds by "
                   "configuration (repetitions stay together); fit minimises mean absolute percentage error; "
                   "allreduce_latency_us is assumed, not fitted (a fixed cost per step, which the per-step "
                   "overhead absorbs)"),
        "command": "llm-replay calibrate " + " ".join(
            [path.name, "--model", model, "--gpu", gpu, "--format", args.format]
            + (["--tp", str(args.tp)] if args.tp is not None else []) + ["--folds", str(args.folds)]),
    }
    document = profile_document(model, gpu, fits, provenance)
    write_profile(args.out, document)
    for note in notes:
        print(f"llm-replay calibrate: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        # the coefficient table is about 110 columns wide: never fold it into a narrower pipe or log
        print_table(Console(width=max(Console().width, 112)), document, args.out)
    return 0


def print_table(console: Any, document: dict[str, Any], out: str) -> None:
    from rich.table import Table

    prov = document["provenance"]
    errors = Table(title=f"{document['model']} on {document['gpu']}: step-time error (MAPE)")
    for name in ("TP", "column", "points", "cross-validated", "in-sample", "noise floor", "worst (CV)"):
        errors.add_column(name, justify="left" if name == "column" else "right")
    coefs = Table(title="fitted coefficients")
    for name in ("TP", "mfu", "mbu", "per step us", "per seq us", "prefill us", "knee tokens", "mfu past knee",
                 "all-reduce us (assumed)"):
        coefs.add_column(name, justify="right")
    for f in document["fits"]:
        tp, c = str(f["tensor_parallel_size"]), f["step_model"]
        for e in f["error"]:
            errors.add_row(tp, e["column"], str(e["points"]), f"{e['cv_mape_pct']:.1f}%", f"{e['fit_mape_pct']:.1f}%",
                           f"{e['noise_mape_pct']:.1f}%", f"{e['cv_max_ape_pct']:.0f}%")
        coefs.add_row(tp, f"{c['mfu']:.3f}", f"{c['mbu']:.3f}", f"{c['per_step_overhead_us']:,.0f}",
                      f"{c['per_seq_overhead_us']:,.0f}", f"{c['prefill_overhead_us']:,.0f}",
                      f"{c['knee_tokens']:,}" if c["knee_tokens"] else "none",
                      f"{c['past_knee_mfu']:.3f}" if c["knee_tokens"] else "-", f"{c['allreduce_latency_us']:g}")
    console.print(errors)
    console.print(coefs)
    console.print(f"rows: {prov['rows_read']} read, {prov['rows_used']} used")
    for reason, count in prov["rows_excluded"].items():
        console.print(f"  not used, {count}: {reason}", soft_wrap=True)
    console.print(f"profile written to {out}")
