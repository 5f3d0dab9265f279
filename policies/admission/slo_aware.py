"""slo-aware: reject when the predicted TTFT exceeds a multiple of the SLO's TTFT target.

Upstream: SLO-aware admission that predicts TTFT from the queue ahead (DistServe- and
QLM-style prediction): here the chosen replica's waiting tokens and this prompt, prefilled at
the step model's prefill rate (EngineInputs.pool_prefill_tokens_per_s, set by the fleet).
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from policies.admission._view import A_PREFILL, A_SLO_MILLI, AdmissionView

READS_POOL = True
REASON = "predicted_ttft_over_slo"
NEEDS_PREFILL_RATE = True  # the fleet fills the prefill_tokens_per_s column from the step model
SPECS = (("slo-aware", "reject when the predicted TTFT exceeds a multiple of the SLO",
          "SLO-aware admission (e.g. DistServe / QLM style TTFT prediction)"),)


@dataclass(frozen=True)
class SloAwareParams:
    """Reject when the predicted TTFT (the chosen replica's queued tokens and this prompt, at the
    step model's prefill rate) exceeds `ttft_multiple` times the SLO's TTFT target."""

    ttft_multiple: float = 1.0

    def __post_init__(self) -> None:
        if not self.ttft_multiple > 0:
            raise ValueError(f"ttft_multiple: got {self.ttft_multiple}, expected > 0")

    def columns(self) -> dict[str, int]:
        return {"slo_multiple_milli": round(self.ttft_multiple * 1000)}


Params = SloAwareParams


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    predicted_us = (v.wait_tokens[r] + v.prompt[q]) * 1_000_000 // max(a[A_PREFILL], 1)
    if predicted_us > a[A_SLO_MILLI] * v.ttft_budget[p] // 1000:
        return 1
    return 0


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    predicted_us = (v.wait_tokens[r] + v.prompt[q]) * 1_000_000 // max(a[A_PREFILL], 1)
    return int(predicted_us > a[A_SLO_MILLI] * v.ttft_budget[p] // 1000)
