"""Kubernetes HPA on one per-replica metric: tolerance band, 300 s scale-down stabilization."""

# Upstream: kubernetes `pkg/controller/podautoscaler/replica_calculator.go` (`calcPlainMetricReplicas`)
# and `horizontal.go` (`stabilizeRecommendation`, `normalizeDesiredReplicas`, `calculateScaleUpLimit`),
# the path taken when the HPA has no `behavior` section. Reproduced:
# - desired = ceil(ready * current / target); no change while |current / target - 1| <= tolerance (0.1);
# - replicas still starting report no metric: on a scale-up they count as using 0 (and a result that
#   would flip direction keeps the current count); on a scale-down they are left out;
# - no ready replica reporting: keep the current count (upstream errors and does not scale), but
#   a pool at zero with requests held at it goes to 1 (as KEDA activates a pool at zero: `from_zero`);
# - the recommendation is the max of all recommendations in the last 300 s (so scale-downs wait),
#   capped at max(2 * current, 4) per sync; the sync period (15 s) is `decision_interval_s`.

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.api import Decision, PoolMetrics, ScalingContext
from policies.autoscalers._util import check_choice, check_int, check_number, from_zero, require, us

METRICS = ("waiting", "ongoing", "kv_usage", "gpu_busy")
# Per-replica targets when `target` is not set: 5 waiting requests (llm-d's queueDepthThreshold),
# KV use 0.7, GPU-Util 0.8 (the usual HPA-on-DCGM setting). `ongoing` has no sensible default.
DEFAULT_TARGETS = {"waiting": 5.0, "kv_usage": 0.7, "gpu_busy": 0.8}


def metric_value(metric: str, m: PoolMetrics) -> float:
    """The per-replica average HPA compares with its target (`active` > 0)."""
    if metric == "waiting":
        return m.waiting / m.replicas_active
    if metric == "ongoing":
        return m.ongoing_requests / m.replicas_active
    if metric == "kv_usage":
        return m.kv_usage
    return m.gpu_busy


def replica_calculator(usage_ratio: float, ready: int, unready: int, current: int, tolerance: float) -> int:
    """`calcPlainMetricReplicas` for one pods metric: `ready` replicas report, `unready` do not yet."""
    if ready <= 0:
        return current
    if unready == 0 or usage_ratio <= 1.0:
        if abs(1.0 - usage_ratio) <= tolerance:
            return current
        return math.ceil(usage_ratio * ready)
    # Scale-up with replicas still starting: count them at 0 and re-check band and direction.
    new_ratio = usage_ratio * ready / (ready + unready)
    if abs(1.0 - new_ratio) <= tolerance or new_ratio < 1.0:
        return current
    return max(current, math.ceil(new_ratio * (ready + unready)))


@dataclass(frozen=True)
class HpaParams:
    metric: str = "waiting"
    target: float | None = None  # per replica; None: DEFAULT_TARGETS[metric]
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    downscale_stabilization_s: float = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization
    scale_up_limit_factor: float = 2.0
    scale_up_limit_minimum: int = 4
    decision_interval_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period

    def __post_init__(self) -> None:
        check_choice("metric", self.metric, METRICS)
        if self.target is None:
            require(self.metric in DEFAULT_TARGETS, "target", None, f"a number > 0 when metric is {self.metric!r}")
        else:
            check_number("target", self.target, lo=0, lo_open=True)
        check_number("tolerance", self.tolerance, lo=0, hi=1)
        check_number("downscale_stabilization_s", self.downscale_stabilization_s, lo=0)
        check_number("scale_up_limit_factor", self.scale_up_limit_factor, lo=1)
        check_int("scale_up_limit_minimum", self.scale_up_limit_minimum, lo=1)
        check_number("decision_interval_s", self.decision_interval_s, lo=0)

    @property
    def effective_target(self) -> float:
        return DEFAULT_TARGETS[self.metric] if self.target is None else self.target


@dataclass(frozen=True)
class HpaState:
    recommendations: tuple[tuple[int, int], ...] = ()  # (t_us, replicas) in the stabilization window


def hpa_state(params: HpaParams) -> HpaState:
    return HpaState()


def hpa(ctx: ScalingContext, params: HpaParams, state: HpaState) -> Decision[HpaState]:
    m = ctx.metrics
    current = ctx.desired
    target = params.effective_target
    value = metric_value(params.metric, m) if m.replicas_active > 0 else None
    ratio = None if value is None else value / target
    if ratio is None:
        rec = 1 if from_zero(ctx) else current
    else:
        rec = replica_calculator(ratio, m.replicas_active, m.replicas_starting, current, params.tolerance)
    cutoff = ctx.now_us - us(params.downscale_stabilization_s)
    kept = tuple(r for r in state.recommendations if r[0] >= cutoff)
    stabilized = max([rec] + [r[1] for r in kept])
    limit = int(max(params.scale_up_limit_factor * current, params.scale_up_limit_minimum))
    desired = max(ctx.min_replicas, min(stabilized, limit, ctx.max_replicas))
    signals = {"metric": params.metric, "value": value, "target": target, "ratio": ratio,
               "recommendation": rec, "stabilized": stabilized, "scale_up_limit": limit}
    return Decision(desired, HpaState(kept + ((ctx.now_us, rec),)), signals)
