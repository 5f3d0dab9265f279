"""Autoscalers on hand-built metric sequences: each reproduces its upstream arithmetic.

Times are integer µs; `S` is one second. Contexts keep `desired = active + starting` unless a test
says otherwise, as the cluster does.
"""

from __future__ import annotations

import dataclasses

import pytest

from common.errors import ConfigError
from policies.api import PoolMetrics, ReplicaModel, ScalingContext
from policies.autoscalers import fixed, gpu_util, hpa, kpa, kv_usage, queue_depth, ray_serve, sla_planner, wva
from policies.autoscalers._ratio import RatioState
from policies.autoscalers.guard import GuardParams, GuardState, guard_step, guarded
from policies.registry import AUTOSCALERS, autoscaler_spec

S = 1_000_000
REPLICA = ReplicaModel(
    prefill_tokens_per_s=8000.0,
    decode_tokens_per_s_at=((8, 800.0, 20.0), (32, 2400.0, 40.0), (64, 3600.0, 60.0), (128, 5000.0, 120.0)),
    kv_tokens=400_000,
    max_num_seqs=256,
)


def metrics(t: int = 0, *, active: int = 2, starting: int = 0, waiting: int = 0, running: int = 0,
            kv: float = 0.0, gpu: float = 0.0, rate: float = 0.0, isl: float = 0.0, osl: float = 0.0,
            ttft: float | None = None, tpot: float | None = None) -> PoolMetrics:
    return PoolMetrics(t, active, starting, 0, waiting, running, kv, gpu, rate, rate * isl, rate * osl, isl, osl,
                       ttft, tpot)


def ctx(t: int = 0, *, desired: int | None = None, lo: int = 1, hi: int = 100, replica: ReplicaModel | None = None,
        **kw) -> ScalingContext:
    m = metrics(t, **kw)
    if desired is None:
        desired = m.replicas_active + m.replicas_starting
    return ScalingContext(t, "chat", m, desired, lo, hi, replica)


# --- registry and params --------------------------------------------------------------------

def test_every_autoscaler_names_its_source_and_has_defaults_that_validate():
    for name, spec in AUTOSCALERS.items():
        assert spec.name == name and spec.source and spec.summary
        params = spec.params_cls()
        assert dataclasses.is_dataclass(params) and params.__dataclass_params__.frozen
        assert params.decision_interval_s >= 0
        assert isinstance(spec.initial_state(params), GuardState)


def test_unknown_autoscaler_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"^unknown autoscaler 'magic'; known: fixed, gpu-util, hpa, kpa"):
        autoscaler_spec("magic")
    with pytest.raises(ConfigError, match=r"^config: pools\[0\]\.autoscaler\.policy: unknown autoscaler 'x'"):
        autoscaler_spec("x", key="pools[0].autoscaler.policy")


@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (kpa.KpaParams, {"stable_window_s": 0}, "stable_window_s: got 0, expected a number > 0"),
    (hpa.HpaParams, {"metric": "cpu"}, "metric: got 'cpu', expected one of 'waiting'"),
    (hpa.HpaParams, {"metric": "ongoing"}, "target: got None, expected a number > 0 when metric is 'ongoing'"),
    (wva.WvaParams, {"scale_down_boundary": 0.9}, "scale_down_boundary: got 0.9, expected a number below"),
    (sla_planner.SlaPlannerParams, {"role": "both"}, "role: got 'both', expected one of 'prefill'"),
    (ray_serve.RayServeParams, {"upscale_delay_s": -1}, "upscale_delay_s: got -1, expected a number >= 0"),
    (GuardParams, {"scrape_delay_s": "15s"}, "scrape_delay_s: got '15s', expected a number >= 0"),
])
def test_bad_params_name_the_field_the_value_and_what_was_expected(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


# --- fixed, gpu-util, queue-depth, kv-usage ---------------------------------------------------

def test_fixed_keeps_the_pool_or_the_configured_count():
    assert fixed.fixed(ctx(active=3), fixed.FixedParams(), fixed.FixedState()).replicas == 3
    assert fixed.fixed(ctx(active=3), fixed.FixedParams(replicas=7), fixed.FixedState()).replicas == 7


@pytest.mark.parametrize("active", [1, 2, 5, 10, 40])
@pytest.mark.parametrize("busy", [0.75, 0.85, 0.95, 1.0])
def test_gpu_util_never_scales_down_under_load(active, busy):
    # Any real load keeps a vLLM replica stepping, so GPU-Util sits near 1: the signal misleads.
    d = gpu_util.gpu_util(ctx(active=active, gpu=busy), gpu_util.GpuUtilParams(), RatioState())
    assert d.replicas >= active


def test_gpu_util_scales_up_by_the_hpa_formula_and_down_only_when_idle():
    assert gpu_util.gpu_util(ctx(active=4, gpu=1.0), gpu_util.GpuUtilParams(), RatioState()).replicas == 5
    assert gpu_util.gpu_util(ctx(active=4, gpu=0.0), gpu_util.GpuUtilParams(), RatioState()).replicas == 0


def test_queue_depth_is_ceil_of_n_times_queue_over_target_with_a_tolerance_band():
    p = queue_depth.QueueDepthParams()
    assert queue_depth.queue_depth(ctx(active=4, waiting=40), p, RatioState()).replicas == 8  # 10/5 * 4
    assert queue_depth.queue_depth(ctx(active=4, waiting=21), p, RatioState()).replicas == 4  # 1.05: in band
    assert queue_depth.queue_depth(ctx(active=4, waiting=23), p, RatioState()).replicas == 5  # 1.15 * 4 = 4.6


def test_kv_usage_is_ceil_of_n_times_usage_over_target():
    d = kv_usage.kv_usage(ctx(active=3, kv=0.91), kv_usage.KvUsageParams(), RatioState())
    assert d.replicas == 4 and d.signals == {"metric": "kv_usage", "value": 0.91, "target": 0.7}


# --- hpa ----------------------------------------------------------------------------------------

def test_hpa_tolerance_band_keeps_the_count():
    p = hpa.HpaParams(metric="kv_usage", target=0.5)
    assert hpa.hpa(ctx(active=10, kv=0.545), p, hpa.HpaState()).replicas == 10  # ratio 1.09
    assert hpa.hpa(ctx(active=10, kv=0.555), p, hpa.HpaState()).replicas == 12  # ratio 1.11
    assert hpa.hpa(ctx(active=10, kv=0.455), p, hpa.HpaState()).replicas == 10  # ratio 0.91


def test_hpa_scale_down_takes_the_max_recommendation_over_300_s():
    p = hpa.HpaParams()  # 5 waiting per replica
    state = hpa.hpa(ctx(0, active=4, waiting=80), p, hpa.HpaState()).state  # recommends 16
    for t in (15, 150, 299):
        d = hpa.hpa(ctx(t * S, active=8, waiting=0), p, state)
        assert d.replicas == 16 and d.signals["recommendation"] == 0
        state = d.state
    assert hpa.hpa(ctx(301 * S, active=8, waiting=0), p, state).replicas == 1


def test_hpa_scale_up_is_limited_to_twice_the_current_count_or_four():
    p = hpa.HpaParams()
    assert hpa.hpa(ctx(active=1, waiting=100), p, hpa.HpaState()).replicas == 4
    assert hpa.hpa(ctx(active=5, waiting=500), p, hpa.HpaState()).replicas == 10


def test_hpa_counts_starting_replicas_as_idle_on_a_scale_up():
    p = hpa.HpaParams()
    # 2 ready at 7.5 waiting each (1.5x); with 2 more starting the ratio is 0.75: no scale-up.
    assert hpa.hpa(ctx(active=2, starting=2, waiting=15), p, hpa.HpaState()).replicas == 4
    # 2 ready at 15 each (3x): over 4 replicas 1.5x, so ceil(1.5 * 4) = 6.
    assert hpa.hpa(ctx(active=2, starting=2, waiting=30), p, hpa.HpaState()).replicas == 6


# --- kpa ----------------------------------------------------------------------------------------

KPA = kpa.KpaParams(container_concurrency=10, target_utilization=1.0)  # target 10 per replica


def test_kpa_target_is_seventy_percent_of_max_num_seqs_or_of_the_default():
    assert kpa.kpa_target(ctx(replica=REPLICA), kpa.KpaParams()) == pytest.approx(0.7 * 256)
    assert kpa.kpa_target(ctx(), kpa.KpaParams()) == pytest.approx(70.0)


def test_kpa_enters_panic_at_twice_the_ready_count_and_never_scales_down_in_it():
    state = kpa.KpaState(started=True)
    for t in range(0, 60, 2):  # a minute at 10 per replica on 2 replicas: stable
        d = kpa.kpa(ctx(t * S, active=2, running=20), KPA, state)
        assert d.replicas == 2 and not d.signals["panic"]
        state = d.state
    d = kpa.kpa(ctx(60 * S, active=2, running=20, waiting=300), KPA, state)  # burst: 6 s window hot
    assert d.signals["panic"] and d.signals["desired_panic"] >= 4 and d.replicas == d.signals["desired_panic"]
    peak, state = d.replicas, d.state
    for t in range(62, 120, 2):  # the burst is gone, but panic holds for the stable window
        d = kpa.kpa(ctx(t * S, active=peak, running=10), KPA, state)
        assert d.signals["panic"] and d.replicas == peak
        state = d.state
    d = kpa.kpa(ctx(122 * S, active=peak, running=10), KPA, state)
    assert not d.signals["panic"] and d.replicas < peak


def test_kpa_scale_down_rate_halves_at_most_and_scale_to_zero_is_off():
    state = kpa.KpaState(started=True)
    assert kpa.kpa(ctx(0, active=10, running=0), KPA, state).replicas == 5
    assert kpa.kpa(ctx(0, active=1, running=0), KPA, state).replicas == 1
    on = dataclasses.replace(KPA, enable_scale_to_zero=True)
    assert kpa.kpa(ctx(0, active=1, running=0), on, state).replicas == 0


def test_kpa_starts_in_panic_at_the_ready_count():
    d = kpa.kpa(ctx(0, active=6, running=0), KPA, kpa.KpaState())
    assert d.signals["panic"] and d.replicas == 6


# --- ray-serve ----------------------------------------------------------------------------------

def test_ray_serve_desired_count_and_smoothing():
    p = ray_serve.RayServeParams()
    assert ray_serve.desired_num_replicas(20, 2, p) == 10  # 20 ongoing / (2 per replica)
    assert ray_serve.desired_num_replicas(20, 2, dataclasses.replace(p, upscaling_factor=0.5)) == 6
    # A downscaling factor that would leave it stuck still removes one replica.
    assert ray_serve.desired_num_replicas(6, 4, dataclasses.replace(p, downscaling_factor=0.1)) == 3


def test_ray_serve_waits_30_s_of_consecutive_upscale_decisions():
    p, state = ray_serve.RayServeParams(), ray_serve.RayServeState()
    for t in range(0, 30):
        d = ray_serve.ray_serve(ctx(t * S, active=2, running=20), p, state)
        assert d.replicas == 2
        state = d.state
    d = ray_serve.ray_serve(ctx(30 * S, active=2, running=20), p, state)
    assert d.replicas == 10 and d.state.decision_counter == 0


def test_ray_serve_streak_resets_when_a_decision_goes_the_other_way():
    p, state = ray_serve.RayServeParams(look_back_period_s=1), ray_serve.RayServeState()
    for t in range(0, 20):
        state = ray_serve.ray_serve(ctx(t * S, active=2, running=20), p, state).state
    state = ray_serve.ray_serve(ctx(20 * S, active=2, running=4), p, state).state  # on target: reset
    for t in range(21, 50):
        d = ray_serve.ray_serve(ctx(t * S, active=2, running=20), p, state)
        assert d.replicas == 2
        state = d.state
    assert ray_serve.ray_serve(ctx(51 * S, active=2, running=20), p, state).replicas == 10


def test_ray_serve_downscale_waits_600_s_and_cold_start_skips_the_delay():
    p, state = ray_serve.RayServeParams(), ray_serve.RayServeState()
    for t in range(0, 600, 10):
        d = ray_serve.ray_serve(ctx(t * S, active=4, running=0), p, state)
        assert d.replicas == 4
        state = d.state
    assert ray_serve.ray_serve(ctx(600 * S, active=4, running=0), p, state).replicas == 1
    d = ray_serve.ray_serve(ctx(0, active=0, desired=0, lo=0, rate=1.0), p, ray_serve.RayServeState())
    assert d.replicas == 1 and d.signals["cold_start"]


# --- wva ----------------------------------------------------------------------------------------

def test_wva_scales_up_on_kv_token_demand_over_capacity():
    # capacity 0.8 * 400k = 320k per replica; demand 0.95 * 400k * 2 = 760k; 760k / 0.85 = 894k > 640k.
    d = wva.wva(ctx(active=2, kv=0.95, replica=REPLICA), wva.WvaParams(), wva.WvaState())
    assert d.replicas == 3 and d.signals["required_capacity"] == pytest.approx(760_000 / 0.85 - 640_000)


def test_wva_counts_starting_replicas_as_capacity():
    d = wva.wva(ctx(active=2, starting=1, kv=0.95, replica=REPLICA), wva.WvaParams(), wva.WvaState())
    assert d.replicas == 3 and d.signals["required_capacity"] == 0  # 894k < 3 * 320k


def test_wva_prices_the_queue_and_scales_down_below_the_boundary():
    queued = wva.wva(ctx(active=2, kv=0.5, waiting=200, isl=2000, replica=REPLICA), wva.WvaParams(), wva.WvaState())
    assert queued.replicas == 3  # 400k in use + 400k queued
    idle = wva.wva(ctx(active=4, kv=0.1, replica=REPLICA), wva.WvaParams(), wva.WvaState())
    assert idle.replicas == 1  # spare 1280k - 160k / 0.7 = 1051k: remove 3
    assert wva.wva(ctx(active=1, kv=0.0, replica=REPLICA), wva.WvaParams(), wva.WvaState()).replicas == 1


def test_wva_reads_the_peak_of_the_last_minute():
    state = wva.wva(ctx(0, active=2, kv=0.95, replica=REPLICA), wva.WvaParams(), wva.WvaState()).state
    assert wva.wva(ctx(59 * S, active=2, kv=0.5, replica=REPLICA), wva.WvaParams(), state).replicas == 3
    assert wva.wva(ctx(61 * S, active=2, kv=0.5, replica=REPLICA), wva.WvaParams(), state).replicas == 2


# --- sla-planner --------------------------------------------------------------------------------

def plan(role: str, *, predictor: str = "constant", state=None, t: int = 0, **kw):
    p = sla_planner.SlaPlannerParams(role=role, load_predictor=predictor)
    c = dataclasses.replace(ctx(t, replica=REPLICA, **kw), slo_tpot_ms=50.0)
    return sla_planner.sla_planner(c, p, state or sla_planner.SlaPlannerState())


def test_sla_planner_sizes_prefill_from_rate_times_isl():
    d = plan("prefill", rate=10.0, isl=2000, osl=300)
    assert d.replicas == 3 and d.signals["prefill_replicas"] == pytest.approx(2.5)  # 20k tok/s / 8k


def test_sla_planner_sizes_decode_from_the_best_throughput_meeting_the_itl():
    d = plan("decode", rate=20.0, isl=2000, osl=300)
    # ITL 50 ms allows batch 32 (40 ms), not 64 (60 ms): 6000 tok/s / 2400 = 2.5.
    assert d.signals["decode_tokens_per_s"] == 2400.0 and d.replicas == 3
    # A batch must also fit the KV: at 20k-token contexts only batch 8 (160k tokens) fits 400k.
    assert plan("decode", rate=1.0, isl=20_000, osl=300).signals["decode_tokens_per_s"] == 800.0


def test_sla_planner_aggregated_needs_both_shares_and_no_traffic_needs_min_endpoint():
    assert plan("aggregated", rate=20.0, isl=2000, osl=300).replicas == 8  # 5 + 2.5
    assert plan("aggregated").replicas == 1


def test_sla_planner_moving_average_predicts_the_mean_of_past_intervals():
    state = plan("prefill", predictor="moving-average", rate=10.0, isl=2000).state
    d = plan("prefill", predictor="moving-average", state=state, t=180 * S, rate=30.0, isl=2000)
    assert d.signals["value"] == pytest.approx(20.0) and d.replicas == 5  # 40k tok/s / 8k
    c = plan("prefill", state=state, t=180 * S, rate=30.0, isl=2000)
    assert c.signals["value"] == pytest.approx(30.0) and c.replicas == 8


def test_sla_planner_holds_without_a_replica_model():
    p = sla_planner.SlaPlannerParams()
    d = sla_planner.sla_planner(ctx(active=3, rate=50.0, isl=1000), p, sla_planner.SlaPlannerState())
    assert d.replicas == 3 and not d.signals["sized"]


# --- guard --------------------------------------------------------------------------------------

def test_guard_clamps_to_the_pool_bounds():
    p = fixed.FixedParams(replicas=50)
    d = guard_step(fixed.fixed, None, ctx(desired=3, lo=2, hi=8), p, GuardParams(), GuardState(fixed.FixedState()))
    assert d.replicas == 8 and d.signals["policy_replicas"] == 50


def test_guard_holds_between_decisions_and_applies_cooldowns():
    spec, guard = AUTOSCALERS["queue-depth"], GuardParams(scale_up_cooldown_s=60, scale_down_cooldown_s=120)
    p, state = spec.params_cls(), spec.initial_state(spec.params_cls())
    d = spec.step(ctx(0, active=2, waiting=40), p, guard, state)  # up to 8
    assert d.replicas == 8
    held = spec.step(ctx(10 * S, active=2, waiting=0, desired=8), p, guard, d.state)
    assert held.replicas == 8 and held.signals["held"]  # 15 s sync period
    blocked = spec.step(ctx(30 * S, active=8, waiting=400, desired=8), p, guard, d.state)
    assert blocked.replicas == 8 and blocked.signals["blocked"] == "scale_up_cooldown"
    down = spec.step(ctx(90 * S, active=8, waiting=0, desired=8), p, guard, blocked.state)
    assert down.replicas == 8 and down.signals["blocked"] == "scale_down_cooldown"
    assert spec.step(ctx(120 * S, active=8, waiting=0, desired=8), p, guard, down.state).replicas == 1


def test_guarded_step_takes_the_policy_state_first_and_observes_between_decisions():
    spec = AUTOSCALERS["kpa"]
    p = spec.params_cls()
    step = guarded(spec.fn, GuardParams(decision_interval_s=10), spec.observe)
    d = step(ctx(0, active=2, running=20), p, spec.state_factory(p))
    assert isinstance(d.state, GuardState)
    held = step(ctx(5 * S, active=2, running=500), p, d.state)  # the guard's 10 s beats KPA's 2 s tick
    assert held.signals["held"] and held.replicas == d.replicas
    assert [v for _, v in held.state.inner.samples] == [20.0, 500.0]
