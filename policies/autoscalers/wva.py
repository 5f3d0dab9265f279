"""`wva`: llm-d workload-variant-autoscaler, token-based saturation analyzer (V2), one variant."""

# Upstream: llm-d/llm-d-workload-variant-autoscaler `internal/engines/analyzers/saturation_v2/analyzer.go`
# (per-replica capacity and demand), the engine's universal-threshold step (RequiredCapacity /
# SpareCapacity) and `internal/engines/pipeline/cost_aware_optimizer.go` (replicas from capacity);
# defaults in `internal/config/saturation_scaling.go`: kvCacheThreshold 0.80, scaleUpThreshold 0.85,
# scaleDownBoundary 0.70; reconcile every 60 s; KV use and queue length read as their peak over the
# last minute (`max_over_time[1m]`, docs/saturation-analyzer.md). Reproduced:
# - per-replica capacity C = kv_tokens * kv_cache_threshold (the memory bound k1);
# - demand D = tokens in use (kv_usage * kv_tokens * active) + waiting * mean prompt tokens;
# - supply = active * C; anticipated supply = (active + starting) * C, so replicas still loading
#   count as capacity and a second scale-up is not ordered while the first boots;
# - required = max(0, D / scale_up_threshold - anticipated); spare = max(0, supply - D / scale_down_boundary);
# - required > 0: add ceil(required / C); else spare > 0: remove floor(spare / C), keeping at least 1;
# - at 0 replicas with requests held at the pool: 1 (WVA's ScaleFromZero engine, `from_zero`).

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_number, from_zero, require, since, us


@dataclass(frozen=True)
class WvaParams:
    kv_cache_threshold: float = 0.80
    scale_up_threshold: float = 0.85
    scale_down_boundary: float = 0.70
    peak_window_s: float = 60.0  # max_over_time[1m]
    decision_interval_s: float = 60.0  # reconcile interval

    def __post_init__(self) -> None:
        check_number("kv_cache_threshold", self.kv_cache_threshold, lo=0, hi=1, lo_open=True)
        check_number("scale_up_threshold", self.scale_up_threshold, lo=0, lo_open=True)
        check_number("scale_down_boundary", self.scale_down_boundary, lo=0, lo_open=True)
        require(self.scale_down_boundary < self.scale_up_threshold, "scale_down_boundary", self.scale_down_boundary,
                f"a number below scale_up_threshold ({self.scale_up_threshold})")
        check_number("peak_window_s", self.peak_window_s, lo=0)
        check_number("decision_interval_s", self.decision_interval_s, lo=0)


@dataclass(frozen=True)
class WvaState:
    samples: tuple[tuple[int, float, int], ...] = ()  # (t_us, kv_usage, waiting) within the peak window


def wva_state(params: WvaParams) -> WvaState:
    return WvaState()


def wva_observe(ctx: ScalingContext, params: WvaParams, state: WvaState) -> WvaState:
    kept = since(state.samples, ctx.now_us - us(params.peak_window_s))
    return WvaState(kept + ((ctx.now_us, ctx.metrics.kv_usage, ctx.metrics.waiting),))


def wva(ctx: ScalingContext, params: WvaParams, state: WvaState) -> Decision[WvaState]:
    state = wva_observe(ctx, params, state)
    m = ctx.metrics
    kv_peak = max(s[1] for s in state.samples)
    waiting_peak = max(s[2] for s in state.samples)
    if ctx.replica is not None:
        kv_tokens = ctx.replica.kv_tokens
        capacity = kv_tokens * params.kv_cache_threshold
        demand = kv_peak * kv_tokens * m.replicas_active + waiting_peak * m.mean_prompt_tokens
    else:  # no token counts: work in units of one replica's KV, and the queue cannot be priced
        capacity = params.kv_cache_threshold
        demand = kv_peak * m.replicas_active
    supply = m.replicas_active * capacity
    anticipated = (m.replicas_active + m.replicas_starting) * capacity
    required = max(0.0, demand / params.scale_up_threshold - anticipated)
    spare = max(0.0, supply - demand / params.scale_down_boundary)
    current = ctx.desired
    if required > 0:
        replicas = current + math.ceil(required / capacity)
    elif spare > 0:
        replicas = max(1, current - math.floor(spare / capacity))
    else:
        replicas = current
    if from_zero(ctx):
        replicas = max(replicas, 1)
    signals = {"metric": "kv_tokens", "value": demand, "supply": supply, "anticipated_supply": anticipated,
               "required_capacity": required, "spare_capacity": spare, "kv_usage_peak": kv_peak,
               "waiting_peak": waiting_peak}
    return Decision(replicas, state, signals)
