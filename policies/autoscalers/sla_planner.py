"""`sla-planner`: NVIDIA Dynamo's SLA planner, sizing a pool from predicted load and the step model."""

# Upstream: ai-dynamo/dynamo `components/planner/src/dynamo/planner/utils/planner_core.py`
# (`_compute_replica_requirements`, `make_adjustments`), `utils/load_predictor.py`,
# `utils/perf_interpolation.py`, defaults in `defaults.py` (adjustment_interval 180 s,
# min_endpoint 1, load_prediction_window_size 50). Every adjustment interval:
# - observe the interval's load and feed one data point to the predictor; predict the next
#   interval (`constant`: the last point, upstream's ConstantPredictor; `moving-average`: the mean
#   of the last window_size points);
# - prefill: ceil(rate * ISL * min(1, ttft correction) / prefill tokens/s of one replica);
# - decode: the best decode throughput whose inter-token latency meets the TPOT target (corrected),
#   searched from the largest batch down among measured points whose KV (batch * (ISL + OSL/2))
#   fits, else the smallest batch; ceil(rate * OSL / that throughput);
# - at least `min_endpoint` replicas, and 1 at zero with requests held at the pool (`from_zero`:
#   upstream keeps min_endpoint 1 and never reaches zero; a pool that does must leave it).
# The data point is (request rate, prompt tokens/s, output tokens/s, decode context); upstream
# predicts rate, mean ISL and mean OSL separately and multiplies them, which is the same with the
# constant predictor. The decode context is the largest per-scrape ISL + OSL/2 of the interval
# (upstream: the interval mean); with arrival-weighted means a burst of short requests could shrink
# the context and answer more load with fewer decode replicas.
# Per-replica capacity comes from `ctx.replica` (the step model) instead of profiling files.
# `role` picks the pool's side of a prefill/decode split; `aggregated` (not in upstream, whose SLA
# planner is disaggregated only) needs the sum of both shares, since one replica time-shares them.
# Not reproduced: the ARIMA and Prophet predictors, the GPU budget across both pools (use
# max_replicas), skipping adjustment when there is no traffic (here no traffic sizes to
# min_endpoint, which keeps the policy monotone in load). Correction factors are off by default
# (upstream's dry-run mode also runs without them): they rescale targets from observed latency
# and can answer more load with fewer replicas.

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.api import Decision, ReplicaModel, ScalingContext
from policies.autoscalers._util import check_choice, check_int, check_number, from_zero, mean, since, us

ROLES = ("prefill", "decode", "aggregated")
PREDICTORS = ("constant", "moving-average")


@dataclass(frozen=True)
class SlaPlannerParams:
    role: str = "aggregated"
    load_predictor: str = "constant"
    load_prediction_window_size: int = 50
    min_endpoint: int = 1
    correction: bool = False
    decision_interval_s: float = 180.0  # adjustment-interval

    def __post_init__(self) -> None:
        check_choice("role", self.role, ROLES)
        check_choice("load_predictor", self.load_predictor, PREDICTORS)
        check_int("load_prediction_window_size", self.load_prediction_window_size, lo=1)
        check_int("min_endpoint", self.min_endpoint, lo=0)
        check_number("decision_interval_s", self.decision_interval_s, lo=0, lo_open=True)


@dataclass(frozen=True)
class SlaPlannerState:
    samples: tuple[tuple[int, float, float, float], ...] = ()  # (t_us, arrivals/s, mean ISL, mean OSL)
    # One (requests/s, prompt tokens/s, output tokens/s, decode context tokens) per adjustment.
    history: tuple[tuple[float, float, float, float], ...] = ()


def sla_planner_state(params: SlaPlannerParams) -> SlaPlannerState:
    return SlaPlannerState()


def sla_planner_observe(ctx: ScalingContext, params: SlaPlannerParams, state: SlaPlannerState) -> SlaPlannerState:
    m = ctx.metrics
    kept = since(state.samples, ctx.now_us - us(params.decision_interval_s))
    sample = (ctx.now_us, m.arrivals_per_s, m.mean_prompt_tokens, m.mean_output_tokens)
    return SlaPlannerState(kept + (sample,), state.history)


def interval_load(samples: tuple[tuple[int, float, float, float], ...]) -> tuple[float, float, float, float]:
    """Requests/s, prompt and output tokens/s over the interval, and the longest decode context."""
    context = max((s[2] + s[3] / 2 for s in samples if s[1] > 0), default=0.0)
    return (mean([s[1] for s in samples]), mean([s[1] * s[2] for s in samples]),
            mean([s[1] * s[3] for s in samples]), context)


def predict(history: tuple[tuple[float, ...], ...], predictor: str) -> tuple[float, ...]:
    if predictor == "constant":
        return history[-1]
    return tuple(mean([h[k] for h in history]) for k in range(len(history[-1])))


def interpolate_itl_ms(replica: ReplicaModel, batch: float) -> float:
    points = sorted(replica.decode_tokens_per_s_at)
    if batch <= points[0][0]:
        return points[0][2]
    for (b0, _, l0), (b1, _, l1) in zip(points, points[1:]):
        if batch <= b1:
            return l0 + (l1 - l0) * (batch - b0) / (b1 - b0)
    return points[-1][2]


def best_decode_tokens_per_s(replica: ReplicaModel, itl_ms: float, context_tokens: float) -> float:
    """`find_best_throughput_per_gpu`: from the largest batch down, the first that meets the ITL."""
    points = sorted(replica.decode_tokens_per_s_at)
    for batch, tokens_per_s, latency_ms in reversed(points):
        fits = batch <= replica.max_num_seqs and batch * context_tokens <= replica.kv_tokens
        if fits and latency_ms <= itl_ms:
            return tokens_per_s
    return points[0][1]


def _corrections(ctx: ScalingContext, replica: ReplicaModel, isl: float) -> tuple[float, float]:
    """(prefill factor, decode factor) from observed vs expected latency, as `make_adjustments`."""
    m = ctx.metrics
    p_factor = d_factor = 1.0
    if m.ttft_p99_ms is not None and isl > 0:
        expected_ttft_ms = isl / replica.prefill_tokens_per_s * 1000.0
        p_factor = m.ttft_p99_ms / expected_ttft_ms
    if m.tpot_p50_ms is not None and m.replicas_active > 0:
        expected_itl_ms = interpolate_itl_ms(replica, m.running / m.replicas_active)
        if expected_itl_ms > 0 and m.tpot_p50_ms > 0:
            d_factor = m.tpot_p50_ms / expected_itl_ms
    return p_factor, d_factor


def sla_planner(ctx: ScalingContext, params: SlaPlannerParams, state: SlaPlannerState) -> Decision[SlaPlannerState]:
    state = sla_planner_observe(ctx, params, state)
    observed = interval_load(state.samples)
    history = (state.history + (observed,))[-params.load_prediction_window_size:]
    state = SlaPlannerState(state.samples, history)
    replica = ctx.replica
    if replica is None or not replica.decode_tokens_per_s_at or replica.prefill_tokens_per_s <= 0:
        return Decision(1 if from_zero(ctx) else ctx.desired, state, {"role": params.role, "sized": False})

    rate, prompt_tokens_per_s, output_tokens_per_s, context = predict(history, params.load_predictor)
    observed_isl = observed[1] / observed[0] if observed[0] > 0 else 0.0
    p_factor, d_factor = _corrections(ctx, replica, observed_isl) if params.correction else (1.0, 1.0)
    prefill_share = prompt_tokens_per_s * min(1.0, p_factor) / replica.prefill_tokens_per_s
    itl_ms = ctx.slo_tpot_ms / d_factor if d_factor > 0 else ctx.slo_tpot_ms
    decode_tokens_per_s = best_decode_tokens_per_s(replica, itl_ms, context)
    decode_share = output_tokens_per_s / decode_tokens_per_s if decode_tokens_per_s > 0 else 0.0
    share = {"prefill": prefill_share, "decode": decode_share, "aggregated": prefill_share + decode_share}
    replicas = max(params.min_endpoint, math.ceil(share[params.role]), 1 if from_zero(ctx) else 0)
    signals = {"role": params.role, "sized": True, "metric": "request_rate", "value": rate,
               "prompt_tokens_per_s": prompt_tokens_per_s, "output_tokens_per_s": output_tokens_per_s,
               "decode_context_tokens": context, "prefill_replicas": prefill_share,
               "decode_replicas": decode_share, "decode_tokens_per_s": decode_tokens_per_s, "itl_target_ms": itl_ms}
    return Decision(replicas, state, signals)
