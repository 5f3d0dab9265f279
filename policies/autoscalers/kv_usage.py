"""`kv-usage`: HPA-style scaling on mean KV-cache use of the active replicas (0..1)."""

# vLLM exports `vllm:kv_cache_usage_perc`; scaling on it is the lesson's other right signal.
# Default target 0.7, below llm-d's 0.8 saturation threshold so replicas arrive before requests
# queue. Formula: kubernetes `replica_calculator.go`, ceil(N * usage / target), 10% tolerance.

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._ratio import RatioState, check_ratio_params, ratio_decision


@dataclass(frozen=True)
class KvUsageParams:
    target_kv_usage: float = 0.7
    tolerance: float = 0.1
    decision_interval_s: float = 15.0  # HPA sync period

    def __post_init__(self) -> None:
        check_ratio_params("target_kv_usage", self.target_kv_usage, self.tolerance, self.decision_interval_s)


def kv_usage(ctx: ScalingContext, params: KvUsageParams, state: RatioState) -> Decision[RatioState]:
    return ratio_decision(ctx, "kv_usage", params.target_kv_usage, params.tolerance, state)
