"""Hypothesis strategies for engine inputs: small fleets, sorted traces, shared prefixes.

Arrivals are drawn as integer gaps and cumulative-summed, so traces are sorted by construction
and shrink toward simultaneous arrivals.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from policies.registry import ADMISSIONS, QUEUE_ORDERS, ROUTERS, VICTIMS, router_columns
from policies.routers.weighted import SCORERS
from replay.engine.common import EngineInputs
from replay.model.stepmodel import DraftShape, StepShape, step_params
from replay.model.stepterms import spec_credit_table

# llama-3.1-8b-like numbers on one H100; what matters here is that steps take realistic time.
SHAPE = StepShape(8.0e9, 32, 32, 128, 4096, 1, 16.0e9, 131072.0, 989e12, 3.35e12, 450e9)
STEP = step_params(SHAPE)
# The same with a 1B draft model proposing, 64 MB LoRA adapters (what the engines pass the step
# model for speculative and multi-LoRA batches must move its times) and a matmul knee at 64
# tokens, which the drawn batches cross.
STEP_TERMS = step_params(SHAPE, draft=DraftShape(3, 2.5e9, 2.5e9, 32768.0), lora_bytes_per_adapter=64e6,
                         lora_flops_per_token=1e8, mfu=0.5, knee_tokens=64, past_knee_mfu=0.2)


def routers():
    """Every registered router by name, or the weighted router over drawn scorer weights."""
    weights = st.dictionaries(st.sampled_from(SCORERS), st.sampled_from([0.5, 1, 2, 3]), min_size=1, max_size=4)
    return st.one_of(st.sampled_from(sorted(ROUTERS)), weights.map(lambda w: {"policy": "weighted", "scorers": w}))


def make_inputs(
    arrival_us, prompt, output, *, families=None, trace_block_tokens=32, replicas=(1,), kv_blocks=(64,),
    block_size=(16,), max_num_seqs=(8,), max_batched=(256,), long_prefill=(0,), prefix_caching=(1,),
    max_model_len=(4096,), router=("least-outstanding",), pool=None, priority=None, detailed_events=True,
    queue=None, victim=None, watermark_blocks=None, whole_prompt=None, tenant=None, admission=None,
    adm=None, swap=None, host_blocks=None, pd=None, adapter=None, lora_slots=None, lora_load_us=None,
    spec=None, async_scheduling=None,
) -> EngineInputs:
    n = len(arrival_us)
    prompt = np.asarray(prompt, np.int64)
    hash_len = np.zeros(n, np.int64)
    hashes: list[int] = []
    offsets = []
    for i in range(n):
        offsets.append(len(hashes))
        if families is not None and families[i] >= 0:
            blocks = -(-int(prompt[i]) // trace_block_tokens)
            # The first three trace blocks are shared by the family; the rest are the request's own.
            hashes += [families[i] * 1000 + k if k < 3 else 10**6 + i * 1000 + k for k in range(blocks)]
            hash_len[i] = blocks
    npool = len(replicas)
    router_ids, router_params = router_columns(list(router))  # names, or {policy: ..., <params>}
    return EngineInputs(
        arrival_us=np.asarray(arrival_us, np.int64),
        prompt_tokens=prompt,
        output_tokens=np.asarray(output, np.int64),
        priority=np.zeros(n, np.int64) if priority is None else np.asarray(priority, np.int64),
        pool=np.zeros(n, np.int64) if pool is None else np.asarray(pool, np.int64),
        hash_off=np.asarray(offsets, np.int64),
        hash_len=hash_len,
        trace_hashes=np.asarray(hashes, np.uint64),
        trace_block_tokens=trace_block_tokens,
        pool_replicas=np.asarray(replicas, np.int64),
        pool_kv_blocks=np.asarray(kv_blocks, np.int64),
        pool_block_size=np.asarray(block_size, np.int64),
        pool_max_num_seqs=np.asarray(max_num_seqs, np.int64),
        pool_max_num_batched_tokens=np.asarray(max_batched, np.int64),
        pool_long_prefill_token_threshold=np.asarray(long_prefill, np.int64),
        pool_enable_prefix_caching=np.asarray(prefix_caching, np.int64),
        pool_max_model_len=np.asarray(max_model_len, np.int64),
        pool_router=router_ids,
        pool_router_params=router_params,
        pool_step_params=np.stack([STEP if spec is None and lora_slots is None else STEP_TERMS] * npool),
        detailed_events=detailed_events,
        pool_queue=None if queue is None else np.asarray(queue, np.int64),
        pool_victim=None if victim is None else np.asarray(victim, np.int64),
        pool_watermark_blocks=None if watermark_blocks is None else np.asarray(watermark_blocks, np.int64),
        pool_whole_prompt=None if whole_prompt is None else np.asarray(whole_prompt, np.int64),
        tenant=None if tenant is None else np.asarray(tenant, np.int64),
        num_tenants=1 if tenant is None else int(max(tenant)) + 1,
        pool_admission=None if admission is None else np.asarray(admission, np.int64),
        **({} if adm is None else {f"pool_{k}": np.asarray(v, np.int64) for k, v in adm.items()}),
        pool_swap=None if swap is None else np.asarray(swap, np.int64),
        pool_host_blocks=None if host_blocks is None else np.asarray(host_blocks, np.int64),
        pool_swap_us_per_block=None if swap is None else np.full(len(replicas), 40, np.int64),
        **(pd or {}),
        adapter=None if adapter is None else np.asarray(adapter, np.int64),
        pool_lora_slots=None if lora_slots is None else np.asarray(lora_slots, np.int64),
        pool_lora_load_us=None if lora_load_us is None else np.asarray(lora_load_us, np.int64),
        **({} if spec is None else _spec_inputs(spec)),
        pool_async_scheduling=None if async_scheduling is None else np.asarray(async_scheduling, np.int64),
    )


def _spec_inputs(spec) -> dict:
    """Per pool (num_speculative_tokens, acceptance_rate) -> the engines' speculative columns."""
    ks = [k for k, _ in spec]
    width = max(ks) + 1
    table = np.zeros((len(spec), width), np.int64)
    for i, (k, a) in enumerate(spec):
        row = spec_credit_table(a, k)
        table[i, :len(row)] = row
    return {"pool_spec_k": np.asarray(ks, np.int64), "pool_spec_credit": table}


def tiny_inputs() -> EngineInputs:
    return make_inputs([0, 0, 5_000, 90_000], [40, 300, 17, 600], [5, 2, 30, 1], families=[0, 0, 1, -1])


@st.composite
def engine_inputs(draw, max_requests: int = 40, pd: bool | None = None) -> EngineInputs:
    """A small fleet under pressure: few KV blocks, small budgets, shared prefixes."""
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.integers(0, 60_000), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    families = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    npool = 2 if pd else draw(st.integers(1, 2))
    pool = draw(st.lists(st.integers(0, npool - 1), min_size=n, max_size=n))
    # Prefill/decode disaggregation (pd: True always, False never, None drawn): pool 0 prefills,
    # pool 1 decodes; every request arrives at 1.
    if pd is None:
        pd = npool == 2 and draw(st.booleans())
    if pd:
        pool = [1] * n
        pd = {
            "pd_prefill_pool": 0,
            "pd_decode_pool": 1,
            "pd_local_threshold": draw(st.sampled_from([0, 0, 50, 200])),
            "pd_us_per_token": draw(st.sampled_from([0.0, 0.37, 2.6, 41.9])),
            "pd_base_us": draw(st.sampled_from([0, 1000])),
            "pd_layers": draw(st.sampled_from([0, 4, 32])),
        }
    else:
        pd = None
    priority = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    tenant = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    # Multi-LoRA (adapters 0..3, or none) and speculative decoding, each on in about half the draws.
    lora = draw(st.booleans())
    adapter = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n)) if lora else None
    spec = tuple((draw(st.integers(0, 4)), draw(st.sampled_from([0.0, 0.3, 0.71, 0.9])))
                 for _ in range(npool)) if draw(st.booleans()) else None

    def per_pool(strategy):
        return tuple(draw(strategy) for _ in range(npool))

    return make_inputs(
        np.cumsum(gaps),
        prompt,
        output,
        families=families,
        trace_block_tokens=draw(st.sampled_from([16, 32, 48, 512])),
        replicas=per_pool(st.integers(1, 3)),
        kv_blocks=per_pool(st.integers(4, 80)),
        block_size=(draw(st.sampled_from([4, 16, 32])),) * npool if pd else per_pool(st.sampled_from([4, 16, 32])),
        max_num_seqs=per_pool(st.integers(1, 8)),
        max_batched=per_pool(st.integers(8, 512)),
        long_prefill=per_pool(st.sampled_from([0, 0, 16, 100])),
        prefix_caching=per_pool(st.sampled_from([0, 1, 1])),
        max_model_len=per_pool(st.sampled_from([300, 4096])),
        router=per_pool(routers()),
        pool=pool,
        priority=priority,
        queue=per_pool(st.sampled_from([spec.numba_id for spec in QUEUE_ORDERS.values()])),
        victim=per_pool(st.sampled_from([spec.numba_id for spec in VICTIMS.values()])),
        watermark_blocks=per_pool(st.sampled_from([0, 0, 1, 3])),
        whole_prompt=per_pool(st.sampled_from([0, 0, 1])),
        swap=per_pool(st.sampled_from([0, 1])),
        host_blocks=per_pool(st.sampled_from([0, 10, 1000])),
        tenant=tenant,
        admission=per_pool(st.sampled_from([spec.numba_id for spec in ADMISSIONS.values()])),
        adm={
            "max_waiting": per_pool(st.integers(0, 6)),
            "max_waiting_tokens": per_pool(st.sampled_from([0, 300, 2000])),
            "bucket_tokens": per_pool(st.sampled_from([500, 2000])),
            "bucket_refill_per_s": per_pool(st.sampled_from([100, 1000])),
            "shed_waiting_per_replica": per_pool(st.integers(1, 4)),
            "shed_priority_from": per_pool(st.integers(0, 2)),
            "slo_multiple_milli": per_pool(st.sampled_from([500, 1000, 3000])),
            "prefill_tokens_per_s": per_pool(st.sampled_from([2000, 20000])),
        },
        pd=pd,
        adapter=adapter,
        lora_slots=per_pool(st.sampled_from([0, 1, 2, 3])) if lora else None,
        lora_load_us=per_pool(st.sampled_from([0, 250, 5000])) if lora else None,
        spec=spec,
        async_scheduling=per_pool(st.sampled_from([0, 1])),
    )


def run_to_end(engine, tick_us: int = 1_000_000, limit_us: int = 10**13) -> None:
    t = 0
    while not engine.done and t < limit_us:
        t += tick_us
        engine.advance(t)
