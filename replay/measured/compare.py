"""Replayed vs measured: one row per experiment, stage and figure, error = (replayed - measured) /
measured, and the MAPE of each metric family over the `_mean` figures, per set."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.measured.experiments import SETS, WHOLE_RUN
from replay.measured.run import COMPARED, FAMILIES, ExperimentReplay

SCOPES = ("whole_run", "stages")  # MAPE over the whole-run means, and over every stage's means
SEVERITY = {"stable": 0, "backlogged": 1, "overloaded": 2}


def measured_class(exp: Any) -> str:
    """The real server's class: the manifest's `unsafe` runs could not sustain their rate (README
    of the measurements); every other run was stable."""
    return "overloaded" if exp.unsafe else "stable"


def replayed_classes(result: ExperimentReplay) -> dict[int, str]:
    """The replay's class per stage (replay/fleet/saturation.py over the stage's arrivals) and, for the
    whole run (WHOLE_RUN), the worst of its stages: a load test judges a run by its hardest stage."""
    from replay.measured.fleet import POOL
    from replay.fleet.saturation import classify, pool_series

    series = pool_series(result.ticks, POOL)  # once; each stage is a window of it
    out = {stage: classify(*series, span).state for stage, span in sorted(result.stage_spans_us.items())}
    out[WHOLE_RUN] = max(out.values(), key=SEVERITY.__getitem__) if out else "stable"
    return out


@dataclass(frozen=True)
class Row:
    experiment: str
    set: str
    stage: int  # WHOLE_RUN (-1) or the stage's index
    metric: str  # ground_truth.csv's name: ttft_mean, itl_mean, e2e_p99, throughput_req_s, ...
    family: str  # ttft, itl, e2e or throughput
    measured: float
    replayed: float | None
    error_pct: float | None  # (replayed - measured) / measured * 100

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(result: ExperimentReplay) -> list[Row]:
    """Every figure the ground truth gives and the replay computes, whole run first, then stages."""
    exp = result.experiment
    rows = []
    for stage in [WHOLE_RUN, *(s.index for s in exp.stages)]:
        measured = exp.measured.get(stage, {})
        replayed = result.figures.get(stage, {})
        for metric, family in COMPARED.items():
            if metric not in measured:
                continue
            want, got = measured[metric], replayed.get(metric)
            err = None if got is None or want == 0 else (got - want) / want * 100
            rows.append(Row(exp.id, exp.set, stage, metric, family, want, got, err))
    return rows


def mape(rows: list[Row]) -> dict[str, dict[str, dict[str, dict[str, float | int | None]]]]:
    """`{set: {scope: {family: {"rows": n, "mape_pct": x}}}}` for each set of SETS and "all",
    scope whole_run (stage -1) or stages (each stage's own figures), family's `_mean` figure."""
    out: dict[str, Any] = {}
    for name in (*SETS, "all"):
        out[name] = {}
        for scope in SCOPES:
            out[name][scope] = {}
            for family in FAMILIES:
                errs = [abs(r.error_pct) for r in rows
                        if r.metric == f"{family}_mean" and r.error_pct is not None
                        and (name == "all" or r.set == name)
                        and ((r.stage == WHOLE_RUN) == (scope == "whole_run"))]
                out[name][scope][family] = {"rows": len(errs), "mape_pct": float(np.mean(errs)) if errs else None}
    return out
