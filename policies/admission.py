"""Admission policies: at arrival, admit or reject with a reason. The decision runs inside the
engines (`engine_nb.admit`, `engine_ref._admit`); these are their parameters and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlwaysParams:
    """Admit everything (vLLM itself never refuses a request that fits its context)."""


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


@dataclass(frozen=True)
class TokenBucketParams:
    """Per tenant: a bucket of `capacity_tokens` refilled at `refill_tokens_per_s`; a request
    costs its prompt + output tokens and is rejected when the bucket cannot pay."""

    capacity_tokens: int = 10_000
    refill_tokens_per_s: int = 1_000

    def __post_init__(self) -> None:
        if self.capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens: got {self.capacity_tokens}, expected > 0")
        if self.refill_tokens_per_s < 0:
            raise ValueError(f"refill_tokens_per_s: got {self.refill_tokens_per_s}, expected >= 0")


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


@dataclass(frozen=True)
class SloAwareParams:
    """Reject when the predicted TTFT (the chosen replica's queued tokens and this prompt, at the
    step model's prefill rate) exceeds `ttft_multiple` times the SLO's TTFT target."""

    ttft_multiple: float = 1.0

    def __post_init__(self) -> None:
        if not self.ttft_multiple > 0:
            raise ValueError(f"ttft_multiple: got {self.ttft_multiple}, expected > 0")
