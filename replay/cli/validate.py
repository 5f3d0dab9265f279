"""`llm-replay validate SCENARIOS.yaml`: replay each scenario, compare with published measurements,
print predicted vs expected per row and the MAPE per metric group. Exit 0: every row within its
tolerance; 1: some row outside it (or a replay that left requests unfinished); 2: bad input.
`llm-replay validate vllm-s2r --data DIR` replays real vLLM experiments instead
(replay/cli/validate_measured.py); `llm-replay validate RUN --observed FILE...` scores a run
directory against observed serving metrics (replay/cli/validate_observed.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

EXIT_SOME_FAILED = 1
SHIPPED = {"published": "published.yaml", "lambda-v0": "lambda_v0.yaml"}

DESCRIPTION = """\
Replay validation scenarios and compare the predictions with measured figures.

A scenario file is YAML:

  tolerance: 0.2                 # default relative tolerance (0.2 = 20%)
  scenarios:
    - name: llama8b-h100-static
      source: "URL, table/figure, setup (GPU, TP, dtype, lengths, concurrency)"
      fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb, pools: [{replicas: 1}]}   # or a path
      workload: {kind: static-batch, batch: 8, prompt_tokens: 32, output_tokens: 128}
      checks:
        - {metric: e2e_p50_ms, expected: 833.5}
        - {metric: tpot_p50_ms, expected: 6.4, tolerance: 0.1}

Workloads (all requests identical unless lengths are listed):
  static-batch: batch, prompt_tokens, output_tokens (all arrive at t=0)
  offline:      requests, prompt_tokens, output_tokens (t=0); or prompt_tokens and
                output_tokens as lists, one entry per request
  poisson:      rate_rps, duration_s or requests, prompt_tokens and output_tokens, or
                lengths_from (a bundled trace or a trace path), seed (default 0)

Metrics: output_throughput_tok_s, total_throughput_tok_s, request_throughput_rps,
ttft_{mean,p50,p99}_ms, tpot_{mean,p50,p99}_ms, e2e_{mean,p50,p99}_ms. Throughput is over
the span from the first arrival to the last finish. Replays run until every request finishes.

'published' names the shipped file of published measurements (replay/scenarios/published.yaml).
'lambda-v0' names the shipped set of Lambda's other vLLM V0 runs that V0's host terms are fitted
on (replay/scenarios/lambda_v0.yaml; not the published rows).
Exit codes: 0 every row passes, 1 some row fails, 2 bad input.

'vllm-s2r' names a set of real vLLM experiments whose files are not shipped (their licence does
not allow it): --data DIR is the folder holding experiments.csv and ground_truth.csv, --models DIR
holds <name>/config.json for models the catalog lacks, --only takes exp_ids. It prints measured vs
replayed TTFT, ITL and E2E means per experiment and stage (p90/p99 too with --json), then the
MAPE per family; exit 0 when it ran, 2 bad input.

With --observed FILE..., the argument is a run directory instead: it is scored against the
observed-metrics files as `run --observed` scores a run (the divergence per signal and pool),
without replaying or writing; the `observed:` section of the run's config.yaml (or of --config)
says how to read them. Exit 0 when it ran, 2 bad input.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measurements (scenario file)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", metavar="SCENARIOS.yaml",
                   help="scenario file, or 'published' / 'lambda-v0' for a shipped one")
    p.add_argument("--json", action="store_true", help="print rows and MAPEs as JSON instead of the table")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only the scenario(s) whose name contains NAME (repeatable)")
    p.add_argument("--engine", choices=("numba", "reference"), default="numba",
                   help="replay engine (default numba; reference: the pure-Python twin, slower)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="vllm-s2r only: the measurements folder (experiments.csv, ground_truth.csv); required")
    p.add_argument("--models", metavar="DIR", default=None,
                   help="vllm-s2r only: a folder of <name>/config.json for models the catalog lacks")
    from replay.cli.observed import add_observed_option
    from replay.cli.parsing import add_plugin_option

    add_observed_option(p, help="score the run directory given instead of SCENARIOS.yaml against these observed-"
                                "metrics files, as `run --observed` does, without replaying (repeatable)")
    p.add_argument("--config", "-c", default=None,
                   help="with --observed: the fleet config whose `observed:` section applies (default: the "
                        "run's config.yaml)")
    add_plugin_option(p)


def scenario_path(name: str) -> Path:
    if name in SHIPPED and not Path(name).exists():
        return Path(str(resources.files("replay") / "scenarios" / SHIPPED[name]))
    return Path(name)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from policies.plugins import load_plugins
    from replay.outputs.report import engine_ready
    from replay.validate import load_scenarios, mape_by_group, run_scenario
    from common.errors import UserError

    load_plugins(args.plugin)
    from replay.cli import validate_measured, validate_observed

    if args.observed:
        return validate_observed.run(args)
    if args.config is not None:
        raise UserError("--config: applies with --observed only (a scenario names its own fleet)")

    if args.scenarios == validate_measured.NAME and not Path(args.scenarios).exists():
        return validate_measured.run(args)
    for flag in ("data", "models"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag}: applies to 'validate {validate_measured.NAME}' only, not to a scenario file")
    path = scenario_path(args.scenarios)
    scenarios = load_scenarios(path)
    if args.only:
        scenarios = [s for s in scenarios if any(part in s.name for part in args.only)]
        if not scenarios:
            raise UserError(f"--only {' '.join(args.only)}: no scenario of {path} has such a name")
    err = Console(stderr=True)
    show = err.is_terminal and not args.json
    rows = []
    if args.engine == "numba":
        from replay.run import fleet_variants

        for variant in fleet_variants((s.fleet, s.fleet_where) for s in scenarios):
            engine_ready(err, terminal=show, quiet=args.json, variant=variant)
    with err.status("loading the scenarios", spinner="dots") if show else contextlib.nullcontext() as status:
        for i, s in enumerate(scenarios, start=1):
            if status is not None:
                status.update(f"scenario {i}/{len(scenarios)}: {s.name}")
            rows.extend(run_scenario(s, engine=args.engine))
    mape = mape_by_group(rows)
    failed = sum(not r.passed for r in rows)
    if args.json:
        print(json.dumps({"file": str(path), "rows": [r.to_dict() for r in rows], "mape": mape,
                          "passed": len(rows) - failed, "failed": failed}, indent=2))
    else:
        console = Console()
        if not console.is_terminal:  # a file or pipe gets whole rows, not wrapped cells
            console = Console(width=150)
        print_table(console, rows, mape, path)
    return EXIT_SOME_FAILED if failed else 0


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def print_table(console: Any, rows: list, mape: dict, path: Path) -> None:
    from rich.table import Table

    t = Table(title=f"validation: {path.name}")
    for name, justify in (("scenario", "left"), ("metric", "left"), ("expected", "right"),
                          ("predicted", "right"), ("error", "right"), ("tol", "right"), ("", "left")):
        t.add_column(name, justify=justify)
    for r in rows:
        err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
        verdict = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        t.add_row(r.scenario, r.metric, _fmt(r.expected), _fmt(r.predicted), err,
                  f"{r.tolerance_pct:.0f}%", verdict + (f" {r.note}" if r.note else ""))
    console.print(t)
    parts = []
    for g, m in mape.items():
        if m["rows"]:
            parts.append(f"{g} {m['mape_pct']:.1f}% ({m['rows']} row{'s' if m['rows'] != 1 else ''})")
    failed = sum(not r.passed for r in rows)
    console.print("MAPE: " + ("; ".join(parts) or "no predictions"), soft_wrap=True)
    console.print(f"{len(rows) - failed} of {len(rows)} rows within tolerance")
