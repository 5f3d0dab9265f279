"""Every registered autoscaler, through the guard, on Hypothesis-drawn metric streams.

Ticks are integer gaps cumulative-summed; the loop is closed (each tick's `desired` is the last
answer) as the cluster runs it. Properties: answers within bounds, cooldowns and windows kept,
monotone in load, no scale-down in KPA panic, steady under constant load, deterministic, and
state never changed in place.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.api import PoolMetrics, ReplicaModel, ScalingContext
from policies.autoscalers.fixed import FixedParams
from policies.autoscalers.guard import GuardParams
from policies.autoscalers.hpa import HpaParams
from policies.autoscalers.kpa import KpaParams
from policies.autoscalers.ray_serve import RayServeParams
from policies.autoscalers.sla_planner import SlaPlannerParams
from policies.autoscalers.wva import WvaParams
from policies.registry import AUTOSCALERS

S = 1_000_000
NAMES = sorted(AUTOSCALERS)

VARIANTS = {
    "fixed": [FixedParams(), FixedParams(replicas=3)],
    "hpa": [HpaParams(), HpaParams(metric="kv_usage"), HpaParams(metric="gpu_busy"),
            HpaParams(metric="ongoing", target=20.0)],
    "kpa": [KpaParams(), KpaParams(container_concurrency=8), KpaParams(scale_down_delay_s=10.0),
            KpaParams(enable_scale_to_zero=True)],
    "ray-serve": [RayServeParams(), RayServeParams(upscaling_factor=0.5, downscaling_factor=0.3, upscale_delay_s=5.0,
                                                   downscale_delay_s=60.0)],
    "sla-planner": [SlaPlannerParams(role=r, load_predictor=p, decision_interval_s=30.0)
                    for r, p in itertools.product(("prefill", "decode", "aggregated"), ("constant", "moving-average"))],
    "wva": [WvaParams(), WvaParams(scale_up_threshold=0.8, scale_down_boundary=0.35)],
}


def params_for(name: str) -> st.SearchStrategy:
    return st.sampled_from(VARIANTS.get(name, [AUTOSCALERS[name].params_cls()]))


@st.composite
def replica_models(draw) -> ReplicaModel:
    tokens_per_s, itl_ms = draw(st.floats(50, 500)), draw(st.floats(5, 40))
    points = tuple((b, tokens_per_s * b ** 0.7, itl_ms * (1 + b / 64)) for b in (1, 8, 32, 64, 128, 256))
    return ReplicaModel(draw(st.floats(1000, 50_000)), points, draw(st.integers(10_000, 500_000)),
                        draw(st.sampled_from([64, 128, 256])))


LOAD = {
    # Light loads as often as heavy ones, so scale-downs happen as well as scale-ups.
    "waiting": st.integers(0, 10) | st.integers(0, 300), "running": st.integers(0, 20) | st.integers(0, 300),
    "kv_usage": st.floats(0, 1), "gpu_busy": st.floats(0, 1),
    "arrivals_per_s": st.floats(0, 50), "mean_prompt_tokens": st.floats(0, 8000), "mean_output_tokens": st.floats(0, 1000),
    "ttft_p99_ms": st.none() | st.floats(1, 60_000), "tpot_p50_ms": st.none() | st.floats(1, 500),
}


def pool_metrics(t_us: int, active: int, starting: int, load: dict) -> PoolMetrics:
    return PoolMetrics(
        now_us=t_us, replicas_active=active, replicas_starting=starting, replicas_draining=0,
        prompt_tokens_per_s=load["arrivals_per_s"] * load["mean_prompt_tokens"],
        output_tokens_per_s=load["arrivals_per_s"] * load["mean_output_tokens"], **load,
    )


@st.composite
def loads(draw) -> dict:
    return {k: draw(v) for k, v in LOAD.items()}


@st.composite
def streams(draw, min_steps: int = 1, max_steps: int = 30, min_active: int = 0):
    """[(t_us, PoolMetrics)]: gaps of 0.1-40 s cumulative-summed, so time only moves forward.

    Up to four regimes (a load with its active and starting counts) are drawn up front; the
    stream is runs of 1-8 ticks in one regime, so windows and streaks see steady stretches and
    bursts come and go, while a tick costs a few small draws.
    """
    regimes = draw(st.lists(st.tuples(loads(), st.integers(min_active, 12), st.integers(0, 4)), min_size=1, max_size=4))
    runs = draw(st.lists(
        st.tuples(st.integers(100, 40_000), st.integers(0, len(regimes) - 1), st.integers(1, 8)),
        min_size=min_steps, max_size=max_steps,
    ))
    out, t_ms = [], 0
    for gap_ms, k, repeat in runs:
        load, active, starting = regimes[k]
        for _ in range(repeat):
            t_ms += gap_ms
            out.append((t_ms * 1000, pool_metrics(t_ms * 1000, active, starting, load)))
    return out


@st.composite
def bounds(draw) -> tuple[int, int]:
    lo = draw(st.integers(0, 3))
    return lo, draw(st.integers(max(lo, 1), 16))


def run(name, params, guard, lo, hi, replica, stream, desired):
    """Closed loop: yields (ctx, state before, decision) per tick."""
    spec = AUTOSCALERS[name]
    state = spec.initial_state(params)
    for t, m in stream:
        ctx = ScalingContext(t, "pool", m, desired, lo, hi, replica)
        decision = spec.step(ctx, params, guard, state)
        yield ctx, state, decision
        state, desired = decision.state, decision.replicas


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_closed_loop_keeps_bounds_and_cooldowns_is_deterministic_and_never_mutates(name, data):
    lo, hi = data.draw(bounds())
    spec, params = AUTOSCALERS[name], data.draw(params_for(name))
    up_s, down_s = data.draw(st.sampled_from([0, 7, 30, 120])), data.draw(st.sampled_from([0, 20, 300]))
    guard, replica = GuardParams(float(up_s), float(down_s)), data.draw(st.none() | replica_models())
    stream, desired0 = data.draw(streams()), data.draw(st.integers(0, 20))
    state, desired = spec.initial_state(params), desired0
    decisions, last_up, last_change = [], None, None
    for t, m in stream:
        ctx = ScalingContext(t, "pool", m, desired, lo, hi, replica)
        seen = copy.deepcopy((ctx, params, guard, state))
        d = spec.step(ctx, params, guard, state)
        assert lo <= d.replicas <= hi
        assert (ctx, params, guard, state) == seen  # nothing the policy was given changed
        hash(d.state)  # frozen all the way down: dataclasses of tuples and numbers
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.state.held = 0  # type: ignore[misc]
        in_bounds = lo <= desired <= hi  # else the bounds, not the policy, force the first move
        if d.replicas > desired:
            assert not in_bounds or last_up is None or t - last_up >= up_s * S
            last_up = last_change = t
        elif d.replicas < desired:
            assert not in_bounds or last_change is None or t - last_change >= down_s * S
            last_change = t
        decisions.append(d)
        state, desired = d.state, d.replicas
    # Same inputs, same answers, states and signals.
    assert [d for _, _, d in run(name, params, guard, lo, hi, replica, stream, desired0)] == decisions


MORE = {
    "waiting": st.integers(1, 20), "running": st.integers(1, 20), "kv_usage": st.floats(0, 0.2),
    "gpu_busy": st.floats(0, 0.2), "arrivals_per_s": st.floats(0, 5), "mean_prompt_tokens": st.floats(0, 500),
    "mean_output_tokens": st.floats(0, 100), "ttft_p99_ms": st.floats(0, 1000), "tpot_p50_ms": st.floats(0, 20),
}


def _more(load: dict, extra: dict) -> dict:
    hi = {}
    for k, v in load.items():
        if v is None:
            hi[k] = None
        elif k in ("kv_usage", "gpu_busy"):
            hi[k] = min(1.0, v + extra[k])
        else:
            hi[k] = v + extra[k]
    return hi


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=100)
def test_more_load_never_yields_fewer_replicas(name, data):
    lo, hi = data.draw(bounds())
    params = data.draw(params_for(name))
    # Mostly a decision tick (interval 0 through the guard); a held tick answers the same anyway.
    guard = GuardParams(data.draw(st.sampled_from([0.0, 30.0])), decision_interval_s=data.draw(st.sampled_from([0.0, None])))
    replica = data.draw(st.none() | replica_models())
    prefix = data.draw(streams(min_steps=0, max_steps=6))
    state = AUTOSCALERS[name].initial_state(params)
    for _, _, d in run(name, params, guard, lo, hi, replica, prefix, data.draw(st.integers(lo, hi))):
        state = d.state
    t = (prefix[-1][0] if prefix else 0) + data.draw(st.integers(1, 40_000)) * 1000
    active, starting = data.draw(st.integers(0, 12)), data.draw(st.integers(0, 4))
    load = data.draw(loads())
    extra = {k: data.draw(more) for k, more in MORE.items()}
    spec = AUTOSCALERS[name]

    def answer(load_):
        ctx = ScalingContext(t, "pool", pool_metrics(t, active, starting, load_), active + starting, lo, hi, replica)
        return spec.step(ctx, params, guard, state).replicas

    base = answer(load)
    assert answer(_more(load, extra)) >= base
    for k in MORE:  # and each signal alone, which isolates the edges a joint step can hide
        assert answer(_more(load, {f: extra[f] if f == k else 0 for f in MORE})) >= base, k


@given(data=st.data())
@settings(max_examples=100)
def test_kpa_never_scales_down_in_panic(data):
    lo, hi = data.draw(bounds())
    guard = GuardParams(data.draw(st.sampled_from([0.0, 10.0])))
    steps = run("kpa", data.draw(params_for("kpa")), guard, lo, hi, data.draw(st.none() | replica_models()),
                data.draw(streams(min_steps=5, max_steps=40)), data.draw(st.integers(lo, hi)))
    for ctx, before, d in steps:
        if before.inner.panic_time_us is not None and d.state.inner.panic_time_us is not None:
            assert d.replicas >= ctx.desired


@given(data=st.data())
@settings(max_examples=150)
def test_hpa_scales_down_only_below_every_recommendation_of_the_window(data):
    lo, hi = data.draw(bounds())
    recommendations = []
    steps = run("hpa", data.draw(params_for("hpa")), GuardParams(), lo, hi, None, data.draw(streams(5, 40)),
                data.draw(st.integers(lo, hi)))
    for ctx, _, d in steps:
        if d.signals.get("held"):
            continue
        recommendations.append((ctx.now_us, d.signals["recommendation"]))
        if d.replicas < ctx.desired:
            window = [r for t, r in recommendations if t >= ctx.now_us - 300 * S]
            assert max(window) <= d.replicas


@given(data=st.data())
@settings(max_examples=150)
def test_ray_serve_acts_only_after_its_delay_of_consecutive_decisions(data):
    lo, hi = data.draw(bounds())
    params = data.draw(params_for("ray-serve"))
    history = []  # (t_us, desired_raw, desired, changed) of every decision
    steps = run("ray-serve", params, GuardParams(), lo, hi, None, data.draw(streams(5, 40, min_active=1)),
                data.draw(st.integers(lo, hi)))
    for ctx, _, d in steps:
        raw = d.signals["desired_raw"]
        acted = d.replicas != ctx.desired and d.signals["policy_replicas"] != ctx.desired
        if acted:  # the policy moved (not only the bounds): its streak must span the delay
            up, start = d.replicas > ctx.desired, ctx.now_us
            for t, raw_, desired_, changed in reversed(history):
                if changed or raw_ == desired_ or (raw_ > desired_) != up:
                    break
                start = t
            delay = params.upscale_delay_s if up else params.downscale_delay_s
            assert ctx.now_us - start >= delay * S
        history.append((ctx.now_us, raw, ctx.desired, d.replicas != ctx.desired))


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=20)
def test_constant_load_settles_to_a_constant_answer(name, data):
    lo, hi = data.draw(st.integers(0, 2)), data.draw(st.integers(2, 10))
    gap_s = data.draw(st.sampled_from([5, 15, 30]))
    guard = GuardParams(float(data.draw(st.integers(0, 60))), float(data.draw(st.integers(0, 60))))
    load = data.draw(loads())
    m = pool_metrics(0, data.draw(st.integers(0, 12)), data.draw(st.integers(0, 4)), load)
    stream = [(t * S, dataclasses.replace(m, now_us=t * S)) for t in range(0, 2100, gap_s)]
    answers = [(ctx.now_us, d.replicas) for ctx, _, d in
               run(name, data.draw(params_for(name)), guard, lo, hi, data.draw(st.none() | replica_models()), stream,
                   data.draw(st.integers(lo, hi)))]
    assert len({n for t, n in answers if t >= 1500 * S}) == 1


# `fixed` with no count of its own keeps the pool where it is: at 0 it never leaves, and the
# cluster rejects such a pool's requests instead of holding them (replay.fleet.cluster.holds_arrivals).
LEAVES_ZERO = {name: [p for p in VARIANTS.get(name, [AUTOSCALERS[name].params_cls()])
                      if not (isinstance(p, FixedParams) and not p.replicas)] for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=50)
def test_a_pool_at_zero_with_requests_held_at_it_scales_up(name, data):
    """Whatever came before, a pool asked to have 0 replicas whose requests wait at it (held,
    counted in `waiting`) gets a replica as soon as the scale-up cooldown lets it: at once, not
    at the policy's next decision interval (Knative's poke, WVA's scale-from-zero loop)."""
    hi = data.draw(st.integers(1, 16))
    params = data.draw(st.sampled_from(LEAVES_ZERO[name]))
    up_s = data.draw(st.sampled_from([0, 7, 30, 120]))
    guard = GuardParams(float(up_s), float(data.draw(st.sampled_from([0, 20, 300]))),
                        decision_interval_s=data.draw(st.sampled_from([None, 0.0, 600.0])))
    replica = data.draw(st.none() | replica_models())
    prefix = data.draw(streams(min_steps=0, max_steps=6))
    state = AUTOSCALERS[name].initial_state(params)
    for _, _, d in run(name, params, guard, 0, hi, replica, prefix, data.draw(st.integers(0, hi))):
        state = d.state
    t0 = (prefix[-1][0] if prefix else 0) + data.draw(st.integers(1, 40_000)) * 1000
    load = {**data.draw(loads()), "kv_usage": 0.0, "gpu_busy": 0.0, "running": 0}
    held = data.draw(st.integers(1, 50))
    for k in range(up_s + 2):  # ticks of 1 s while nothing starts
        t = t0 + k * S
        m = dataclasses.replace(pool_metrics(t, 0, 0, {**load, "waiting": held}), held=held)
        d = AUTOSCALERS[name].step(ScalingContext(t, "pool", m, 0, 0, hi, replica), params, guard, state)
        assert 0 <= d.replicas <= hi
        if d.replicas >= 1:
            assert k == 0 or d.signals.get("blocked") is None
            return
        assert d.signals.get("blocked") == "scale_up_cooldown", d.signals  # only a cooldown holds it at 0
        state = d.state
    pytest.fail(f"{name} kept a pool with {held} held requests at 0 replicas past its {up_s} s cooldown")
