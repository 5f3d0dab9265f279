"""`gpu-util`: HPA on GPU-Util (DCGM_FI_DEV_GPU_UTIL), the misleading baseline."""

# GPU-Util is the share of time a kernel was running (a duty cycle). A vLLM replica runs a step
# whenever it holds one request, so the signal sits near 1.0 under any real load: with the 0.8
# target it reads 1.25x the target and this policy can only scale up, never back down, until the
# pool is idle. GKE's "Best practices for autoscaling LLM inference workloads with GPUs"
# (cloud.google.com/kubernetes-engine/docs/best-practices/machine-learning/inference/autoscaling)
# notes that it measures a duty cycle, not the work done; 0.8 is the usual HPA target on it.
# Formula: kubernetes `replica_calculator.go`, desired = ceil(ready * util / target), 10% tolerance.

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._ratio import RatioState, check_ratio_params, ratio_decision


@dataclass(frozen=True)
class GpuUtilParams:
    target_gpu_busy: float = 0.8
    tolerance: float = 0.1
    decision_interval_s: float = 15.0  # HPA sync period

    def __post_init__(self) -> None:
        check_ratio_params("target_gpu_busy", self.target_gpu_busy, self.tolerance, self.decision_interval_s)


def gpu_util(ctx: ScalingContext, params: GpuUtilParams, state: RatioState) -> Decision[RatioState]:
    return ratio_decision(ctx, "gpu_busy", params.target_gpu_busy, params.tolerance, state)
