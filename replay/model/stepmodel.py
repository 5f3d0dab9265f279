"""Roofline step model: how long one engine step takes, in integer microseconds.

`step_time_us = max(FLOPs / (peak_flops * mfu) [+ knee], bytes / (hbm_bw * mbu)) + tp_allreduce
               + ep_all_to_all + draft_model + per_step_overhead + per_seq_overhead * seqs
               + prefill_overhead (steps that compute prompt tokens)`   (DESIGN.md, "The step model").
Everything is per GPU: a replica's GPUs run the same step in lock-step. The terms for weight
precision, FP8 KV, MoE, speculative decoding and multi-LoRA are built in `replay/model/stepterms.py`.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

# Indices into the float64 parameter vector the kernels take (one row per pool).
FLOPS_PER_TOKEN = 0  # 2 * active_params / tp: the dense matmuls, per GPU
ATTN_FLOPS_PER_PAIR = 1  # 4 * layers * heads * head_dim / tp: QK^T and AV per (query, key) pair
WEIGHT_BYTES = 2  # weights read once per step, per GPU
KV_BYTES_PER_TOKEN = 3  # KV bytes per token per GPU, read for context and written for new tokens
FLOPS_RATE = 4  # peak FLOP/s * mfu
BYTES_RATE = 5  # HBM bytes/s * mbu
ALLREDUCE_BYTES_PER_TOKEN = 6  # ring all-reduce traffic per token per GPU (0 when tp == 1)
LINK_BYTES_RATE = 7  # interconnect bytes/s per GPU, one direction, times link_efficiency
ALLREDUCE_FIXED_US = 8  # latency of the step's all-reduces (2 per layer), 0 when tp == 1
STEP_OVERHEAD_US = 9  # scheduler, sampling, launch: never zero
SEQ_OVERHEAD_US = 10  # per sequence in the batch (input prep, detokenise)
# Extra fixed cost of a step that computes prompt tokens: engines that capture CUDA graphs for
# decode only run prefill eagerly (kernel launches, attention metadata); calibration measures it.
PREFILL_OVERHEAD_US = 11
# MoE: bytes of one routed expert summed over the MoE layers, per GPU; the routed experts' count
# and top-k. The experts a step reads are those its tokens touch (see `step_time_us_nb`).
EXPERT_BYTES_EACH = 12
NUM_EXPERTS = 13
EXPERTS_PER_TOKEN = 14
# Expert parallelism: the busiest GPU's dispatch + combine all-to-all time per token of the step,
# and the collectives' fixed latency (0 without expert parallelism).
A2A_US_PER_TOKEN = 15
A2A_FIXED_US = 16
# Speculative decoding: draft passes per step (num_speculative_tokens; 0 for n-gram / none), and
# one draft pass's FLOPs per sequence, weight bytes, and KV bytes per context token, per GPU.
SPEC_DRAFT_PASSES = 17
DRAFT_FLOPS_PER_TOKEN = 18
DRAFT_WEIGHT_BYTES = 19
DRAFT_KV_BYTES_PER_TOKEN = 20
# Multi-LoRA: bytes of one adapter (at max_lora_rank) per GPU, read once per distinct adapter in
# the batch; its FLOPs per token (shrink + expand), per GPU.
LORA_BYTES_PER_ADAPTER = 21
LORA_FLOPS_PER_TOKEN = 22
# The table backend (`step_model: {backend: table}`): step times interpolated over measured steps
# instead of the roofline. TABLE_ON is 1 for it; then TABLE_POINTS points of a prefill table
# (step time against the step's tokens, for steps that prefill) and of a decode table (against
# the decoding sequences, at TABLE_CTX_REF tokens of context each), unused points past the counts.
TABLE_ON = 23
TABLE_NPREFILL = 24
TABLE_NDECODE = 25
TABLE_CTX_REF = 26
TABLE_POINTS = 32
TABLE_PREFILL_X = 27
TABLE_PREFILL_Y = TABLE_PREFILL_X + TABLE_POINTS
TABLE_DECODE_X = TABLE_PREFILL_Y + TABLE_POINTS
TABLE_DECODE_Y = TABLE_DECODE_X + TABLE_POINTS
# The matmul knee: the step's tokens beyond KNEE_TOKENS (0: no knee) run their dense matmuls at
# PAST_KNEE_FLOPS_RATE (peak FLOP/s * past_knee_mfu) instead of FLOPS_RATE. Calibration finds one
# in the Splitwise profile, where at TP 4 and 8 a step's prefill cost per token rises 13-78% from
# 2k to 8k tokens, whether in one prompt or many (replay/calibration/steps.py, `fit_knee`).
KNEE_TOKENS = TABLE_DECODE_Y + TABLE_POINTS
PAST_KNEE_FLOPS_RATE = KNEE_TOKENS + 1
# CUDA graphs (vLLM V1's default FULL_AND_PIECEWISE mode): a step of at most CUDA_GRAPH_MAX_TOKENS
# tokens replays a graph captured for the next capture size, so its matmuls and all-reduces run
# on the padded token count (`cuda_graph_tokens`); a larger step runs eagerly, unpadded. 0: no
# graphs (vLLM --enforce-eager).
CUDA_GRAPH_MAX_TOKENS = PAST_KNEE_FLOPS_RATE + 1
# KV reads and writes run at their own share of HBM bandwidth (attention_mbu; unset: mbu): paged
# attention over short contexts streams differently from the weights' GEMMs, and the real
# servers' steps tell the two apart (replay/calibration/requests.py).
KV_BYTES_RATE = CUDA_GRAPH_MAX_TOKENS + 1
# MoE: the routed experts' weights stream at their own share too (expert_mbu; unset: mbu): a
# fused-MoE kernel runs one small GEMM per touched expert, each over a few of the step's tokens.
EXPERT_BYTES_RATE = KV_BYTES_RATE + 1
NUM_PARAMS = EXPERT_BYTES_RATE + 1

# Defaults of a pool with no step_model settings. Chosen so that llama-2-70b TP2 on A100-80GB
# decodes at batch 1 in ~55 ms per token, as the Splitwise profile measures. The calibrated
# alternative is `step_model: {profile: splitwise}` (replay/profiles/README.md says what
# switching the default to it would change).
DEFAULT_MFU = 0.5
DEFAULT_MBU = 0.65
DEFAULT_STEP_OVERHEAD_US = 1000.0
DEFAULT_SEQ_OVERHEAD_US = 10.0
DEFAULT_ALLREDUCE_LATENCY_US = 6.0
DEFAULT_PREFILL_OVERHEAD_US = 0.0
# Share of the GPU's interconnect bandwidth the all-reduce's traffic attains (1.0: the data sheet's).
# The shipped per-GPU defaults fit it to Vidur's NCCL measurements (replay/calibration/vidur.py).
DEFAULT_LINK_EFFICIENCY = 1.0


@dataclass(frozen=True)
class StepShape:
    """What the step model needs to know about a model on a GPU at a TP degree (all per GPU).

    MoE models also give the part of `weights_bytes_per_gpu` and of `active_params` that lives in
    routed experts, the expert count and top-k, and how many layers are MoE layers.
    """

    active_params: float
    num_layers: int
    num_attention_heads: int
    head_dim: int
    hidden_size: int
    tp: int
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    peak_flops: float
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    activation_bytes: int = 2
    expert_weights_bytes_per_gpu: float = 0.0
    expert_active_params: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0


@dataclass(frozen=True)
class ExpertParallel:
    """Expert parallelism over the replica's GPUs (vLLM `enable_expert_parallel`): each GPU holds
    whole experts, tokens travel to them in a dispatch and come back in a combine all-to-all per
    MoE layer (DeepEP's layout: FP8 dispatch, BF16 combine), and the busiest GPU sets the step:
    its share of expert work and traffic is `load_imbalance` times the mean."""

    all_to_all_bytes_per_s: float
    load_imbalance: float = 1.0
    dispatch_bytes: int = 1
    combine_bytes: int = 2


@dataclass(frozen=True)
class DraftShape:
    """One draft pass of speculative decoding, per GPU: `passes` per step (num_speculative_tokens;
    0 when the proposer costs no GPU time, as n-gram lookup on the CPU)."""

    passes: int
    flops_per_token: float
    weight_bytes: float
    kv_bytes_per_token: float


def step_params(
    shape: StepShape,
    *,
    mfu: float | None = None,
    mbu: float | None = None,
    attention_mbu: float | None = None,
    expert_mbu: float | None = None,
    per_step_overhead_us: float | None = None,
    per_seq_overhead_us: float | None = None,
    allreduce_latency_us: float | None = None,
    prefill_overhead_us: float | None = None,
    expert_parallel: ExpertParallel | None = None,
    draft: DraftShape | None = None,
    lora_bytes_per_adapter: float = 0.0,
    lora_flops_per_token: float = 0.0,
    knee_tokens: float | None = None,
    past_knee_mfu: float | None = None,
    link_efficiency: float | None = None,
    cuda_graph_max_tokens: int = 0,
) -> np.ndarray:
    """The parameter vector of `step_time_us_nb` for one pool. Without `knee_tokens` (or with 0)
    every token's matmuls run at `mfu`; with it, tokens past it run at `past_knee_mfu`."""
    tp = shape.tp
    p = np.zeros(NUM_PARAMS, dtype=np.float64)
    imbalance = expert_parallel.load_imbalance if expert_parallel is not None else 1.0
    dense_active = shape.active_params - shape.expert_active_params
    # Under expert parallelism the busiest GPU does `imbalance` times its even share of the
    # routed experts' work; under TP every GPU computes a 1/tp slice of every expert (balanced).
    p[FLOPS_PER_TOKEN] = 2.0 * (dense_active + shape.expert_active_params * imbalance) / tp
    p[ATTN_FLOPS_PER_PAIR] = 4.0 * shape.num_layers * shape.num_attention_heads * shape.head_dim / tp
    p[WEIGHT_BYTES] = shape.weights_bytes_per_gpu - shape.expert_weights_bytes_per_gpu
    p[KV_BYTES_PER_TOKEN] = shape.kv_bytes_per_token_per_gpu
    p[FLOPS_RATE] = shape.peak_flops * (DEFAULT_MFU if mfu is None else mfu)
    p[BYTES_RATE] = shape.hbm_bytes_per_s * (DEFAULT_MBU if mbu is None else mbu)
    p[KV_BYTES_RATE] = p[BYTES_RATE] if attention_mbu is None else shape.hbm_bytes_per_s * attention_mbu
    p[EXPERT_BYTES_RATE] = p[BYTES_RATE] if expert_mbu is None else shape.hbm_bytes_per_s * expert_mbu
    latency = DEFAULT_ALLREDUCE_LATENCY_US if allreduce_latency_us is None else allreduce_latency_us
    if tp > 1:
        # Two all-reduces of the hidden state per layer (after attention and after the MLP);
        # a ring all-reduce moves 2 (tp - 1) / tp of the buffer through each GPU's link. Under
        # expert parallelism the MoE layers' MLP all-reduce becomes the all-to-all below.
        reduces = 2 * shape.num_layers - (shape.moe_layers if expert_parallel is not None else 0)
        per_token = reduces * shape.hidden_size * shape.activation_bytes
        p[ALLREDUCE_BYTES_PER_TOKEN] = per_token * 2.0 * (tp - 1) / tp
        # Each all-reduce's fixed cost grows with the GPUs it spans: log2(tp) latency steps, as a
        # tree or recursive-doubling all-reduce takes (NCCL's tree and LL protocols for small
        # messages); the real servers' TP2 and TP4 steps favour it over the flat or (tp - 1) forms.
        p[ALLREDUCE_FIXED_US] = reduces * latency * math.log2(tp)
    efficiency = DEFAULT_LINK_EFFICIENCY if link_efficiency is None else link_efficiency
    p[LINK_BYTES_RATE] = max(shape.link_bytes_per_s * efficiency, 1.0)
    p[STEP_OVERHEAD_US] = DEFAULT_STEP_OVERHEAD_US if per_step_overhead_us is None else per_step_overhead_us
    p[SEQ_OVERHEAD_US] = DEFAULT_SEQ_OVERHEAD_US if per_seq_overhead_us is None else per_seq_overhead_us
    p[PREFILL_OVERHEAD_US] = DEFAULT_PREFILL_OVERHEAD_US if prefill_overhead_us is None else prefill_overhead_us
    if shape.num_experts > 0:
        p[EXPERT_BYTES_EACH] = shape.expert_weights_bytes_per_gpu / shape.num_experts
        p[NUM_EXPERTS] = shape.num_experts
        p[EXPERTS_PER_TOKEN] = shape.experts_per_token
    if expert_parallel is not None and shape.num_experts > 0 and tp > 1:
        # The step's tokens are spread over the tp GPUs; each sends its share to the experts'
        # GPUs and gets it back (ref 000, section 07: tokens x top_k x hidden bytes each way).
        ep = expert_parallel
        per_token_s = shape.experts_per_token * shape.hidden_size * (
            ep.dispatch_bytes + ep.combine_bytes) / ep.all_to_all_bytes_per_s
        p[A2A_US_PER_TOKEN] = shape.moe_layers * per_token_s * 1e6 / tp * ep.load_imbalance
        p[A2A_FIXED_US] = 2 * shape.moe_layers * latency
    if draft is not None and draft.passes > 0:
        p[SPEC_DRAFT_PASSES] = draft.passes
        p[DRAFT_FLOPS_PER_TOKEN] = draft.flops_per_token
        p[DRAFT_WEIGHT_BYTES] = draft.weight_bytes
        p[DRAFT_KV_BYTES_PER_TOKEN] = draft.kv_bytes_per_token
    p[LORA_BYTES_PER_ADAPTER] = lora_bytes_per_adapter
    p[LORA_FLOPS_PER_TOKEN] = lora_flops_per_token
    p[CUDA_GRAPH_MAX_TOKENS] = cuda_graph_max_tokens
    if knee_tokens:
        if past_knee_mfu is None:
            raise ValueError("a knee (knee_tokens) needs the efficiency past it (past_knee_mfu)")
        p[KNEE_TOKENS] = knee_tokens
        p[PAST_KNEE_FLOPS_RATE] = shape.peak_flops * past_knee_mfu
    return p


def cudagraph_capture_limit(max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0,
                          max_capture_size: int | None = None, enforce_eager: bool = False) -> int:
    """The largest CUDA-graph capture size vLLM V1 picks: min(2 * max_num_seqs * (1 + drafts), 512),
    capped at max_num_batched_tokens (`VllmConfig._set_cudagraph_sizes`, vllm/config/vllm.py; the
    `--max-cudagraph-capture-size` compilation option overrides it). 0 under --enforce-eager."""
    if enforce_eager:
        return 0
    largest = min(2 * max_num_seqs * (1 + num_speculative_tokens), 512) if max_capture_size is None else max_capture_size
    cap = int(min(largest, max_num_batched_tokens))
    # the sizes captured are those of the list up to the cap: its largest is the cap rounded down
    if cap <= 4:
        return 1 << (cap.bit_length() - 1)
    return cap // 8 * 8 if cap < 256 else cap // 16 * 16


@njit(cache=True, _nrt=False, forceinline=True, no_cfunc_wrapper=True)  # also called from Python (tests)
def cuda_graph_tokens(tokens, largest):
    """The capture size a step of `tokens` tokens is padded to: vLLM V1 captures 1, 2, 4, then
    every multiple of 8 up to 256, then of 16 up to the largest (`_set_cudagraph_sizes`), and pads
    a batch to the smallest size that holds it (`CudagraphDispatcher`); past the largest, none."""
    if tokens <= 0 or tokens > largest:
        return tokens
    if tokens <= 4:
        padded = 1
        while padded < tokens:
            padded *= 2
    elif tokens <= 256:
        padded = (tokens + 7) // 8 * 8
    else:
        padded = (tokens + 15) // 16 * 16
    return min(padded, largest)


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def step_time_us_nb(p, prefill_tokens, prefill_attn_pairs, prefill_ctx_tokens, decode_seqs, decode_ctx_tokens,
                    num_seqs, spec_tokens=0, lora_adapters=0):
    """Duration of one step, in whole microseconds (at least 1).

    prefill_tokens: new prompt tokens computed this step (chunks included);
    prefill_attn_pairs: sum over prefill chunks of (query, key) pairs, ~ chunk * (context + chunk / 2),
    which makes prefill attention quadratic in the context;
    prefill_ctx_tokens: tokens of KV the prefill chunks read (cached prefix, earlier chunks);
    decode_seqs: sequences decoding; decode_ctx_tokens: their total context length (KV read once
    per step: linear in the context);
    num_seqs: sequences in the batch;
    spec_tokens: draft tokens the decoding sequences verify besides their one token each
    (speculative decoding: a verify step runs 1 + drafts query tokens per sequence);
    lora_adapters: distinct LoRA adapters in the batch.
    """
    if p[TABLE_ON] > 0:
        return table_step_us_nb(p, prefill_tokens, decode_seqs, decode_ctx_tokens)
    decode_tokens = decode_seqs + spec_tokens
    # The padded slots of a CUDA-graph replay run the matmuls and all-reduces too (attention
    # skips them: their slot mapping is the null slot); KV and attention count real tokens only.
    real = prefill_tokens + decode_tokens
    tokens = cuda_graph_tokens(real, np.int64(p[CUDA_GRAPH_MAX_TOKENS]))
    decode_pairs = float(decode_ctx_tokens)
    if spec_tokens > 0 and decode_seqs > 0:
        # Each draft token attends to about its sequence's context: the batch's mean.
        decode_pairs += spec_tokens * (decode_ctx_tokens / decode_seqs)
    flops = p[FLOPS_PER_TOKEN] * tokens + p[ATTN_FLOPS_PER_PAIR] * (prefill_attn_pairs + decode_pairs)
    past_knee = tokens - p[KNEE_TOKENS]
    weight_bytes = p[WEIGHT_BYTES]
    expert_bytes = 0.0
    if p[NUM_EXPERTS] > 0 and real > 0:
        # Top-k routing of T tokens over E experts touches E (1 - (1 - k/E)^T) distinct experts per
        # MoE layer in expectation (uniform routing); only those experts' weights are read. T counts a
        # CUDA graph's padded slots: vLLM v0.15 routes them like real tokens (the runner zeroes only
        # their positions, so they carry stale token ids; `_preprocess` in vllm/v1/worker/
        # gpu_model_runner.py), and a TP-only fused-MoE step reads the experts they pick ("padded
        # tokens go through the full router and activate extra experts", sgl-project/sglang PR #25852;
        # vLLM skips them only from vllm-project/vllm PR #46428, opt-in, after v0.15).
        e = p[NUM_EXPERTS]
        touched = e * (1.0 - (1.0 - p[EXPERTS_PER_TOKEN] / e) ** tokens)
        expert_bytes = p[EXPERT_BYTES_EACH] * touched
    if lora_adapters > 0:
        # Each distinct adapter's A and B are gathered and read once (Punica SGMV, S-LoRA).
        weight_bytes += p[LORA_BYTES_PER_ADAPTER] * lora_adapters
        flops += p[LORA_FLOPS_PER_TOKEN] * tokens
    kv_bytes = p[KV_BYTES_PER_TOKEN] * (decode_ctx_tokens + prefill_ctx_tokens + real)
    compute_us = flops / p[FLOPS_RATE] * 1e6
    if p[KNEE_TOKENS] > 0 and past_knee > 0:
        # The dense matmuls of the tokens past the knee run at the past-knee rate instead.
        compute_us += p[FLOPS_PER_TOKEN] * past_knee * (1.0 / p[PAST_KNEE_FLOPS_RATE] - 1.0 / p[FLOPS_RATE]) * 1e6
    memory_us = (weight_bytes / p[BYTES_RATE] + expert_bytes / p[EXPERT_BYTES_RATE] + kv_bytes / p[KV_BYTES_RATE]) * 1e6
    comm_us = p[ALLREDUCE_BYTES_PER_TOKEN] * tokens / p[LINK_BYTES_RATE] * 1e6 + p[ALLREDUCE_FIXED_US]
    comm_us += p[A2A_US_PER_TOKEN] * tokens + p[A2A_FIXED_US]
    total = max(compute_us, memory_us) + comm_us + p[STEP_OVERHEAD_US] + p[SEQ_OVERHEAD_US] * num_seqs
    if spec_tokens > 0 and p[SPEC_DRAFT_PASSES] > 0:
        # The proposer runs `passes` sequential decode steps over the decoding sequences.
        draft_compute = p[DRAFT_FLOPS_PER_TOKEN] * decode_seqs / p[FLOPS_RATE]
        draft_memory = (p[DRAFT_WEIGHT_BYTES] + p[DRAFT_KV_BYTES_PER_TOKEN] * decode_ctx_tokens) / p[BYTES_RATE]
        total += p[SPEC_DRAFT_PASSES] * max(draft_compute, draft_memory) * 1e6
    if prefill_tokens > 0:
        total += p[PREFILL_OVERHEAD_US]
    return max(np.int64(1), np.int64(math.ceil(total)))


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _interp(p, xs, ys, n, x):
    """Piecewise-linear through the n points at p[xs:], p[ys:] (x ascending); outside them, the
    end segment's line continued."""
    k = 1
    while k < n - 1 and p[xs + k] < x:
        k += 1
    x0, x1 = p[xs + k - 1], p[xs + k]
    y0, y1 = p[ys + k - 1], p[ys + k]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def table_step_us_nb(p, prefill_tokens, decode_seqs, decode_ctx_tokens):
    """The table backend, as Splitwise's simulator and Vidur use measured profiles: a step that
    prefills costs the prefill table at its tokens (decodes riding along count as one token
    each); a decode step costs the decode table at its sequences, plus the roofline's KV-read time
    for context beyond (or minus the part short of) the measured context per sequence."""
    if prefill_tokens > 0:
        # int64 offsets: literal ones would compile _interp once per table
        us = _interp(p, np.int64(TABLE_PREFILL_X), np.int64(TABLE_PREFILL_Y), np.int64(p[TABLE_NPREFILL]),
                     float(prefill_tokens + decode_seqs))
    else:
        us = _interp(p, np.int64(TABLE_DECODE_X), np.int64(TABLE_DECODE_Y), np.int64(p[TABLE_NDECODE]),
                     float(decode_seqs))
        extra = decode_ctx_tokens - decode_seqs * p[TABLE_CTX_REF]
        us += p[KV_BYTES_PER_TOKEN] * extra / p[KV_BYTES_RATE] * 1e6
    return max(np.int64(1), np.int64(math.ceil(us)))


def with_table(params: np.ndarray, prefill: list[tuple[float, float]], decode: list[tuple[float, float]],
               ctx_ref: float) -> np.ndarray:
    """`params` switched to the table backend: (tokens, us) prefill points and (sequences, us)
    decode points, each at least two distinct x, at most TABLE_POINTS (see `table_points`)."""
    p = params.copy()
    p[TABLE_ON] = 1.0
    p[TABLE_CTX_REF] = ctx_ref
    for count, xs, ys, points in ((TABLE_NPREFILL, TABLE_PREFILL_X, TABLE_PREFILL_Y, prefill),
                                  (TABLE_NDECODE, TABLE_DECODE_X, TABLE_DECODE_Y, decode)):
        if not 2 <= len(points) <= TABLE_POINTS:
            raise ValueError(f"a table needs 2 to {TABLE_POINTS} points, got {len(points)}")
        p[count] = len(points)
        for k, (x, y) in enumerate(points):
            p[xs + k], p[ys + k] = x, y
    return p


def table_points(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
    """One point per distinct x (the median y of its repetitions), ascending; more than
    TABLE_POINTS distinct x are thinned to TABLE_POINTS spread over the range, ends kept."""
    xs = np.unique(x)
    points = [(float(v), float(np.median(y[x == v]))) for v in xs]
    if len(points) > TABLE_POINTS:
        keep = np.unique(np.round(np.linspace(0, len(points) - 1, TABLE_POINTS)).astype(int))
        points = [points[k] for k in keep]
    return points
