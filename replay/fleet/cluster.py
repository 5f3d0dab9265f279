"""The cluster loop: plan the pools, split the trace over them, step the engine tick by tick.

Between ticks everything (arrivals, routing, every replica's steps) runs inside the engine; at
each tick (default 1 s of simulated time) Python reads a snapshot and appends one row per pool.
Autoscalers (issue 3) plug in here: they read the same snapshot and change replica counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from common.configtools import from_dict
from common.errors import ConfigError, UserError
from policies.api import ReplicaModel
from policies.registry import (
    admission_spec, queue_order_id, router_columns, router_params, user_policy_or_none, victim_id,
)
from policies.user_config import UserChoice, UserTable
from replay.calibration.profiles import default_source, step_coefficients
from replay.config import FleetConfig, PoolConfig
from replay.fleet.control import ControlEvents, FleetControl, PoolControl, make_decider
from replay.fleet.ticks import check_tick_count
from replay.fleet.tickloop import TickLoop
from replay.engine.common import SPEC_CREDIT_SCALE, Engine, EngineInputs
from replay.engine.window import one_or_each
from replay.model.memory import Capacity, kv_capacity
from replay.model.serving import ServingTerms, engine_arrivals, serving_terms, with_host_terms
from replay.fleet.request_rows import stream_rows
from replay.fleet.sessions import closed_loop_inputs, with_sent_times
from replay.fleet.split import prefix_hash_columns, split_requests
from replay.model.serving import defaults as serving_defaults  # a plan made without its pool's terms
from replay.model.specs import GpuSpec, ModelSpec, get_gpu, get_model
from replay.model.stepmodel import (KV_BYTES_PER_TOKEN, KV_BYTES_RATE, cudagraph_capture_limit, step_params,
                                    step_time_us_nb, table_points, with_table)
from replay.model.stepterms import PoolTerms, effective_weight_dtype, pool_terms, step_shape

ENGINES = ("numba", "numba-eager", "reference")  # numba-eager: every request at every step (benchmarks)


@dataclass(frozen=True)
class PoolPlan:
    """A pool with everything resolved: specs, KV capacity, step-model parameters, price, and its
    admission policy's parameters (validated)."""

    index: int
    config: PoolConfig
    model: ModelSpec
    gpu: GpuSpec
    capacity: Capacity
    max_model_len: int
    price_usd_per_gpu_hour: float
    step_params: np.ndarray
    admission: Any = None
    terms: PoolTerms = field(default_factory=PoolTerms)
    # the step model's coefficients as resolved (config keys, then profile, then defaults), and
    # where its step times come from: "roofline" or the table file
    step_model: dict[str, Any] = field(default_factory=dict)
    # the API server's way in and the tokens' way out (replay/model/serving.py)
    serving: ServingTerms = field(default_factory=serving_defaults)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def gpus_per_replica(self) -> int:
        return self.config.tensor_parallel_size


def plan_pools(cfg: FleetConfig, source: str = "config") -> list[PoolPlan]:
    """Resolve every pool; a model or GPU that is unknown or does not fit is a ConfigError naming
    `source` (the config file) and the key."""
    plans = []
    for i, pool in enumerate(cfg.pools):
        key = f"pools[{i}]"
        try:
            model = get_model(pool.model or cfg.model)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {f'{key}.model' if pool.model else 'model'}: {exc}") from None
        try:
            gpu = get_gpu(pool.gpu or cfg.gpu)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {f'{key}.gpu' if pool.gpu else 'gpu'}: {exc}") from None
        eng = pool.engine
        tp = pool.tensor_parallel_size
        weight_dtype = effective_weight_dtype(eng.quantization, pool.weight_dtype or cfg.weight_dtype,
                                              f"{source}: {key}")
        terms = pool_terms(model, gpu, tp, eng, pool.step_model, pool.preemption.host_link_bytes_per_s,
                           f"{source}: {key}")
        max_len = eng.max_model_len or model.max_model_len
        if max_len > model.max_model_len:
            # vLLM refuses this too (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set): outputs degrade.
            raise ConfigError(f"{source}: {key}.engine.max_model_len: got {max_len}, expected at most "
                              f"{model.max_model_len}, the context length of {model.id}")
        try:
            cap = kv_capacity(
                model,
                gpu,
                tp,
                gpu_memory_utilization=eng.gpu_memory_utilization,
                block_size=eng.block_size,
                kv_cache_dtype=eng.kv_cache_dtype,
                weight_dtype=weight_dtype,
                num_gpu_blocks_override=eng.num_gpu_blocks_override,
                max_num_batched_tokens=eng.max_num_batched_tokens,
                max_num_seqs=eng.max_num_seqs,
                max_model_len=max_len,
                extra_weights_bytes_per_gpu=terms.extra_weights_bytes_per_gpu,
                extra_kv_bytes_per_token_per_gpu=terms.extra_kv_bytes_per_token_per_gpu,
                gpu_memory_bytes=pool.gpu_memory_bytes,
            )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {key} ({pool.name}): {exc}") from None
        sm = pool.step_model
        coefficients = step_coefficients(sm, model.id, gpu.id, tp, f"{source}: {key}.step_model")
        drafts = (eng.speculative_config.num_speculative_tokens or 0) if eng.speculative_config is not None else 0
        graphs = cudagraph_capture_limit(eng.max_num_seqs, eng.max_num_batched_tokens, drafts,
                                         eng.max_cudagraph_capture_size, eng.enforce_eager)
        params = step_params(step_shape(model, gpu, cap), **coefficients, expert_parallel=terms.expert_parallel,
                             draft=terms.draft, lora_bytes_per_adapter=terms.lora_bytes_per_adapter,
                             lora_flops_per_token=terms.lora_flops_per_token, cuda_graph_max_tokens=graphs)
        if sm.backend == "table":
            params = table_params(params, pool, model.id, gpu.id, f"{source}: {key}")
        price = pool.price_usd_per_gpu_hour
        if price is None:
            price = cfg.price_usd_per_gpu_hour if cfg.price_usd_per_gpu_hour is not None else gpu.price_usd_per_gpu_hour
        spec = admission_spec(pool.admission.policy, f"{key}.admission.policy")
        if spec.is_user:  # checked when the config was read
            adm = user_policy_or_none(pool.admission.policy, "admission", pool.admission.params)
        else:
            adm = from_dict(spec.params_cls, pool.admission.params, f"{key}.admission.params", source=source)
        resolved = {**resolved_step_model(coefficients, sm, gpu.id), "cuda_graph_max_tokens": graphs,
                    "async_scheduling": eng.async_scheduling}
        serving = serving_terms(pool.serving)
        plans.append(PoolPlan(i, pool, model, gpu, cap, int(max_len), float(price),
                              with_host_terms(params, serving), adm, terms, resolved, serving))
    _check_fleet_blocks(plans, source)
    return plans


# The engines keep a few int64 arrays per KV block of every replica slot (replay/engine/numba_engine.py):
# about 100 bytes a block, so this is about 3 GB, past any fleet the reference lesson needs.
MAX_FLEET_KV_BLOCKS = 1 << 25


def _check_fleet_blocks(plans: list[PoolPlan], source: str) -> None:
    """Refuse, before any memory is asked for, a fleet whose KV blocks no machine could hold."""
    total = sum(p.capacity.kv_blocks * p.config.max_replicas for p in plans)
    if total > MAX_FLEET_KV_BLOCKS:
        biggest = max(plans, key=lambda p: p.capacity.kv_blocks * p.config.max_replicas)
        raise ConfigError(
            f"{source}: pools: {total:,} KV blocks in all (pools[{biggest.index}] ({biggest.name}): "
            f"{biggest.config.max_replicas:,} replica slots x {biggest.capacity.kv_blocks:,} blocks); the simulator "
            f"holds at most {MAX_FLEET_KV_BLOCKS:,} (about 3 GB); use fewer replicas, a larger engine.block_size, "
            "or engine.num_gpu_blocks_override")


def resolved_step_model(coefficients: dict[str, float | None], sm: Any, gpu_id: str) -> dict[str, Any]:
    """What a run's summary records of its pool's step model: every coefficient as used (None
    resolved to stepmodel's defaults; no knee as knee_tokens 0), where they come from (a profile,
    the GPU's shipped defaults, or the table file) and which keys the config set itself."""
    from replay.model import stepmodel

    defaults = {"mfu": stepmodel.DEFAULT_MFU, "mbu": stepmodel.DEFAULT_MBU,
                "per_step_overhead_us": stepmodel.DEFAULT_STEP_OVERHEAD_US,
                "per_seq_overhead_us": stepmodel.DEFAULT_SEQ_OVERHEAD_US,
                "prefill_overhead_us": stepmodel.DEFAULT_PREFILL_OVERHEAD_US,
                "allreduce_latency_us": stepmodel.DEFAULT_ALLREDUCE_LATENCY_US,
                "link_efficiency": stepmodel.DEFAULT_LINK_EFFICIENCY, "knee_tokens": 0}
    out: dict[str, Any] = {
        "backend": sm.backend,
        "source": sm.table if sm.backend == "table" else (sm.profile or default_source(gpu_id)),
        "set_in_config": [k for k in (*defaults, "past_knee_mfu", "attention_mbu", "expert_mbu") if getattr(sm, k, None) is not None],
    }
    for key, default in defaults.items():
        value = coefficients.get(key)
        out[key] = float(default if value is None else value)
    for key in ("attention_mbu", "expert_mbu"):  # unset: the weights' mbu
        value = coefficients.get(key)
        out[key] = out["mbu"] if value is None else float(value)
    if out["knee_tokens"]:
        out["past_knee_mfu"] = float(coefficients["past_knee_mfu"])
    return out


def table_params(params: np.ndarray, pool: PoolConfig, model_id: str, gpu_id: str, where: str) -> np.ndarray:
    """The pool's step parameters switched to the table backend, from its measured steps: prefill
    steps give step time against tokens, decode steps against sequences, each decode point moved
    to the median context per sequence at the roofline's KV-read rate."""
    from replay.calibration.data import read_generic, read_splitwise

    sm = pool.step_model
    tp = pool.tensor_parallel_size
    eng = pool.engine
    if eng.speculative_config is not None or eng.enable_lora:
        raise ConfigError(f"{where}.step_model.backend: the table backend has no speculative-decoding or LoRA "
                          "terms; use the roofline for this pool")
    try:
        m = read_generic(sm.table, tp, fitting=False) if sm.table_format == "generic" \
            else read_splitwise(sm.table, model_id, gpu_id, tp, fitting=False)
    except ConfigError:
        raise
    except UserError as exc:
        raise ConfigError(f"{where}.step_model.table: {exc}") from None
    prefill = (m.prefill_tokens > 0) & (m.decode_seqs == 0)
    decode = (m.prefill_tokens == 0) & (m.decode_seqs > 0)
    ctx_ref = float(np.median(m.decode_ctx[decode] / m.decode_seqs[decode])) if decode.any() else 0.0
    kv_us_per_token = params[KV_BYTES_PER_TOKEN] / params[KV_BYTES_RATE] * 1e6
    decode_us = m.step_us[decode] - kv_us_per_token * (m.decode_ctx[decode] - m.decode_seqs[decode] * ctx_ref)
    points = (table_points(m.prefill_tokens[prefill], m.step_us[prefill]),
              table_points(m.decode_seqs[decode], decode_us))
    for what, pts in zip(("prefill-only steps (decode_seqs 0)", "decode-only steps (prefill_tokens 0)"), points):
        if len(pts) < 2:
            raise ConfigError(f"{where}.step_model.table: {sm.table} has {len(pts)} distinct sizes of {what} at "
                              f"tensor_parallel_size {tp}; the table backend needs at least 2")
    return with_table(params, points[0], points[1], ctx_ref)


def pd_inputs(cfg: FleetConfig, plans: list[PoolPlan]) -> dict[str, Any]:
    """The engine's prefill/decode parameters for a prefill-decode split (none otherwise). The
    transfer moves the prompt's KV as the decode pool stores it (its KV dtype), over one link."""
    split = cfg.split
    if split.policy != "prefill-decode":
        return {}
    prefill, decode = split.pd_pools([p.name for p in cfg.pools])
    kv_bytes = plans[decode].capacity.kv_bytes_per_token
    return {
        "pd_prefill_pool": prefill,
        "pd_decode_pool": decode,
        "pd_local_threshold": split.local_prefill_threshold,
        "pd_us_per_token": kv_bytes / split.bytes_per_s * 1e6,
        "pd_base_us": round(split.base_latency_ms * 1000),
        "pd_layers": plans[prefill].model.num_layers if split.transfer == "layerwise" else 0,
    }


def build_inputs(
    frame: pl.DataFrame, trace_block_tokens: int | None, plans: list[PoolPlan], pool_index: np.ndarray,
    detailed_events: bool = False, seed: int = 0, ttft_budget_ms: float = 2000.0,
    pd: dict[str, Any] | None = None, source: str = "config", closed_loop: bool = False,
) -> EngineInputs:
    tenant_ids = frame["tenant"].rank("dense").to_numpy().astype(np.int64)  # (a day's: no other copy)
    tenant_ids -= 1
    hash_off, hash_len, flat = prefix_hash_columns(frame["prefix_hashes"])
    engines = [p.config.engine for p in plans]
    routers = router_columns([p.config.router for p in plans])
    # closed loop (replay/fleet/sessions.py): a session's turns are released by the replay
    sessions = closed_loop_inputs(frame, pool_index, [p.serving for p in plans], hash_off, hash_len, flat,
                                  source) if closed_loop else {}
    return EngineInputs(
        arrival_us=engine_arrivals(frame["arrival_us"].to_numpy(), frame["prompt_tokens"].to_numpy(), pool_index,
                                   [p.serving for p in plans]),
        # the trace's Int32 columns themselves (traces/schema.py): every reader widens them
        prompt_tokens=frame["prompt_tokens"].to_numpy(),
        output_tokens=frame["output_tokens"].to_numpy(),
        priority=one_or_each(frame["priority"].to_numpy()),
        pool=np.asarray(pool_index, np.int64),
        hash_off=sessions.pop("hash_off", one_or_each(hash_off)),
        hash_len=sessions.pop("hash_len", one_or_each(hash_len)),
        trace_hashes=flat,
        trace_block_tokens=int(trace_block_tokens or 1),
        pool_replicas=np.array([replica_slots(p.config) for p in plans], np.int64),
        pool_initial_replicas=np.array([p.config.replicas for p in plans], np.int64),
        pool_hold=np.array([int(holds_arrivals(p.config)) for p in plans], np.int64),
        # vLLM's block pool keeps block 0 as the null block: one fewer is usable.
        pool_kv_blocks=np.array([p.capacity.kv_blocks - 1 for p in plans], np.int64),
        pool_block_size=np.array([e.block_size for e in engines], np.int64),
        pool_max_num_seqs=np.array([e.max_num_seqs for e in engines], np.int64),
        pool_max_num_batched_tokens=np.array([e.max_num_batched_tokens for e in engines], np.int64),
        pool_long_prefill_token_threshold=np.array([e.long_prefill_token_threshold for e in engines], np.int64),
        pool_enable_prefix_caching=np.array([int(e.enable_prefix_caching) for e in engines], np.int64),
        pool_max_model_len=np.array([p.max_model_len for p in plans], np.int64),
        pool_router=routers[0],
        pool_router_params=routers[1],
        pool_step_params=np.stack([p.step_params for p in plans]),
        detailed_events=detailed_events,
        pool_refresh_us=np.array([max(1, round(p.config.router_refresh_ms * 1000)) for p in plans], np.int64),
        pool_seed=np.array([seed * 1000 + p.index for p in plans], np.int64),
        pool_queue=np.array([queue_order_id(e.scheduling_policy) for e in engines], np.int64),
        pool_victim=np.array([victim_id(_victim(p.config)) for p in plans], np.int64),
        pool_watermark_blocks=np.array(
            [int(p.config.preemption.watermark * (p.capacity.kv_blocks - 1)) for p in plans], np.int64),
        pool_whole_prompt=np.array([int(p.config.preemption.whole_prompt_gate) for p in plans], np.int64),
        pool_async_scheduling=np.array([int(e.async_scheduling) for e in engines], np.int64),
        pool_swap=np.array([int(p.config.preemption.mode == "swap") for p in plans], np.int64),
        pool_host_blocks=np.array([int(p.config.preemption.swap_space_gib * 2**30 // _block_bytes(p)) for p in plans],
                                  np.int64),
        pool_swap_us_per_block=np.array(
            [math.ceil(_block_bytes(p) / p.config.preemption.host_link_bytes_per_s * 1e6) for p in plans], np.int64),
        pool_ttft_budget_us=np.full(len(plans), round(ttft_budget_ms * 1000), np.int64),
        tenant=one_or_each(tenant_ids),
        num_tenants=int(tenant_ids.max()) + 1 if len(tenant_ids) else 1,
        user=user_table(plans, source),
        **admission_inputs(plans),
        **(pd or {}),
        **lora_spec_inputs(frame, plans),
        **sessions,
    )


def user_table(plans: list[PoolPlan], source: str = "config") -> UserTable | None:
    """The pools' user-written per-step policies (policies/user.py), None when every pool runs
    built-ins; each with the config key it came from, for the errors that name it."""
    choices: dict[str, list[UserChoice | None]] = {f: [] for f in ("router", "queue order", "preemption victim",
                                                                  "admission")}
    keys: dict[str, list[str]] = {f: [] for f in choices}
    for plan in plans:
        cfg, key = plan.config, f"{source}: pools[{plan.index}]"
        router = router_params(cfg.router)[1]
        rows = {
            "router": (router if isinstance(router, UserChoice) else None, "router"),
            "queue order": (user_policy_or_none(cfg.engine.scheduling_policy, "queue order"),
                            "engine.scheduling_policy"),
            "preemption victim": (user_policy_or_none(_victim(cfg), "preemption victim"), "preemption.victim"),
            "admission": (plan.admission if isinstance(plan.admission, UserChoice) else None, "admission.policy"),
        }
        for family, (choice, sub) in rows.items():
            choices[family].append(choice)
            keys[family].append(f"{key}.{sub}")
    table = UserTable({f: tuple(c) for f, c in choices.items()}, {f: tuple(k) for f, k in keys.items()})
    return table if table.any() else None


def lora_spec_inputs(frame: pl.DataFrame, plans: list[PoolPlan]) -> dict[str, Any]:
    """The engines' multi-LoRA and speculative-decoding columns: adapter ids (0.. in sorted order
    of their names; -1 for the base model), each pool's slots and load time, and each pool's
    verify-step credit table (replay/model/stepterms.py)."""
    out: dict[str, Any] = {}
    if any(p.terms.lora_slots for p in plans) and "adapter" in frame.columns:
        names = frame["adapter"]
        ids = names.rank("dense").fill_null(0).cast(pl.Int64).to_numpy() - 1
        out["adapter"] = np.where(names.is_null().to_numpy(), -1, ids).astype(np.int64)
        out["pool_lora_slots"] = np.array([p.terms.lora_slots for p in plans], np.int64)
        out["pool_lora_load_us"] = np.array([p.terms.lora_load_us for p in plans], np.int64)
    if any(p.terms.spec_k for p in plans):
        width = max(len(p.terms.spec_credit) for p in plans)
        table = np.zeros((len(plans), width), np.int64)
        for p in plans:
            table[p.index, :len(p.terms.spec_credit)] = p.terms.spec_credit
        out["pool_spec_k"] = np.array([p.terms.spec_k for p in plans], np.int64)
        out["pool_spec_credit"] = table
    return out


def replica_model(plan: PoolPlan, context_tokens: int = 1024) -> ReplicaModel:
    """What one replica can do, from the step model: prefill throughput with full token budgets,
    and decode throughput and inter-token latency at a few batch sizes (contexts of
    `context_tokens`), for planners that size pools from targets.

    With speculative decoding a decode step verifies k drafts per sequence and yields the credit
    table's expected tokens; with multi-LoRA every step is charged min(sequences, max_loras)
    distinct adapters (a prefill one), the most a step can hold: planners size for the worst mix."""
    eng, terms = plan.config.engine, plan.terms
    adapters = (lambda seqs: min(seqs, terms.lora_slots)) if terms.lora_slots else (lambda seqs: 0)
    chunk = eng.max_num_batched_tokens
    prefill_us = step_time_us_nb(plan.step_params, chunk, chunk * (chunk + 1) / 2.0, 0, 0, 0, 1, 0, adapters(1))
    points = []
    for seqs in sorted({1, 8, 32, 64, 128, eng.max_num_seqs}):
        if seqs > eng.max_num_seqs:
            continue
        # drafts per sequence, as many as the step's token budget leaves room for (as the engines)
        k = min(terms.spec_k, max(0, (chunk - seqs) // seqs))
        tokens_per_verify = float(terms.spec_credit[k]) / SPEC_CREDIT_SCALE if k else 1.0
        step_us = step_time_us_nb(plan.step_params, 0, 0.0, 0, seqs, seqs * context_tokens, seqs, seqs * k,
                                  adapters(seqs))
        tokens = seqs * tokens_per_verify
        points.append((seqs, tokens / step_us * 1e6, step_us / tokens_per_verify / 1000.0))
    return ReplicaModel(prefill_tokens_per_s=chunk / prefill_us * 1e6, decode_tokens_per_s_at=tuple(points),
                        kv_tokens=plan.capacity.kv_tokens, max_num_seqs=eng.max_num_seqs)


def admission_inputs(plans: list[PoolPlan]) -> dict[str, np.ndarray]:
    """Each pool's admission policy as the engines' integer columns (0 = limit off)."""
    cols = {name: np.zeros(len(plans), np.int64) for name in (
        "pool_admission", "pool_max_waiting", "pool_max_waiting_tokens", "pool_bucket_tokens",
        "pool_bucket_refill_per_s", "pool_shed_waiting_per_replica", "pool_shed_priority_from",
        "pool_slo_multiple_milli", "pool_prefill_tokens_per_s")}
    for plan in plans:
        i, spec = plan.index, admission_spec(plan.config.admission.policy)
        cols["pool_admission"][i] = spec.numba_id
        for name, value in plan.admission.columns().items():
            cols[f"pool_{name}"][i] = value
        if getattr(spec.module, "NEEDS_PREFILL_RATE", False):
            cols["pool_prefill_tokens_per_s"][i] = round(replica_model(plan).prefill_tokens_per_s)
    return cols


def _block_bytes(plan: PoolPlan) -> int:
    """Bytes of one KV block on each GPU (each GPU copies its own shard over its own link)."""
    return plan.capacity.block_bytes_per_gpu


def _victim(pool: PoolConfig) -> str:
    """`auto` is what vLLM does: the priority victim under the priority scheduling policy."""
    if pool.preemption.victim != "auto":
        return pool.preemption.victim
    return "vllm-priority" if pool.engine.scheduling_policy == "priority" else "vllm-fcfs"


def holds_arrivals(pool: PoolConfig) -> bool:
    """Whether a request that finds none of the pool's replicas active or starting is held at the
    pool until one starts, rather than rejected as no_replica: when its autoscaler may start one.

    Knative's activator sits in the path of a revision scaled to zero, buffers its requests and
    reports them to the autoscaler as concurrency (knative/serving `pkg/activator/handler`,
    `pkg/activator/net/throttler.go`; `docs/scaling/SYSTEM.md` "Scale from zero"); a Ray Serve
    handle queues requests while its deployment has no replica and counts them in the autoscaler's
    `total_num_requests` (ray `python/ray/serve/_private/router.py`). A pool without an
    autoscaler, or under `fixed` at 0 replicas, never gets one: its requests are rejected."""
    scaler = pool.autoscaler
    if scaler is None:
        return False
    if scaler.policy == "fixed":
        n = scaler.params.get("replicas") if isinstance(scaler.params, dict) else None
        n = pool.replicas if n is None else n
        return isinstance(n, int) and min(max(n, scaler.min_replicas), scaler.max_replicas) >= 1
    return scaler.max_replicas >= 1


def replica_slots(pool: PoolConfig) -> int:
    """Engine replicas kept for a pool: an autoscaled pool may have up to max_replicas serving
    while as many more still drain, so it gets twice its maximum."""
    return pool.replicas if pool.autoscaler is None else 2 * pool.max_replicas


def make_engine(name: str, inputs: EngineInputs) -> Engine:
    if name in ("numba", "numba-eager"):
        from replay.engine.numba_engine import NumbaEngine

        return NumbaEngine(inputs, lazy=name == "numba")
    if name == "reference":
        from replay.engine.reference.engine import ReferenceEngine

        return ReferenceEngine(inputs)
    raise ConfigError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")


@dataclass
class RawRun:
    """What the loop collected, before metrics: per-pool tick columns, events, request columns."""

    plans: list[PoolPlan]
    pool_index: np.ndarray
    ticks: dict[str, np.ndarray]  # name -> [tick, pool]; counters cumulative
    events: dict[str, np.ndarray]  # the engine's
    control_events: ControlEvents  # lifecycle and scaling decisions
    replica_slots: np.ndarray  # engine replicas per pool
    requests: dict[str, np.ndarray] | None  # None: handed over as rows while it ran (simulate's `rows`)
    end_us: int
    tick_us: int
    workers: int = 1  # processes that replayed the pools (replay/fleet/parallel.py)
    serial_reason: str | None = None  # why the pools were replayed in one engine, when they were


def simulate(
    frame: pl.DataFrame,
    trace_block_tokens: int | None,
    cfg: FleetConfig,
    *,
    engine: str = "numba",
    detailed_events: bool = False,
    progress: Callable[[int, int], None] | None = None,
    plans: list[PoolPlan] | None = None,
    config_source: str = "config",
    on_tick: Callable[..., None] | None = None,
    jobs: int = 1,
    rows=None,
) -> RawRun:
    """Replay `frame` (TRACE_SCHEMA) on the fleet of `cfg`; `progress(done_us, total_us)` per tick.
    `plans` are `plan_pools(cfg)`, when the caller has already made them. `on_tick` (live runs,
    `replay/fleet/live.py`) gets each tick's rows as they are appended, by keyword. `jobs` > 1
    replays pools that share nothing in up to that many processes, with the same outputs
    (replay/fleet/parallel.py); the run says why when they could not be. `rows` (RequestRows):
    where the numba engine's requests go as rows as they leave it (RawRun.requests then None)."""
    check_tick_count(frame, cfg)
    plans = plans if plans is not None else plan_pools(cfg, config_source)
    pool_index = split_requests(frame, cfg, plans, config_source)
    closed = cfg.trace is not None and cfg.trace.closed_loop
    inputs = build_inputs(frame, trace_block_tokens, plans, pool_index, detailed_events, cfg.seed, cfg.slo.ttft_ms,
                          pd_inputs(cfg, plans), config_source, closed)
    from replay.fleet import parallel

    why = parallel.serial_reason(cfg, plans, inputs, engine, jobs, on_tick)
    if why is None:
        raw = parallel.simulate_pools(inputs, pool_index, plans, cfg, engine, jobs, progress)
        if raw is not None:
            return _with_sent_times(raw, frame, inputs, closed)
        why = parallel.UNMERGEABLE
    eng = make_engine(engine, inputs)
    tick_us = max(1, round(cfg.tick_s * 1e6))
    last_arrival = int(inputs.arrival_us[-1]) if inputs.num_requests else 0
    control = make_control(plans, inputs, cfg, tick_us)
    control.start(eng)
    stream = stream_rows(eng, rows, frame, plans, pool_index, inputs, cfg) if on_tick is None and not closed else None
    loop = TickLoop(eng, control, len(plans), tick_us, last_arrival,
                    last_arrival + round(cfg.max_drain_s * 1e6), progress=progress, on_tick=on_tick)
    loop.run()
    if stream is not None:
        stream.flush(eng)
    raw = RawRun(plans, pool_index, loop.tick_arrays(), loop.engine_events(), control.events, inputs.pool_replicas,
                 None if stream is not None else eng.request_columns(), loop.t, tick_us, serial_reason=why)
    return _with_sent_times(raw, frame, inputs, closed)


def _with_sent_times(raw: RawRun, frame: pl.DataFrame, inputs: EngineInputs, closed: bool) -> RawRun:
    if not closed:
        return raw
    sent = with_sent_times(raw.requests, frame, inputs, [p.serving for p in raw.plans])
    return dataclasses.replace(raw, requests=sent)


def make_control(plans: list[PoolPlan], inputs: EngineInputs, cfg: FleetConfig, tick_us: int) -> FleetControl:
    pools = []
    for plan in plans:
        pool = plan.config
        first = inputs.pool_first_replica[plan.index]
        slots = np.arange(first, first + inputs.pool_replicas[plan.index])
        weights = plan.capacity.weights_bytes_per_gpu * plan.gpus_per_replica
        startup_s = pool.lifecycle.pod_start_s + weights / pool.lifecycle.load_bytes_per_s
        pc = PoolControl(plan.index, plan.name, slots, plan.gpus_per_replica, round(startup_s * 1e6),
                         slo_ttft_ms=cfg.slo.ttft_ms, slo_tpot_ms=cfg.slo.tpot_ms)
        if pool.autoscaler is not None:
            # only an autoscaler reads it (its ScalingContext): a fixed pool's first run does not
            # compile the step model's host call
            pc.replica = replica_model(plan)
            scaler = pool.autoscaler
            pc.decide, pc.scrape_delay_ticks = make_decider(scaler, tick_us, f"pools[{plan.index}].autoscaler")
            pc.policy, pc.min_replicas, pc.max_replicas = scaler.policy, scaler.min_replicas, scaler.max_replicas
        pools.append(pc)
    sees = {inputs.pd_prefill_pool: inputs.pd_decode_pool} if inputs.pd_prefill_pool >= 0 else None
    return FleetControl(pools, len(inputs.replica_pool), tick_us, inputs.arrival_us, inputs.prompt_tokens,
                        inputs.output_tokens, inputs.pool, sees, closed_loop=bool(inputs.closed_loop))
