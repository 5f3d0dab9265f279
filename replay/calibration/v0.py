"""vLLM V0's host terms (`serving: {engine_version: v0, v0_step_us, v0_seq_us}`, replay/model/serving.py)
fitted by replaying V0 scenarios whole, with leave-one-model-out cross-validation.

`python -m replay.calibration.v0 [SCENARIOS.yaml | lambda-v0] [--only NAME] [--seq-us US] [--json]`
replays every scenario of the file (or those whose name contains a NAME; its V0 pools: `engine_version:
v0`) at every point of a grid of the two terms (or of v0_step_us alone, `--seq-us` held), scores each
point by the mean of the per-family MAPEs (throughput, TTFT, TPOT, E2E: each family weighs the same,
whatever its row count), and reports: the point that fits every scenario, the error there and at
(0, 0) (V1's terms alone), and the cross-validated error: for each model, the point fitted on the other
models' scenarios, scored on its own. A grid rather than a gradient: the replays' metrics are
step functions of the terms (whole steps, percentiles of few requests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.validate import GROUPS, Row, Scenario, load_scenarios, mape_by_group, run_scenario

# The grid: per-step host time (us) and per-sequence host time per step (us). V1's fitted per-step
# and per-sequence overheads on the H100 are the same order (replay/profiles/request_fit_*.yaml).
STEP_GRID_US = tuple(float(x) for x in range(0, 2001, 125))
SEQ_GRID_US = tuple(float(x) for x in range(0, 101, 5))


@dataclass(frozen=True)
class V0Fit:
    step_us: float
    seq_us: float
    score_pct: float  # mean of the families' MAPEs, every scenario
    mape: dict[str, float | None]  # per family at the fit, every scenario
    mape_zero: dict[str, float | None]  # per family at (0, 0)
    cv_mape: dict[str, float | None]  # per family, each model's rows at the point fitted without it
    cv_points: dict[str, tuple[float, float]]  # model -> the point fitted without it
    models: dict[str, list[str]]  # model -> its scenarios

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def with_v0_terms(s: Scenario, step_us: float, seq_us: float) -> Scenario:
    """The scenario with its V0 pools' host terms set (its V1 pools unchanged)."""
    pools = [dataclasses.replace(p, serving=dataclasses.replace(p.serving, v0_step_us=step_us, v0_seq_us=seq_us))
             if p.serving.engine_version == "v0" else p for p in s.fleet.pools]
    return dataclasses.replace(s, fleet=dataclasses.replace(s.fleet, pools=pools))


def score(rows: Sequence[Row]) -> float:
    """Mean of the families' MAPEs (families without rows left out)."""
    values = [m["mape_pct"] for m in mape_by_group(list(rows)).values() if m["mape_pct"] is not None]
    return float(np.mean(values)) if values else float("inf")


def families(rows: Sequence[Row]) -> dict[str, float | None]:
    return {g: m["mape_pct"] for g, m in mape_by_group(list(rows)).items()}


def replay_grid(scenarios: Sequence[Scenario], step_grid: Sequence[float], seq_grid: Sequence[float],
                engine: str = "numba") -> dict[tuple[float, float], list[list[Row]]]:
    """Every grid point's rows, one list per scenario (in the scenarios' order)."""
    return {(a, b): [run_scenario(with_v0_terms(s, a, b), engine) for s in scenarios]
            for a in step_grid for b in seq_grid}


def _best(grid: dict[tuple[float, float], list[list[Row]]], keep: Sequence[int]) -> tuple[float, float]:
    """The grid point of least score over the scenarios `keep` (ties: the smaller terms)."""
    return min(grid, key=lambda point: (score([r for i in keep for r in grid[point][i]]), point))


def fit_v0(scenarios: Sequence[Scenario], grid: dict[tuple[float, float], list[list[Row]]]) -> V0Fit:
    models: dict[str, list[int]] = {}
    for i, s in enumerate(scenarios):
        models.setdefault(str(s.fleet.model), []).append(i)
    if len(models) < 2:
        raise ValueError(f"leave-one-model-out cross-validation needs scenarios of 2 models or more; got "
                         f"{', '.join(models) or 'none'}")
    everything = range(len(scenarios))
    best = _best(grid, everything)
    rows = [r for i in everything for r in grid[best][i]]
    cv_rows: list[Row] = []
    cv_points = {}
    for model, mine in models.items():
        others = [i for i in everything if i not in mine]
        point = _best(grid, others)
        cv_points[model] = point
        cv_rows += [r for i in mine for r in grid[point][i]]
    zero = (0.0, 0.0) if (0.0, 0.0) in grid else min(grid)
    return V0Fit(best[0], best[1], score(rows), families(rows),
                 families([r for i in everything for r in grid[zero][i]]), families(cv_rows), cv_points,
                 {m: [scenarios[i].name for i in idx] for m, idx in models.items()})


def _shown(mape: dict[str, float | None]) -> str:
    return " / ".join("-" if mape[g] is None else f"{mape[g]:.1f}" for g in GROUPS)


def main(argv: Sequence[str] | None = None) -> int:
    from common.errors import ConfigError
    from replay.cli.validate import scenario_path

    ap = argparse.ArgumentParser(prog="python -m replay.calibration.v0", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="?", default="lambda-v0", help="scenario file or 'lambda-v0' (default)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="fit on the scenarios whose name contains NAME only (repeatable)")
    ap.add_argument("--seq-us", type=float, default=None, metavar="US",
                    help="hold v0_seq_us at US and fit v0_step_us alone (for data that cannot pin it)")
    ap.add_argument("--json", action="store_true", help="print the fit as JSON")
    args = ap.parse_args(argv)
    try:
        scenarios = load_scenarios(scenario_path(args.scenarios))
    except ConfigError as exc:
        print(f"llm-replay: {exc}", file=sys.stderr)
        return 2
    if args.only:
        scenarios = [s for s in scenarios if any(n in s.name for n in args.only)]
        if not scenarios:
            print(f"llm-replay: --only {' '.join(args.only)}: no scenario of {args.scenarios} has such a name",
                  file=sys.stderr)
            return 2
    try:
        if args.seq_us is not None and not args.seq_us >= 0:
            raise ValueError(f"--seq-us: got {args.seq_us:g}, expected microseconds >= 0")
        grid = replay_grid(scenarios, STEP_GRID_US, SEQ_GRID_US if args.seq_us is None else (args.seq_us,))
        result = fit_v0(scenarios, grid)
    except ValueError as exc:
        print(f"llm-replay: {args.scenarios}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"families: {' / '.join(GROUPS)} (MAPE %)")
    print(f"fit on all {len(scenarios)} scenarios: v0_step_us {result.step_us:g}, v0_seq_us {result.seq_us:g}")
    print(f"  at the fit:           {_shown(result.mape)}")
    held = 0.0 if args.seq_us is None else args.seq_us  # the grid's point without a step term
    print(f"  at 0, {held:g} {'(V1 terms)' if held == 0 else '(no step term)'}:   {_shown(result.mape_zero)}")
    print(f"  leave-one-model-out:  {_shown(result.cv_mape)}")
    for model, point in result.cv_points.items():
        print(f"    without {model}: v0_step_us {point[0]:g}, v0_seq_us {point[1]:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
