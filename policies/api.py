"""Frozen context types the cluster builds for policies; policies never import `replay`.

A policy is a pure function of a context (which carries `now_us`) and explicit state; it never
reads a clock. Autoscalers: `def name(ctx: ScalingContext, params: P, state: S) -> Decision[S]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class PoolMetrics:
    """One metrics scrape of a pool, as Prometheus would show it at `now_us`.

    Gauges are summed (or averaged, where said) over the pool's active replicas; rates are over
    the interval since the previous scrape.
    """

    now_us: int
    replicas_active: int
    replicas_starting: int  # provisioning + loading: capacity already on its way
    replicas_draining: int
    waiting: int  # requests queued in the engines, and those held at the pool (`held`)
    running: int  # requests in a running batch
    kv_usage: float  # mean over active replicas of used / total KV blocks, 0..1
    gpu_busy: float  # mean over active replicas of the share of time running a step (GPU-Util), 0..1
    arrivals_per_s: float
    prompt_tokens_per_s: float  # prefill tokens computed per second
    output_tokens_per_s: float
    mean_prompt_tokens: float  # of the requests that arrived in the interval (0 when none)
    mean_output_tokens: float
    ttft_p99_ms: float | None = None  # trailing window; None when no request got a first token
    tpot_p50_ms: float | None = None
    # Of `waiting`: requests held at the pool because no replica was active or starting when they
    # arrived (Knative's activator buffer, a Ray Serve handle's queue); they go to the first
    # replica that starts.
    held: int = 0

    @property
    def ongoing_requests(self) -> int:
        """Requests in flight (Ray Serve's and Knative's concurrency signal)."""
        return self.waiting + self.running


@dataclass(frozen=True)
class ReplicaModel:
    """What one replica of the pool can do, from the step model (for planners such as sla-planner).

    `prefill_tokens_per_s`: prefill throughput of one replica with batches that meet the TTFT
    target; `decode_tokens_per_s(seqs)` is not a callable here to keep contexts plain data:
    `decode_tokens_per_s_at` lists (batch size, tokens/s, inter-token latency ms) measured points.
    """

    prefill_tokens_per_s: float
    decode_tokens_per_s_at: tuple[tuple[int, float, float], ...]
    kv_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class ScalingContext:
    """What an autoscaler sees at a decision: the scraped metrics and the replica counts."""

    now_us: int
    pool: str
    metrics: PoolMetrics  # the latest scrape the policy can see (already delayed by the scrape delay)
    desired: int  # the replica count the pool is currently asked to have (active + starting)
    min_replicas: int
    max_replicas: int
    replica: ReplicaModel | None = None
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 100.0


@dataclass(frozen=True)
class Decision(Generic[S]):
    """An autoscaler's answer: the replica count it wants, its next state, and the signal values
    that drove the decision (recorded in events.parquet)."""

    replicas: int
    state: S
    signals: dict[str, Any] = field(default_factory=dict)
