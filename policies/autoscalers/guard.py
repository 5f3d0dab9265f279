"""The one wrapper around every autoscaler: decision interval, bounds and cooldowns (µs inside)."""

# Ray Serve keeps bounds, delays and cold start in one wrapper (`_apply_autoscaling_config` in
# `python/ray/serve/autoscaling_policy.py`) instead of in each policy; this is that wrapper. Order
# per tick: between decisions hold the last answer (the policy only records samples); at a decision
# ask the policy, clamp to [ctx.min_replicas, ctx.max_replicas], then apply the cooldowns, then
# clamp again so bounds always win. A pool at zero with requests held at it is decided at once,
# not at the next interval: Knative's stat server pokes the scaler when the activator reports
# concurrency for a revision at scale 0 (`MultiScaler.Poke` in knative/serving
# `pkg/autoscaler/scaling/multiscaler.go`), and WVA's scale-from-zero engine polls every 100 ms.

from __future__ import annotations

import numbers
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from common.errors import UserError
from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_number, from_zero, us

S = TypeVar("S")

PolicyFn = Callable[[ScalingContext, Any, Any], Decision]
ObserveFn = Callable[[ScalingContext, Any, Any], Any]


@dataclass(frozen=True)
class GuardParams:
    """Shared knobs of every autoscaler (`autoscaler.guard` in the config).

    scale_up_cooldown_s: least time between two scale-ups.
    scale_down_cooldown_s: least time between any scale event (up or down) and a scale-down, so
        a pool does not shrink right after it grew.
    decision_interval_s: how often the policy decides; between decisions the last answer holds.
        None: the policy's own `decision_interval_s` (HPA sync period 15 s, KPA tick 2 s, ...).
    scrape_delay_s: how stale the metrics the policy sees are. The cluster applies it (it passes
        the scrape taken `scrape_delay_s` earlier as `ctx.metrics`); it lives here so the config
        has one place for it.
    Bounds come from `ctx.min_replicas` / `ctx.max_replicas` (the pool's config).
    """

    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 0.0
    decision_interval_s: float | None = None
    scrape_delay_s: float = 0.0

    def __post_init__(self) -> None:
        check_number("scale_up_cooldown_s", self.scale_up_cooldown_s, lo=0)
        check_number("scale_down_cooldown_s", self.scale_down_cooldown_s, lo=0)
        if self.decision_interval_s is not None:
            check_number("decision_interval_s", self.decision_interval_s, lo=0)
        check_number("scrape_delay_s", self.scrape_delay_s, lo=0)

    def interval_us(self, params: Any) -> int:
        seconds = params.decision_interval_s if self.decision_interval_s is None else self.decision_interval_s
        return us(seconds)


@dataclass(frozen=True)
class GuardState(Generic[S]):
    inner: S  # the policy's own state
    held: int | None = None  # the last answer, held between decisions
    last_decision_us: int | None = None
    last_scale_up_us: int | None = None
    last_scale_down_us: int | None = None


def clamp(n: int, ctx: ScalingContext) -> int:
    return max(ctx.min_replicas, min(ctx.max_replicas, n))


def _cooled(now_us: int, last_us: int | None, cooldown_us: int) -> bool:
    return last_us is None or now_us - last_us >= cooldown_us


def guard_step(
    fn: PolicyFn, observe: ObserveFn | None, ctx: ScalingContext, params: Any, guard: GuardParams,
    state: GuardState,
) -> Decision[GuardState]:
    """One control tick of `fn` under the guard; pure, returns the next `GuardState`."""
    now = ctx.now_us
    interval_us = guard.interval_us(params)
    between = state.last_decision_us is not None and now - state.last_decision_us < interval_us
    if state.held is not None and between and not from_zero(ctx):
        inner = observe(ctx, params, state.inner) if observe is not None else state.inner
        held = clamp(state.held, ctx)
        # the state's other fields as they were (a constructor call: dataclasses.replace costs ~5 us a tick)
        kept = GuardState(inner, state.held, state.last_decision_us, state.last_scale_up_us, state.last_scale_down_us)
        return Decision(held, kept, {"held": True, "replicas": held})

    decision = _checked(fn, fn(ctx, params, state.inner))
    proposed = clamp(decision.replicas, ctx)
    current = ctx.desired
    answer, blocked = proposed, None
    if proposed > current and not _cooled(now, state.last_scale_up_us, us(guard.scale_up_cooldown_s)):
        answer, blocked = current, "scale_up_cooldown"
    elif proposed < current:
        last_change = max((t for t in (state.last_scale_up_us, state.last_scale_down_us) if t is not None), default=None)
        if not _cooled(now, last_change, us(guard.scale_down_cooldown_s)):
            answer, blocked = current, "scale_down_cooldown"
    answer = clamp(answer, ctx)
    up, down = state.last_scale_up_us, state.last_scale_down_us
    if answer > current:
        up = now
    elif answer < current:
        down = now
    signals = dict(decision.signals)
    signals.update(policy_replicas=decision.replicas, proposed=proposed, blocked=blocked)
    next_state = GuardState(decision.state, answer, now, up, down)
    return Decision(answer, next_state, signals)


def _checked(fn: PolicyFn, decision: Any) -> Decision:
    """A user's autoscaler (a --plugin) may return anything: what is not a Decision with an
    integer replica count and a dict of signals ends the run naming the policy, not deep in here."""
    replicas = getattr(decision, "replicas", None)
    # (a plain int first: the ABC check of numbers.Integral is a few us a tick)
    if (isinstance(decision, Decision) and (type(replicas) is int or isinstance(replicas, numbers.Integral))
            and not isinstance(replicas, bool) and isinstance(decision.signals, dict)):
        return decision
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    got = reprlib.repr(decision) if not isinstance(decision, Decision) else \
        f"Decision(replicas={reprlib.repr(replicas)}, signals={reprlib.repr(decision.signals)})"
    raise UserError(f"autoscaler {name} returned {got}; expected policies.api.Decision(replicas=<an int>, "
                    "state, signals=<a dict>)")


def guarded(fn: PolicyFn, guard: GuardParams, observe: ObserveFn | None = None
            ) -> Callable[[ScalingContext, Any, Any], Decision[GuardState]]:
    """`fn` behind `guard` as one `step(ctx, params, state)`; `state` may be the policy's own
    initial state (wrapped on the first call) or the `GuardState` a previous step returned.
    Pass the spec's `observe` so windowed policies see every tick, not only their decisions."""

    def step(ctx: ScalingContext, params: Any, state: Any) -> Decision[GuardState]:
        if not isinstance(state, GuardState):
            state = GuardState(state)
        return guard_step(fn, observe, ctx, params, guard, state)

    return step
