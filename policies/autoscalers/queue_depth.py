"""`queue-depth`: HPA-style scaling on requests waiting in the engines, per active replica."""

# The signal the lesson recommends ("scale on the queue"): GKE's LLM autoscaling best practices
# name queue size as the server metric for throughput within a latency target. Default target 5
# waiting per replica, llm-d's saturation threshold (`queueLengthThreshold` / EPP
# `queueDepthThreshold` = 5). Formula: kubernetes `replica_calculator.go`, ceil(N * current / target)
# with the 10% tolerance band.

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._ratio import RatioState, check_ratio_params, ratio_decision


@dataclass(frozen=True)
class QueueDepthParams:
    target_waiting_per_replica: float = 5.0
    tolerance: float = 0.1
    decision_interval_s: float = 15.0  # HPA sync period

    def __post_init__(self) -> None:
        check_ratio_params("target_waiting_per_replica", self.target_waiting_per_replica, self.tolerance,
                           self.decision_interval_s)


def queue_depth(ctx: ScalingContext, params: QueueDepthParams, state: RatioState) -> Decision[RatioState]:
    return ratio_decision(ctx, "waiting", params.target_waiting_per_replica, params.tolerance, state)
