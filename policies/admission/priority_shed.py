"""priority-shed: when the pool is saturated, reject the low-priority classes.

Upstream: load shedding by criticality, as the Gateway API inference extension's
InferenceObjective criticality (llm-d): a sheddable request is dropped when the pool is
saturated, a critical one is queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from policies.admission._view import A_SHED_AT, A_SHED_FROM, AdmissionView

READS_POOL = True
REASON = "shed_low_priority"
SPECS = (("priority-shed", "when saturated, reject the low-priority classes",
          "load shedding by criticality (llm-d / Gateway API inference extension criticality)"),)


@dataclass(frozen=True)
class PriorityShedParams:
    """When the pool is saturated (at least `waiting_per_replica` requests waiting per active
    replica), reject requests whose priority value is `shed_priority_from` or more (lower value =
    more urgent, as vLLM)."""

    waiting_per_replica: int = 8
    shed_priority_from: int = 1

    def __post_init__(self) -> None:
        if self.waiting_per_replica < 1:
            raise ValueError(f"waiting_per_replica: got {self.waiting_per_replica}, expected >= 1")

    def columns(self) -> dict[str, int]:
        return {"shed_waiting_per_replica": self.waiting_per_replica, "shed_priority_from": self.shed_priority_from}


Params = PriorityShedParams


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    if v.waiting >= a[A_SHED_AT] * max(v.active, 1) and v.priority[q] >= a[A_SHED_FROM]:
        return 1
    return 0


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    saturated = v.waiting >= a[A_SHED_AT] * max(v.active, 1)
    return int(saturated and v.priority[q] >= a[A_SHED_FROM])
