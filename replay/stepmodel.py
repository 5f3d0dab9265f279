"""Roofline step model: how long one engine step takes, in integer microseconds.

`step_time_us = max(FLOPs / (peak_flops * mfu), bytes / (hbm_bw * mbu)) + tp_allreduce
               + per_step_overhead + per_seq_overhead * seqs
               + prefill_overhead (steps that compute prompt tokens)`   (DESIGN.md, "The step model").
Everything is per GPU: a TP replica's GPUs run the same step in lock-step.
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
LINK_BYTES_RATE = 7  # interconnect bytes/s per GPU, one direction
ALLREDUCE_FIXED_US = 8  # latency of the step's all-reduces (2 per layer), 0 when tp == 1
STEP_OVERHEAD_US = 9  # scheduler, sampling, launch: never zero
SEQ_OVERHEAD_US = 10  # per sequence in the batch (input prep, detokenise)
# Extra fixed cost of a step that computes prompt tokens: engines that capture CUDA graphs for
# decode only run prefill eagerly (kernel launches, attention metadata); calibration measures it.
PREFILL_OVERHEAD_US = 11
NUM_PARAMS = 12

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


@dataclass(frozen=True)
class StepShape:
    """What the step model needs to know about a model on a GPU at a TP degree (all per GPU)."""

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


def step_params(
    shape: StepShape,
    *,
    mfu: float | None = None,
    mbu: float | None = None,
    per_step_overhead_us: float | None = None,
    per_seq_overhead_us: float | None = None,
    allreduce_latency_us: float | None = None,
    prefill_overhead_us: float | None = None,
) -> np.ndarray:
    """The parameter vector of `step_time_us_nb` for one pool."""
    tp = shape.tp
    p = np.zeros(NUM_PARAMS, dtype=np.float64)
    p[FLOPS_PER_TOKEN] = 2.0 * shape.active_params / tp
    p[ATTN_FLOPS_PER_PAIR] = 4.0 * shape.num_layers * shape.num_attention_heads * shape.head_dim / tp
    p[WEIGHT_BYTES] = shape.weights_bytes_per_gpu
    p[KV_BYTES_PER_TOKEN] = shape.kv_bytes_per_token_per_gpu
    p[FLOPS_RATE] = shape.peak_flops * (DEFAULT_MFU if mfu is None else mfu)
    p[BYTES_RATE] = shape.hbm_bytes_per_s * (DEFAULT_MBU if mbu is None else mbu)
    if tp > 1:
        # Two all-reduces of the hidden state per layer (after attention and after the MLP);
        # a ring all-reduce moves 2 (tp - 1) / tp of the buffer through each GPU's link.
        per_token = 2 * shape.num_layers * shape.hidden_size * shape.activation_bytes
        p[ALLREDUCE_BYTES_PER_TOKEN] = per_token * 2.0 * (tp - 1) / tp
        latency = DEFAULT_ALLREDUCE_LATENCY_US if allreduce_latency_us is None else allreduce_latency_us
        p[ALLREDUCE_FIXED_US] = 2 * shape.num_layers * latency
    p[LINK_BYTES_RATE] = max(shape.link_bytes_per_s, 1.0)
    p[STEP_OVERHEAD_US] = DEFAULT_STEP_OVERHEAD_US if per_step_overhead_us is None else per_step_overhead_us
    p[SEQ_OVERHEAD_US] = DEFAULT_SEQ_OVERHEAD_US if per_seq_overhead_us is None else per_seq_overhead_us
    p[PREFILL_OVERHEAD_US] = DEFAULT_PREFILL_OVERHEAD_US if prefill_overhead_us is None else prefill_overhead_us
    return p


@njit(cache=True, _nrt=False)
def step_time_us_nb(p, prefill_tokens, prefill_attn_pairs, prefill_ctx_tokens, decode_seqs, decode_ctx_tokens,
                    num_seqs):
    """Duration of one step, in whole microseconds (at least 1).

    prefill_tokens: new prompt tokens computed this step (chunks included);
    prefill_attn_pairs: sum over prefill chunks of (query, key) pairs, ~ chunk * (context + chunk / 2);
    prefill_ctx_tokens: tokens of KV the prefill chunks read (cached prefix, earlier chunks);
    decode_seqs: sequences decoding one token; decode_ctx_tokens: their total context length;
    num_seqs: sequences in the batch.
    """
    tokens = prefill_tokens + decode_seqs
    flops = p[FLOPS_PER_TOKEN] * tokens + p[ATTN_FLOPS_PER_PAIR] * (prefill_attn_pairs + decode_ctx_tokens)
    nbytes = p[WEIGHT_BYTES] + p[KV_BYTES_PER_TOKEN] * (decode_ctx_tokens + prefill_ctx_tokens + tokens)
    compute_us = flops / p[FLOPS_RATE] * 1e6
    memory_us = nbytes / p[BYTES_RATE] * 1e6
    comm_us = p[ALLREDUCE_BYTES_PER_TOKEN] * tokens / p[LINK_BYTES_RATE] * 1e6 + p[ALLREDUCE_FIXED_US]
    total = max(compute_us, memory_us) + comm_us + p[STEP_OVERHEAD_US] + p[SEQ_OVERHEAD_US] * num_seqs
    if prefill_tokens > 0:
        total += p[PREFILL_OVERHEAD_US]
    return max(np.int64(1), np.int64(math.ceil(total)))
