"""One name in one place: every policy's name, its numba dispatch id and its upstream source.

Routers, queue orders, preemption victims and admission policies are one module each under
policies/<family>/ (kernel, plain-Python twin, parameters, source); the `*_MODULES` lines below
list them, and a policy's integer id is its module's position on its line, written nowhere
else. The engines build their dispatch from these lines (policies/_dispatch.py) and stop with
an error for an id that has none; tests/differential/test_policies.py runs every registered
policy through both engines. Autoscalers are plain Python, called once per control tick
through `AutoscalerSpec.step`.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from common.configtools import suggest
from common.errors import ConfigError
from policies.api import Decision, ScalingContext
from policies.autoscalers import fixed, gpu_util, hpa, kpa, kv_usage, queue_depth, ray_serve, sla_planner, wva
from policies.autoscalers._ratio import ratio_state
from policies.autoscalers.guard import GuardParams, GuardState, guard_step
from policies.plugins import ENTRY_POINT_GROUP, check_signature, plugin_rows, user_object
from policies.user_config import UserChoice, is_user_name, user_policy


def _modules(family: str, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(importlib.import_module(f"policies.{family}.{name}") for name in names)


@dataclass(frozen=True)
class PolicySpec:
    family: str
    name: str
    numba_id: int
    summary: str
    source: str
    # Keys of the policy's config section and their defaults (pool splits: keys of `split:`).
    params: dict[str, Any] | None = None


# Routers: one module per kernel (policies/routers/); a kernel's numba id is its position
# here, so adding a router is its file plus its name on this line.
ROUTER_MODULES = _modules("routers", ("least_outstanding", "round_robin", "uniform_random", "power_of_two", "weighted", "user"))


@dataclass(frozen=True)
class RouterSpec:
    """A router's name, the kernel module it runs and the parameters it runs with (a preset of
    a parameterised kernel is a spec with its own defaults)."""

    name: str
    module: Any
    defaults: Any  # the module's Params instance, or None
    summary: str
    source: str
    family: str = "router"

    @property
    def numba_id(self) -> int:
        return ROUTER_MODULES.index(self.module)

    @property
    def params(self) -> dict[str, Any] | None:
        return None if self.defaults is None else dataclasses.asdict(self.defaults)

    @property
    def reads_view(self) -> bool:
        return self.module.READS_VIEW


ROUTERS: dict[str, RouterSpec] = {
    name: RouterSpec(name, module, defaults, summary, source)
    for module in ROUTER_MODULES
    for name, defaults, summary, source in module.SPECS
}
# Width of the engines' per-pool row of router parameters.
ROUTER_PARAMS_WIDTH = max([len(s.defaults.row()) for s in ROUTERS.values() if s.defaults is not None] + [1])


def router_params(value: Any) -> tuple[RouterSpec, Any]:
    """A pool's `router:` (a name, or a mapping of `policy` and the policy's parameters) as its
    spec and parameters (a user's router: its UserChoice). ValueError names the key, for the
    config loader to prefix with the path."""
    if isinstance(value, str):
        user = _user_router(value, {})
        return user if user is not None else (router_spec(value), router_spec(value).defaults)
    if not isinstance(value, dict) or "policy" not in value:
        raise ValueError(f"router: got {value!r}, expected a router name or a mapping with 'policy'")
    rest = {k: v for k, v in value.items() if k != "policy"}
    user = _user_router(value["policy"], rest)
    if user is not None:
        return user
    spec = router_spec(value["policy"])
    cls = type(spec.defaults) if spec.defaults is not None else None
    known = [f.name for f in dataclasses.fields(cls)] if cls is not None else []
    for key in rest:
        if key not in known:
            raise ValueError(f"router: unknown key {key!r}{suggest(key, known)} for router {spec.name!r}; "
                             f"known: {', '.join(['policy', *known])}")
    if cls is None or not rest:
        return spec, spec.defaults
    try:
        return spec, dataclasses.replace(spec.defaults, **rest)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"router.{exc}") from None


def _user_router(name: Any, params: dict[str, Any]) -> tuple[RouterSpec, UserChoice] | None:
    if not isinstance(name, str) or (name in ROUTERS and not is_user_name(name)):
        return None
    try:
        choice = user_policy(name, "router", params)
    except ValueError as exc:
        raise ValueError(f"router: {exc}") from None
    if choice is None:
        return None
    return RouterSpec(name, ROUTER_MODULES[-1], None, choice.policy.summary, f"user policy {name}"), choice


def router_columns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Pools' `router:` values as the engines' columns: kernel ids (int64[P]) and parameter rows
    (float64[P, ROUTER_PARAMS_WIDTH], zero-padded)."""
    ids = np.zeros(len(values), np.int64)
    rows = np.zeros((len(values), ROUTER_PARAMS_WIDTH), np.float64)
    for i, value in enumerate(values):
        spec, params = router_params(value)
        ids[i] = spec.numba_id
        if params is not None:
            row = params.row()
            rows[i, :len(row)] = row
    return ids, rows


def router_spec(name: Any) -> RouterSpec:
    try:
        return ROUTERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"router: unknown router {name!r}{suggest(name, ROUTERS)}; known: "
                         f"{', '.join(sorted(ROUTERS))}") from None


@dataclass(frozen=True)
class KernelSpec:
    """A per-step policy with no parameters: its name, the module with its numba kernel and
    reference twin, and its family's modules in id order (its id is its position there)."""

    family: str
    name: str
    module: Any
    summary: str
    source: str
    modules: tuple[Any, ...] = dataclasses.field(repr=False, default=())
    params: dict[str, Any] | None = None

    @property
    def numba_id(self) -> int:
        return self.modules.index(self.module)


def _kernel_specs(family: str, modules: tuple[Any, ...]) -> dict[str, KernelSpec]:
    return {name: KernelSpec(family, name, m, summary, source, modules)
            for m in modules for name, summary, source in m.SPECS}


# Queue orders, one module each (policies/queue_orders/); the id is the position here.
QUEUE_MODULES = _modules("queue_orders", ("fcfs", "priority", "shortest_prompt", "edf", "longest_prefix", "user"))
QUEUE_ORDERS: dict[str, KernelSpec] = _kernel_specs("queue order", QUEUE_MODULES)
# Preemption victims, one module each (policies/victims/); the id is the position here.
VICTIM_MODULES = _modules("victims", ("vllm_fcfs", "vllm_priority", "least_progress", "most_kv", "user"))
VICTIMS: dict[str, KernelSpec] = _kernel_specs("preemption victim", VICTIM_MODULES)


@dataclass(frozen=True)
class AdmissionSpec:
    name: str
    module: Any
    summary: str
    source: str
    family: str = "admission"

    @property
    def numba_id(self) -> int:
        return ADMISSION_MODULES.index(self.module)

    @property
    def params_cls(self) -> type:
        return self.module.Params

    @property
    def is_user(self) -> bool:
        return self.module is ADMISSION_MODULES[-1]


# Admission policies, one module each (policies/admission/); the id is the position here.
ADMISSION_MODULES = _modules("admission", ("always", "queue_limit", "token_bucket", "priority_shed", "slo_aware", "user"))
ADMISSIONS: dict[str, AdmissionSpec] = {
    name: AdmissionSpec(name, m, summary, source) for m in ADMISSION_MODULES for name, summary, source in m.SPECS
}


def admission_spec(name: str, key: str | None = None) -> AdmissionSpec:
    """The admission policy `name`: a built-in, or a user's (the `user` link, whose parameters
    are its UserChoice: `user_policy_or_none(name, "admission", params)`)."""
    where = f"{key}: " if key else ""
    try:
        return ADMISSIONS[name]
    except KeyError:
        try:
            user = user_policy_or_none(name, "admission")
        except ValueError as exc:
            raise ConfigError(f"{where}{exc}") from None
        if user is not None:
            return AdmissionSpec(name, ADMISSION_MODULES[-1], user.policy.summary, f"user policy {name}")
        raise ConfigError(f"{where}unknown admission policy {name!r}{suggest(name, ADMISSIONS)}; known: "
                          f"{', '.join(sorted(ADMISSIONS))}") from None


# Each family's line ends with its `user` link (a user's policy, called by address): the engines
# and the config read "the last id" as it, so a new built-in goes before it.
for _line in (ROUTER_MODULES, QUEUE_MODULES, VICTIM_MODULES, ADMISSION_MODULES):
    if _line[-1].__name__.rpartition(".")[2] != "user":
        raise RuntimeError(f"policies/registry.py: {_line[-1].__name__} is after its family's 'user' link; "
                           "put a new built-in policy before 'user'")

_FAMILY_MODULES = {"queue order": QUEUE_MODULES, "preemption victim": VICTIM_MODULES, "admission": ADMISSION_MODULES,
                   "router": ROUTER_MODULES}

SPLITS: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec("pool split", "by-workload", 0,
                   "the pool that lists the request's workload label, else the pool with no list",
                   "workload pools of the reference lesson's fix (chat, documents, batch)"),
        PolicySpec("pool split", "by-prompt-length", 1,
                   "pools in order by prompt-length thresholds (split.prompt_thresholds)",
                   "length-based routing to short- and long-context pools (e.g. llm-d / AIBrix)",
                   {"prompt_thresholds": ()}),
        PolicySpec("pool split", "prefill-decode", 2,
                   "prefill pool, KV transfer over a link (nvlink4, pcie5x16, ib-ndr, eth-25g), decode pool "
                   "that takes a request once it has free blocks; local prefill below a threshold",
                   "vLLM NixlConnector (delayed block free, WAITING_FOR_REMOTE_KVS), Dynamo disaggregated "
                   "serving (max_local_prefill_length), llm-d P/D threshold, DistServe / Splitwise",
                   {"prefill_pool": None, "decode_pool": None, "link": "ib-ndr", "link_bytes_per_s": None,
                    "base_latency_ms": 1.0, "transfer": "layerwise", "local_prefill_threshold": 0}),
    )
}


def _lookup(table: dict[str, Any], what: str, name: str) -> int:
    try:
        return table[name].numba_id
    except KeyError:
        try:
            user = user_policy_or_none(name, what)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if user is not None:
            return len(_FAMILY_MODULES[what]) - 1  # the family's `user` link, last on its line
        raise ConfigError(f"unknown {what} {name!r}{suggest(name, table)}; known: {', '.join(sorted(table))}") from None


def user_policy_or_none(name: str, family: str, params: dict[str, Any] | None = None) -> UserChoice | None:
    """A user's policy of `family` that `name` names (with `params`), None for a built-in name
    or a name that is neither; ValueError says what is wrong with a user's policy."""
    table = {"queue order": QUEUE_ORDERS, "preemption victim": VICTIMS, "admission": ADMISSIONS,
             "router": ROUTERS}[family]
    if name in table and not is_user_name(name):
        return None
    return user_policy(name, family, params)


def queue_order_id(name: str) -> int:
    return _lookup(QUEUE_ORDERS, "queue order", name)


def victim_id(name: str) -> int:
    return _lookup(VICTIMS, "preemption victim", name)


def admission_id(name: str) -> int:
    return _lookup(ADMISSIONS, "admission", name)


def router_id(name: str) -> int:
    try:
        return router_spec(name).numba_id
    except ValueError as exc:
        raise ConfigError(str(exc).removeprefix("router: ")) from None


@dataclass(frozen=True)
class AutoscalerSpec:
    """One autoscaler: its params dataclass, initial state, pure policy and upstream source.

    `fn(ctx, params, state) -> Decision` decides; `observe(ctx, params, state) -> state` (when
    set) records the samples a windowed policy needs on the ticks between its decisions. The
    cluster drives it through `initial_state` and `step`, which apply the shared guard.
    """

    name: str
    params_cls: type
    state_factory: Callable[[Any], Any]
    fn: Callable[..., Decision]
    source: str
    summary: str
    observe: Callable[..., Any] | None = None
    raw_params: bool = False  # a user's policy gets the config's params as a plain dict

    def initial_state(self, params: Any) -> GuardState:
        return GuardState(self.state_factory(params))

    def step(self, ctx: ScalingContext, params: Any, guard: GuardParams, state: GuardState) -> Decision[GuardState]:
        return guard_step(self.fn, self.observe, ctx, params, guard, state)


AUTOSCALERS: dict[str, AutoscalerSpec] = {
    spec.name: spec
    for spec in (
        AutoscalerSpec(
            "fixed", fixed.FixedParams, fixed.fixed_state, fixed.fixed,
            "static Deployment replicas (no upstream controller)",
            "keeps the configured count, or the count the pool already has",
        ),
        AutoscalerSpec(
            "gpu-util", gpu_util.GpuUtilParams, ratio_state, gpu_util.gpu_util,
            "kubernetes pkg/controller/podautoscaler/replica_calculator.go on DCGM_FI_DEV_GPU_UTIL; "
            "GKE best practices for autoscaling LLM inference on GPUs",
            "HPA formula on GPU-Util, target 0.8: reads ~1.0 under any load, so it only scales up (misleading)",
        ),
        AutoscalerSpec(
            "queue-depth", queue_depth.QueueDepthParams, ratio_state, queue_depth.queue_depth,
            "kubernetes replica_calculator.go on vllm:num_requests_waiting; llm-d queueDepthThreshold 5",
            "ceil(N * waiting per replica / 5), 10% tolerance",
        ),
        AutoscalerSpec(
            "kv-usage", kv_usage.KvUsageParams, ratio_state, kv_usage.kv_usage,
            "kubernetes replica_calculator.go on vllm:kv_cache_usage_perc",
            "ceil(N * KV use / 0.7), 10% tolerance",
        ),
        AutoscalerSpec(
            "hpa", hpa.HpaParams, hpa.hpa_state, hpa.hpa,
            "kubernetes pkg/controller/podautoscaler/horizontal.go + replica_calculator.go",
            "Kubernetes HPA: ceil(N * current / target), 10% tolerance, max over a 300 s scale-down "
            "window, 15 s sync; metric waiting | ongoing | kv_usage | gpu_busy",
        ),
        AutoscalerSpec(
            "kpa", kpa.KpaParams, kpa.kpa_state, kpa.kpa,
            "knative/serving pkg/autoscaler/scaling/autoscaler.go",
            "Knative KPA on concurrency: 60 s stable / 6 s panic windows, panic at 200%, no scale-down "
            "in panic, rates 1000 up / 2 down, 2 s tick",
            kpa.kpa_observe,
        ),
        AutoscalerSpec(
            "ray-serve", ray_serve.RayServeParams, ray_serve.ray_serve_state, ray_serve.ray_serve,
            "ray python/ray/serve/autoscaling_policy.py (replica_queue_length_autoscaling_policy)",
            "Ray Serve: 2 ongoing requests per replica over a 30 s look-back, act after 30 s up / 600 s "
            "down of consecutive decisions",
            ray_serve.ray_serve_observe,
        ),
        AutoscalerSpec(
            "wva", wva.WvaParams, wva.wva_state, wva.wva,
            "llm-d workload-variant-autoscaler internal/engines/analyzers/saturation_v2/analyzer.go",
            "llm-d saturation: KV-token demand vs capacity (KV threshold 0.8), scale up above 0.85, "
            "down below 0.70, starting replicas count as capacity, 60 s",
            wva.wva_observe,
        ),
        AutoscalerSpec(
            "sla-planner", sla_planner.SlaPlannerParams, sla_planner.sla_planner_state, sla_planner.sla_planner,
            "ai-dynamo/dynamo components/planner/src/dynamo/planner/utils/planner_core.py",
            "Dynamo SLA planner: predicted rate x ISL/OSL over per-replica prefill and decode "
            "throughput at the TTFT/TPOT targets, every 180 s; role prefill | decode | aggregated",
            sla_planner.sla_planner_observe,
        ),
    )
}


def split_function(name: str, key: str | None = None, source: str = "config") -> Callable[..., Any]:
    """A user's pool split: `fn(trace: polars.DataFrame, pools: list[str])` returning each
    request's pool, by index or by name (`replay.fleet.split.split_requests` checks the result).
    Only a --plugin module's function or an installed entry point (policies/plugins.py)."""
    where = f"{source}: {key}: " if key else ""
    obj = user_object(name, "pool split", where)
    if obj is None:
        raise ConfigError(f"{where}unknown pool split {name!r}{suggest(name, SPLITS)}; known: "
                          f"{', '.join(sorted(SPLITS))}, or 'module:function' of a --plugin module, or a plugin's "
                          f"{ENTRY_POINT_GROUP} entry point")
    check_signature(obj, name, "pool split", where)
    return obj


def autoscaler_spec(name: str, key: str | None = None, source: str = "config") -> AutoscalerSpec:
    """The spec named `name`: a built-in, a `"module:function"` of a --plugin module, or an
    installed plugin's entry point in the `llm_replay.policies` group. `key` (a config key path)
    and `source` (the config file) prefix errors."""
    where = f"{source}: {key}: " if key else ""
    if name in AUTOSCALERS:
        return AUTOSCALERS[name]
    obj = user_object(name, "autoscaler", where)
    if obj is not None:
        return _user_spec(name, obj, where)
    raise ConfigError(f"{where}unknown autoscaler {name!r}{suggest(name, AUTOSCALERS)}; known: "
                      f"{', '.join(sorted(AUTOSCALERS))}, or 'module:function' of a --plugin module, or a plugin's "
                      f"{ENTRY_POINT_GROUP} entry point")


class UserParams(dict):
    """A user's policy parameters: the config's mapping, plus the decision interval the shared
    guard reads (`decision_interval_s` in the params, else every tick)."""

    @property
    def decision_interval_s(self) -> float:
        return float(self.get("decision_interval_s", 0.0))


def _user_spec(name: str, obj: Any, where: str) -> AutoscalerSpec:
    """A user's autoscaler: an AutoscalerSpec, or a function `fn(ctx, params: dict, state) ->
    Decision` whose state starts as None."""
    if isinstance(obj, AutoscalerSpec):
        return obj
    check_signature(obj, name, "autoscaler", where)
    doc = (obj.__doc__ or "a user's autoscaler").strip().splitlines()[0]
    return AutoscalerSpec(name, UserParams, lambda params: None, obj, f"user policy {name}", doc, raw_params=True)


def policy_rows() -> list[dict[str, Any]]:
    """Every registered policy, for `llm-replay policies`: family, name, parameters with their
    defaults, what it does and the upstream source it reproduces."""
    import dataclasses

    from policies.autoscalers.guard import GuardParams

    def params(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    rows = [
        {"family": s.family, "name": s.name, "params": dict(s.params or {}), "summary": s.summary,
         "source": s.source}
        for table in (ROUTERS, QUEUE_ORDERS, VICTIMS, SPLITS)
        for s in table.values()
    ]
    rows += [
        {"family": "admission", "name": s.name, "params": params(s.params_cls), "summary": s.summary,
         "source": s.source}
        for s in ADMISSIONS.values()
    ]
    rows += [
        {"family": "autoscaler", "name": s.name, "params": params(s.params_cls), "summary": s.summary,
         "source": s.source}
        for s in AUTOSCALERS.values()
    ]
    rows.append({"family": "autoscaler guard", "name": "guard", "params": params(GuardParams),
                 "summary": "bounds, cooldowns, decision interval and scrape delay shared by every autoscaler",
                 "source": "Ray Serve autoscaling_policy.py: bounds and delays live in one wrapper"})
    return rows + plugin_rows()
