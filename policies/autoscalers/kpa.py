"""`kpa`: the Knative Pod Autoscaler on request concurrency, with stable and panic windows."""

# Upstream: knative/serving `pkg/autoscaler/scaling/autoscaler.go` (`Scale`) and
# `pkg/autoscaler/config` defaults; target from `pkg/reconciler/autoscaling/resources`
# (`ResolveMetricTarget`). Reproduced, per 2 s tick (`decision_interval_s`):
# - concurrency = waiting + running requests of the pool, averaged over the 60 s stable window and
#   the 6 s panic window (10% of stable); waiting includes the requests held at a pool with no
#   replica, as the activator reports the requests it buffers as the revision's concurrency, so a
#   pool at zero scales to ceil(held / target) >= 1 (and the guard decides at once: `MultiScaler.Poke`);
# - desired = ceil(average / target) for each window, kept within
#   [floor(ready / max_scale_down_rate), ceil(max_scale_up_rate * ready)] (2 and 1000), ready >= 1;
# - panic starts when the panic desired count is >= 200% of the ready count and lasts until the
#   stable window has passed without crossing again; in panic the count never goes down
#   (it is the max seen since panic began), and the larger of stable and panic desired is used;
# - a new autoscaler over more than one ready pod starts in panic at the ready count, as upstream;
# - scale_down_delay_s (0): a max over that window; scale-to-zero off by default.
# Target: Knative uses containerConcurrency (else the 100 default) * 0.7. For LLM serving the
# container concurrency that matters is the engine's `max_num_seqs`, so with `container_concurrency`
# unset the target is 0.7 * ctx.replica.max_num_seqs (100 * 0.7 when the replica model is absent).

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter

from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_int, check_number, since, us

_TIME, _VALUE = itemgetter(0), itemgetter(1)


@dataclass(frozen=True)
class KpaParams:
    container_concurrency: int | None = None  # None: ctx.replica.max_num_seqs; 0: unlimited
    container_concurrency_target_default: float = 100.0
    target_utilization: float = 0.7  # container-concurrency-target-percentage: 70
    stable_window_s: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay_s: float = 0.0
    enable_scale_to_zero: bool = False
    scale_to_zero_grace_period_s: float = 30.0
    decision_interval_s: float = 2.0  # tick-interval

    def __post_init__(self) -> None:
        if self.container_concurrency is not None:
            check_int("container_concurrency", self.container_concurrency, lo=0)
        check_number("container_concurrency_target_default", self.container_concurrency_target_default, lo=0,
                     lo_open=True)
        check_number("target_utilization", self.target_utilization, lo=0, hi=1, lo_open=True)
        check_number("stable_window_s", self.stable_window_s, lo=0, lo_open=True)
        check_number("panic_window_percentage", self.panic_window_percentage, lo=0, hi=100, lo_open=True)
        check_number("panic_threshold_percentage", self.panic_threshold_percentage, lo=100)
        check_number("max_scale_up_rate", self.max_scale_up_rate, lo=1, lo_open=True)
        check_number("max_scale_down_rate", self.max_scale_down_rate, lo=1, lo_open=True)
        check_number("scale_down_delay_s", self.scale_down_delay_s, lo=0)
        check_number("scale_to_zero_grace_period_s", self.scale_to_zero_grace_period_s, lo=0)
        check_number("decision_interval_s", self.decision_interval_s, lo=0)


@dataclass(frozen=True)
class KpaState:
    samples: tuple[tuple[int, float], ...] = ()  # (t_us, pool concurrency) within the stable window
    started: bool = False
    panic_time_us: int | None = None  # last time the panic threshold was crossed
    max_panic_pods: int = 0
    delay_window: tuple[tuple[int, int], ...] = ()  # (t_us, desired) within scale_down_delay_s
    last_nonzero_us: int | None = None


def kpa_state(params: KpaParams) -> KpaState:
    return KpaState()


def kpa_target(ctx: ScalingContext, params: KpaParams) -> float:
    total = params.container_concurrency
    if total is None:
        total = ctx.replica.max_num_seqs if ctx.replica is not None else 0
    if total == 0:
        total = params.container_concurrency_target_default
    return max(1.0, total * params.target_utilization)


def kpa_observe(ctx: ScalingContext, params: KpaParams, state: KpaState) -> KpaState:
    return KpaState(_observed(ctx, params, state.samples), state.started, state.panic_time_us, state.max_panic_pods,
                    state.delay_window, state.last_nonzero_us)


def _observed(ctx: ScalingContext, params: KpaParams, samples: tuple) -> tuple:
    """The stable window's samples with this tick's concurrency added."""
    return since(samples, ctx.now_us - us(params.stable_window_s)) + ((ctx.now_us, float(ctx.metrics.ongoing_requests)),)


def _window_mean(samples: tuple, cutoff_us: int) -> float:
    """The mean value of the samples after cutoff_us: their suffix (samples are in time order,
    as `since` keeps them), summed in order, as the mean of a list of them filtered by time was,
    in a third of its time (a list comprehension over the 60 samples of each window was ~5 us a
    decision, one every other tick of a day: issue 15)."""
    first = bisect_right(samples, cutoff_us, key=_TIME)
    n = len(samples) - first
    return sum(map(_VALUE, islice(samples, first, None))) / n if n else 0.0


def kpa(ctx: ScalingContext, params: KpaParams, state: KpaState) -> Decision[KpaState]:
    now = ctx.now_us
    samples = _observed(ctx, params, state.samples)
    stable_us = us(params.stable_window_s)
    panic_us = us(params.stable_window_s * params.panic_window_percentage / 100.0)
    active = ctx.metrics.replicas_active
    ready = max(1, active)
    panic_time, max_panic = state.panic_time_us, state.max_panic_pods
    if not state.started and active > 1:  # a fresh autoscaler keeps the current scale until it has data
        panic_time, max_panic = now, active

    target = kpa_target(ctx, params)
    stable_value = _window_mean(samples, now - stable_us)
    panic_value = _window_mean(samples, now - panic_us)
    max_up = math.ceil(params.max_scale_up_rate * ready)
    max_down = math.floor(ready / params.max_scale_down_rate)
    dspc = math.ceil(stable_value / target)
    dppc = math.ceil(panic_value / target)
    desired_stable = int(min(max(dspc, max_down), max_up))
    desired_panic = int(min(max(dppc, max_down), max_up))

    over = dppc / ready >= params.panic_threshold_percentage / 100.0
    if over:
        panic_time = now
    elif panic_time is not None and panic_time + stable_us < now:
        panic_time, max_panic = None, 0
    desired = desired_stable
    if panic_time is not None:  # no scale-down while panicking: not below what the pool has now
        max_panic = max(max_panic, desired_stable, desired_panic, ctx.desired)
        desired = max_panic

    delay_window = state.delay_window
    if params.scale_down_delay_s > 0:
        delay_window = since(delay_window, now - us(params.scale_down_delay_s)) + ((now, desired),)
        desired = max(d for _, d in delay_window)

    last_nonzero = now if desired > 0 else state.last_nonzero_us
    if desired == 0:
        grace = last_nonzero is not None and now - last_nonzero < us(params.scale_to_zero_grace_period_s)
        if not params.enable_scale_to_zero or grace:
            desired = 1
    signals = {"metric": "concurrency", "value": stable_value, "panic_value": panic_value, "target": target,
               "panic": panic_time is not None, "desired_stable": desired_stable, "desired_panic": desired_panic}
    next_state = KpaState(samples, True, panic_time, max_panic, delay_window, last_nonzero)
    return Decision(desired, next_state, signals)
