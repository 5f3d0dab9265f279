"""`ray-serve`: Ray Serve's default policy, target ongoing requests per replica with delays."""

# Upstream: ray `python/ray/serve/autoscaling_policy.py` (`_calculate_desired_num_replicas`,
# `replica_queue_length_autoscaling_policy`, later split into `_apply_scaling_factors` and
# `_apply_delay_logic`) and `AutoscalingConfig` defaults in `python/ray/serve/config.py`:
# target_ongoing_requests 2 (since Ray 2.32), upscale_delay_s 30, downscale_delay_s 600,
# look_back_period_s 30, upscaling/downscaling factor = smoothing_factor 1.0. Reproduced:
# - total ongoing requests (waiting + running) averaged over the look-back period;
# - error = total / (target * running); desired = ceil(running * (1 + factor * (error - 1))),
#   minus one when the factor leaves it stuck at `running` though the raw ratio says fewer;
# - bounds [ctx.min_replicas, ctx.max_replicas] before the delay logic, as upstream;
# - the decision counter: a change is made only after `upscale_delay_s` (or `downscale_delay_s`,
#   or `downscale_to_zero_delay_s` for 1 -> 0) of consecutive decisions in the same direction;
#   any decision the other way, or "no change", resets it. Upstream counts control-loop periods
#   (`counter > int(delay_s / CONTROL_LOOP_INTERVAL_S)`, 0.1 s); the streak here is timed from its
#   first decision with `ctx.now_us`, which is the same thing without assuming the tick period;
# - cold start: with no running replica and requests arriving, go to max(ceil(upscaling_factor),
#   target) at once, bypassing the delays. Requests held at a pool with no replica count in the
#   total, as a handle's queued requests do (`total_num_requests`; the handle blocks until a
#   replica is available: doc/source/serve/autoscaling.md, min_replicas 0).

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_number, mean, since, us


@dataclass(frozen=True)
class RayServeParams:
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    smoothing_factor: float = 1.0
    upscaling_factor: float | None = None  # None: smoothing_factor
    downscaling_factor: float | None = None
    look_back_period_s: float = 30.0
    decision_interval_s: float = 0.1  # CONTROL_LOOP_INTERVAL_S

    def __post_init__(self) -> None:
        check_number("target_ongoing_requests", self.target_ongoing_requests, lo=0, lo_open=True)
        check_number("upscale_delay_s", self.upscale_delay_s, lo=0)
        check_number("downscale_delay_s", self.downscale_delay_s, lo=0)
        if self.downscale_to_zero_delay_s is not None:
            check_number("downscale_to_zero_delay_s", self.downscale_to_zero_delay_s, lo=0)
        check_number("smoothing_factor", self.smoothing_factor, lo=0, lo_open=True)
        for name in ("upscaling_factor", "downscaling_factor"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), lo=0, lo_open=True)
        check_number("look_back_period_s", self.look_back_period_s, lo=0, lo_open=True)
        check_number("decision_interval_s", self.decision_interval_s, lo=0)

    @property
    def up_factor(self) -> float:
        return self.smoothing_factor if self.upscaling_factor is None else self.upscaling_factor

    @property
    def down_factor(self) -> float:
        return self.smoothing_factor if self.downscaling_factor is None else self.downscaling_factor


@dataclass(frozen=True)
class RayServeState:
    samples: tuple[tuple[int, float], ...] = ()  # (t_us, total ongoing) within the look-back
    decision_counter: int = 0  # > 0: consecutive upscale decisions, < 0: downscale
    streak_start_us: int | None = None


def ray_serve_state(params: RayServeParams) -> RayServeState:
    return RayServeState()


def ray_serve_observe(ctx: ScalingContext, params: RayServeParams, state: RayServeState) -> RayServeState:
    kept = since(state.samples, ctx.now_us - us(params.look_back_period_s))
    return RayServeState(kept + ((ctx.now_us, float(ctx.metrics.ongoing_requests)),), state.decision_counter,
                         state.streak_start_us)


def desired_num_replicas(total: float, running: int, params: RayServeParams) -> int:
    """`_calculate_desired_num_replicas` without the bounds."""
    error = total / (params.target_ongoing_requests * running)
    factor = params.up_factor if error >= 1 else params.down_factor
    desired = math.ceil(running * (1 + (error - 1) * factor))
    if math.ceil(running * error) < running and desired == running:
        desired -= 1
    return desired


def ray_serve(ctx: ScalingContext, params: RayServeParams, state: RayServeState) -> Decision[RayServeState]:
    now = ctx.now_us
    state = ray_serve_observe(ctx, params, state)
    total = mean([v for _, v in state.samples])
    running, target = ctx.metrics.replicas_active, ctx.desired
    signals = {"metric": "ongoing_requests", "value": total, "target": params.target_ongoing_requests}
    if running == 0:
        if total > 0 or ctx.metrics.arrivals_per_s > 0:
            target = max(math.ceil(params.up_factor), target)
        return Decision(target, state, {**signals, "cold_start": True})

    desired = desired_num_replicas(total, running, params)
    desired = max(ctx.min_replicas, min(ctx.max_replicas, desired))
    counter, start = state.decision_counter, state.streak_start_us
    decision = target
    if desired > target:
        if counter <= 0:
            counter, start = 0, now
        counter += 1
        if now - start >= us(params.upscale_delay_s):
            counter, start, decision = 0, None, desired
    elif desired < target:
        if counter >= 0:
            counter, start = 0, now
        counter -= 1
        delay_s = params.downscale_delay_s
        if target == 1 and params.downscale_to_zero_delay_s is not None:
            delay_s = params.downscale_to_zero_delay_s
        if target != 1:
            desired = max(1, desired)
        if now - start >= us(delay_s):
            counter, start, decision = 0, None, desired
    else:
        counter, start = 0, None
    signals.update(desired_raw=desired, decision_counter=counter)
    return Decision(decision, RayServeState(state.samples, counter, start), signals)
