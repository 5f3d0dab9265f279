"""queue-limit: reject while the pool's waiting requests or waiting prompt tokens are at a cap.

Upstream: a gateway's queue caps, as Envoy's circuit breaker `max_pending_requests` or
llm-d's queue-depth threshold: past the cap a request is refused instead of queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from policies.admission._view import A_MAX_WAITING, A_MAX_WAITING_TOKENS, AdmissionView

READS_POOL = True
REASON = "queue_limit"
SPECS = (("queue-limit", "reject while the pool's waiting requests or waiting prompt tokens are at a cap",
          "gateway queue caps (Envoy max_pending_requests, llm-d queue threshold)"),)


@dataclass(frozen=True)
class QueueLimitParams:
    """Reject while the pool's queue is at a cap: waiting requests, or waiting prompt tokens
    (0 turns a cap off). As a gateway's max-queue setting (e.g. Envoy's max_pending_requests)."""

    max_waiting: int = 0
    max_waiting_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("max_waiting", "max_waiting_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected a cap >= 0 (0 turns it off)")
        if self.max_waiting == 0 and self.max_waiting_tokens == 0:
            raise ValueError("max_waiting: set max_waiting or max_waiting_tokens (both 0 would admit everything)")

    def columns(self) -> dict[str, int]:
        return {"max_waiting": self.max_waiting, "max_waiting_tokens": self.max_waiting_tokens}


Params = QueueLimitParams


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    if (a[A_MAX_WAITING] > 0 and v.waiting >= a[A_MAX_WAITING]) or (
            a[A_MAX_WAITING_TOKENS] > 0 and v.waiting_tokens + v.prompt[q] > a[A_MAX_WAITING_TOKENS]):
        return 1
    return 0


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    full = a[A_MAX_WAITING] and v.waiting >= a[A_MAX_WAITING]
    too_many_tokens = a[A_MAX_WAITING_TOKENS] and v.waiting_tokens + v.prompt[q] > a[A_MAX_WAITING_TOKENS]
    return int(bool(full or too_many_tokens))
