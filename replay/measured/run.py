"""Replay one experiment and measure the replay as inference-perf measured the real server: per stage
and over the whole run (WHOLE_RUN), latencies in ms, percentiles linear (numpy's, as the harness)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from replay.measured.experiments import WHOLE_RUN, Experiment
from replay.measured.fleet import experiment_fleet
from replay.measured.workload import STAGE_GAP_S, experiment_trace, stage_of

# Figures compared with ground_truth.csv, by name there, and the family each belongs to.
COMPARED = {
    "ttft_mean": "ttft", "ttft_p90": "ttft", "ttft_p99": "ttft", "itl_mean": "itl",
    "e2e_mean": "e2e", "e2e_p90": "e2e", "e2e_p99": "e2e", "throughput_req_s": "throughput",
    "throughput_output_tok_s": "throughput",
}
FAMILIES = ("ttft", "itl", "e2e")  # the MAPE families; each is taken over its `_mean` figure


@dataclass(frozen=True)
class ExperimentReplay:
    """A replayed experiment. `figures[stage]` (0, 1, ... and WHOLE_RUN) maps the names of
    ground_truth.csv (ttft_mean, itl_mean, e2e_p99, throughput_req_s, ...) to replayed values, plus
    `requests`, `finished` and `unfinished` counts. `requests` is the run's requests frame with a
    `stage` column; `ticks` its per-pool tick series; `summary` its summary.json mapping;
    `stage_spans_us[stage]` = (the stage's start, its last arrival) on the ticks' clock."""

    experiment: Experiment
    figures: dict[int, dict[str, float | None]]
    requests: pl.DataFrame
    ticks: pl.DataFrame
    summary: dict[str, Any]
    wall_s: float
    stage_spans_us: dict[int, tuple[int, int]] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def unfinished(self) -> int:
        return int(self.figures[WHOLE_RUN]["unfinished"] or 0)


def _percentile(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def stage_starts_us(requests: pl.DataFrame) -> dict[int, int]:
    """When each stage began (as the rebuilt workload places them): 0 for the first, else
    STAGE_GAP_S after the previous stage's last arrival."""
    last = requests.group_by("stage").agg(pl.col("arrival_us").max()).sort("stage")
    starts, previous = {}, None
    for stage, arrival in last.iter_rows():
        starts[stage] = 0 if previous is None else previous + round(STAGE_GAP_S * 1e6)
        previous = arrival
    return starts


def measure(exp: Experiment, requests: pl.DataFrame, stage: int,
            starts_us: dict[int, int]) -> dict[str, float | None]:
    """The harness's figures over `requests` (one stage's, or the whole run's for WHOLE_RUN).

    ITL is the harness's: (mean E2E - mean TTFT) / (mean output tokens counted - 1), the count being
    its re-tokenised one where the ground truth gives it (Experiment.output_tokens_counted), so a
    replay that generates output_len tokens is read as the harness read the server. Throughput is
    over the stage's span, from its start (`starts_us`: ConstantLoadTimer sends its first request
    one gap after) to its last finish; the whole run's adds the stages' spans, leaving out the
    replay's fixed pause between stages (STAGE_GAP_S). Output tokens per second count the harness's
    tokens per request too."""
    done = requests.filter(pl.col("status") == "finished")
    out: dict[str, float | None] = {"requests": float(requests.height), "finished": float(done.height),
                                    "unfinished": float(requests.height - done.height)}
    ttft = done["ttft_us"].drop_nulls().to_numpy().astype(np.float64) / 1000.0
    e2e = done["e2e_us"].drop_nulls().to_numpy().astype(np.float64) / 1000.0
    for name, values in (("ttft", ttft), ("e2e", e2e)):
        out[f"{name}_mean"] = float(values.mean()) if len(values) else None
        out[f"{name}_p90"] = _percentile(values, 90)
        out[f"{name}_p99"] = _percentile(values, 99)
    counted = exp.output_tokens_counted(stage)
    if out["ttft_mean"] is not None and counted > 1:
        out["itl_mean"] = (out["e2e_mean"] - out["ttft_mean"]) / (counted - 1)
    else:
        out["itl_mean"] = None
    span_s = 0.0
    stages = [stage] if stage != WHOLE_RUN else [s.index for s in exp.stages]
    for s in stages:
        part = done.filter(pl.col("stage") == s)
        if part.height:
            span_s += (int(part["finished_us"].max()) - starts_us[s]) / 1e6
    if span_s > 0:
        out["throughput_req_s"] = done.height / span_s
        # output tokens as the harness counted them (its re-tokenised count, as for ITL)
        out["throughput_output_tok_s"] = done.height * counted / span_s
        out["throughput_input_tok_s"] = float(done["prompt_tokens"].cast(pl.Int64).sum()) / span_s
    return out


def replay_experiment(exp: Experiment, overrides: dict[str, Any] | None = None, engine: str = "numba",
                      seed: int = 0) -> ExperimentReplay:
    """Replay `exp` (its fleet with `overrides`: replay/measured/fleet.py) on its rebuilt workload
    (replay/measured/workload.py, arrivals seeded by `seed`), every request run to completion."""
    from replay.run import replay_trace

    started = time.perf_counter()
    cfg = experiment_fleet(exp, overrides)
    trace = experiment_trace(exp, seed)
    result = replay_trace(trace, cfg, engine=engine, config_source=f"experiment {exp.id}")
    requests = result.requests.with_columns(stage_of(result.requests))
    starts = stage_starts_us(requests)
    figures = {s.index: measure(exp, requests.filter(pl.col("stage") == s.index), s.index, starts)
               for s in exp.stages}
    figures[WHOLE_RUN] = measure(exp, requests, WHOLE_RUN, starts)
    last = dict(requests.group_by("stage").agg(pl.col("arrival_us").max()).iter_rows())
    spans = {stage: (start, int(last[stage])) for stage, start in starts.items()}
    return ExperimentReplay(exp, figures, requests, result.ticks, result.summary,
                            time.perf_counter() - started, spans, dict(overrides or {}))


__all__ = ["COMPARED", "FAMILIES", "STAGE_GAP_S", "ExperimentReplay", "measure", "replay_experiment"]
