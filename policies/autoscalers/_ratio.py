"""The bare HPA replica calculator on one signal, shared by gpu-util, queue-depth and kv-usage."""

# No stabilization window and no scale-up limit: these three exist to compare signals, so the
# signal is the only thing that differs between them (use `hpa` for the full controller).

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_number, from_zero
from policies.autoscalers.hpa import metric_value, replica_calculator


@dataclass(frozen=True)
class RatioState:
    """These policies keep no state; the type exists so every autoscaler has one."""


def ratio_state(params: object) -> RatioState:
    return RatioState()


def check_ratio_params(target_field: str, target: float, tolerance: float, decision_interval_s: float) -> None:
    check_number(target_field, target, lo=0, lo_open=True)
    check_number("tolerance", tolerance, lo=0, hi=1)
    check_number("decision_interval_s", decision_interval_s, lo=0)


def ratio_decision(ctx: ScalingContext, metric: str, target: float, tolerance: float, state: RatioState) -> Decision:
    m = ctx.metrics
    if m.replicas_active == 0:  # nothing reports the metric yet: keep the count (HPA does the same)
        replicas = 1 if from_zero(ctx) else ctx.desired  # unless requests wait at zero (KEDA activation)
        return Decision(replicas, state, {"metric": metric, "value": None, "target": target, "held": m.held})
    value = metric_value(metric, m)
    replicas = replica_calculator(value / target, m.replicas_active, m.replicas_starting, ctx.desired, tolerance)
    return Decision(replicas, state, {"metric": metric, "value": value, "target": target})
