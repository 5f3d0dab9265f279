"""GPU memory arithmetic: KV bytes per token, weight bytes, and the KV block count vLLM would allocate.

All sizes are bytes (ints) per GPU unless a name says otherwise; "GB" in messages is 1e9 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from common.errors import ConfigError
from replay.model.specs import (
    GpuSpec, ModelSpec, get_gpu, get_model, kv_dtype_bytes, normalize_weight_dtype, weight_bits,
)

GiB = 1 << 30
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)

# Activations are BF16 whatever the weight dtype (FP8 / 4-bit kernels dequantize or quantize on the fly).
ACTIVATION_BYTES = 2
# vLLM's profile run ends with a dummy sampler pass over min(max_num_seqs, max_num_batched_tokens)
# rows of full-vocabulary logits. Its torch peak is ~40 bytes per logit: public vLLM v0.11 logs on
# H100 ("torch peak memory increase") show 4.8 GiB for Llama vocab (128,256), 5.6 GiB for Qwen3
# (151,936) and 7.4 GiB for gpt-oss (201,088) at 1024 rows, the same at TP1 and TP2 - the logits
# are gathered to every rank, and this term, not the layer activations, sets the peak. At 256 rows
# it gives 1.29 GiB for Llama-3-8B at 8192 tokens, where vLLM logged "PyTorch activation peak
# memory 1.26GiB" (vllm-project/vllm PR #10511). The pass is `GPUModelRunner._dummy_sampler_run`
# (vllm/v1/worker/gpu_model_runner.py): fp32 logits, then top-k/top-p's sort (values, int64
# indices and the sort's scratch), masks, softmax and the scattered result live together.
SAMPLER_BYTES_PER_LOGIT = 40
# What vLLM V1 (v0.15) subtracts besides weights and the profile's torch peak: `memory_profiling`
# (vllm/utils/mem_utils.py) charges `non_torch_increase`, the device memory outside torch's
# allocator that grew from the snapshot `Worker.init_device` (vllm/v1/worker/gpu_worker.py) takes
# - after the CUDA context and the NCCL communicators exist, so neither is charged: they live in
# the (1 - utilization) headroom - to the end of the profile run. Two terms, fitted to the three
# KV sizes vLLM v0.15.1 logged on H100 (../shared/measurements/vllm-s2r/experiments.csv,
# num_gpu_blocks: Llama-2-7B TP1 7,463; CodeLlama-34B TP2 26,603; Llama-2-70B TP4 31,357):
# kernels loaded on first use during loading and profiling (CUDA lazy module loading), at any TP:
# 0.25 GiB puts the TP1 row within 0.05% (vLLM's own logs show 0.16 GiB for an 11B model in
# PR #12126).
NON_TORCH_BYTES = GiB // 4
# NCCL's buffers, connected at the first collective of the profile run (lazy connection since
# NCCL 2.22), when TP > 1. 0.45 GiB alone reproduces the TP2 and TP4 rows within 0.05%; 0.75 GiB
# is what also keeps the reference lesson's 80 GB replica (max_num_seqs 256, a 128K vocabulary:
# a sampler-bound profile the rows do not probe) within 5%: at 0.45 it reads 5.6% high. Both rows
# then read 0.7% low, well inside their 3%.
TP_COMM_BYTES = 3 * GiB // 4
# CUDA graphs are not charged: v0.15 estimates their pool (`profile_cudagraph_memory`, PR #30515)
# but subtracts it only under VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, off by default until
# v0.21 (vllm-project/vllm issue #45178); the graphs, captured after the KV cache is allocated,
# take their 0.4-1 GiB from the headroom too.


def _model(model: ModelSpec | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else get_model(model)


def _gpu(gpu: GpuSpec | str) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}: got {value!r}, expected a positive integer")
    return value


def _nonnegative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: got {value!r}, expected a whole number >= 0")
    return value


def check_tensor_parallel(model: ModelSpec, tp: int) -> int:
    """`tp` as vLLM accepts it: divides the attention heads; KV heads split evenly or are replicated."""
    tp = _positive_int("tensor_parallel_size", tp)
    if model.num_attention_heads % tp:
        raise ConfigError(
            f"tensor_parallel_size: got {tp}, expected a divisor of {model.id}'s "
            f"{model.num_attention_heads} attention heads"
        )
    if not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ConfigError(
            f"tensor_parallel_size: got {tp}; {model.id}'s {model.num_kv_heads} KV heads must split "
            "evenly across it or it must be a multiple of them"
        )
    return tp


def kv_bytes_per_token(model: ModelSpec | str, kv_cache_dtype: str = "auto") -> int:
    """KV bytes one token holds over the whole model: 2 x layers x kv_heads x head_dim x bytes; MLA once."""
    model = _model(model)
    return model.kv_elements_per_token * kv_dtype_bytes(kv_cache_dtype, model)


def kv_heads_per_gpu(model: ModelSpec | str, tp: int) -> int:
    """KV heads each GPU stores: kv_heads / tp, at least 1 (vLLM replicates when tp > kv_heads).

    MLA's latent is not split by head: every rank keeps all of it (1 "head").
    """
    model = _model(model)
    tp = check_tensor_parallel(model, tp)
    return 1 if model.is_mla else max(1, model.num_kv_heads // tp)


def kv_bytes_per_token_per_gpu(model: ModelSpec | str, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV bytes one token holds on each GPU of a TP group."""
    model = _model(model)
    if model.is_mla:
        check_tensor_parallel(model, tp)
        return kv_bytes_per_token(model, kv_cache_dtype)
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes(kv_cache_dtype, model)


def weights_bytes(model: ModelSpec | str, weight_dtype: str | None = None) -> int:
    """Bytes of all weights. None: the checkpoint's own dtypes (gpt-oss: MXFP4 experts, BF16 rest).

    A given `weight_dtype` applies to every layer, experts included; embeddings and lm_head stay
    16-bit under sub-16-bit formats, as quantized checkpoints keep them, and so does a vision
    tower. The checkpoint's own format also keeps the layers its quantization ignore list names
    16-bit (`unquantized_params`).
    """
    model = _model(model)
    dtype = normalize_weight_dtype(weight_dtype or model.default_weight_dtype)
    expert_dtype = model.expert_weight_dtype if weight_dtype is None and model.expert_weight_dtype else dtype
    bits = weight_bits(dtype)
    wide_bits = max(bits, 16.0)
    wide = model.embedding_params + model.vision_params + (model.unquantized_params if weight_dtype is None else 0.0)
    other_dense = model.dense_params - wide
    total_bits = wide * wide_bits + other_dense * bits + model.expert_params * weight_bits(expert_dtype)
    return math.ceil(total_bits / 8)


def weights_bytes_per_gpu(model: ModelSpec | str, tp: int, weight_dtype: str | None = None) -> int:
    """Weight bytes per GPU under tensor parallelism: an even 1/tp share.

    vLLM shards attention, MLP and experts by TP rank and also the embedding and lm_head
    (VocabParallelEmbedding / ParallelLMHead); only norms (and MLA's small down-projections) are
    replicated, well under 0.1% of the weights.
    """
    model = _model(model)
    tp = check_tensor_parallel(model, tp)
    return math.ceil(weights_bytes(model, weight_dtype) / tp)


def idle_weights_bytes_per_gpu(model: ModelSpec | str, tp: int) -> float:
    """Loaded weight bytes per GPU that a text step does not stream: a vision tower (16-bit).

    The input embedding is a lookup of the step's rows, not a read of the table, yet it stays
    counted as read: without it the real servers fit worse (leave-one-model-out ITL 8.7% against
    8.3%, `validate published` E2E 8.9% against 8.0%), so some per-step cost that grows with
    vocabulary x hidden size (the sampler's passes over the logits?) is not modelled, and the
    table's bytes stand in for it until it is.
    """
    return _model(model).vision_params * 2.0 / tp


def activation_peak_bytes(model: ModelSpec | str, tp: int, max_num_batched_tokens: int = 8192,
                          max_num_seqs: int = 256) -> int:
    """Torch peak of vLLM's profile run on one GPU: max(the largest layer's live tensors, sampler).

    The dummy forward pass runs `max_num_batched_tokens` tokens; inside a layer the live tensors
    are the residual stream and the normed input (hidden each, not split by TP) plus the MLP's
    gate/up output and activation (3 x intermediate / tp), or for MoE the fused-MoE caches of each
    token's top-k experts (k x (3 x expert_intermediate / tp + hidden)). The sampler pass then
    holds the hidden states plus full-vocabulary logits for min(max_num_seqs, tokens) rows.
    """
    model = _model(model)
    tp = check_tensor_parallel(model, tp)
    tokens = _positive_int("max_num_batched_tokens", max_num_batched_tokens)
    seqs = _positive_int("max_num_seqs", max_num_seqs)
    hidden = model.hidden_size
    q_kv_width = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    per_token = 2 * hidden + max(q_kv_width, 3 * model.intermediate_size // tp)
    if model.is_moe:
        moe = model.experts_per_token * (3 * model.moe_intermediate_size // tp + hidden)
        per_token = max(per_token, 2 * hidden + moe)
    forward = tokens * per_token * ACTIVATION_BYTES
    sampler = tokens * hidden * ACTIVATION_BYTES + min(seqs, tokens) * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return max(forward, sampler)


def overhead_bytes(tp: int) -> int:
    """Non-torch memory vLLM V1 charges per GPU: lazily loaded kernels, plus NCCL buffers at TP > 1.

    0.25 GiB at TP1 (0.27 GB), 1 GiB (1.07 GB) above; see NON_TORCH_BYTES and TP_COMM_BYTES.
    """
    tp = _positive_int("tensor_parallel_size", tp)
    return NON_TORCH_BYTES + (TP_COMM_BYTES if tp > 1 else 0)


@dataclass(frozen=True)
class Capacity:
    """The KV cache one replica gets: every memory term per GPU, and the resulting block count.

    `kv_blocks` is per GPU and equally the replica's (TP splits each block's heads, not its tokens);
    `kv_tokens = kv_blocks * block_size`.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    weight_dtype: str
    expert_weight_dtype: str | None
    kv_cache_dtype: str
    gpu_memory_utilization: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_gpu_blocks_override: int | None
    hbm_bytes: int
    # the memory the KV cache was sized from: the GPU's CUDA-reported total, or the pool's
    # `gpu_memory_bytes` (`gpu_memory_source` says which: "cuda" or "override")
    gpu_memory_bytes: int
    gpu_memory_source: str
    usable_bytes_per_gpu: int
    weights_bytes_per_gpu: int
    activation_peak_bytes: int
    overhead_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    available_kv_bytes_per_gpu: int
    block_bytes_per_gpu: int
    kv_blocks: int
    kv_tokens: int
    # Speculative decoding's draft weights and vLLM's LoRA buffers (max_loras adapters at
    # max_lora_rank), per GPU; the draft model's KV per token per GPU shares each block.
    extra_weights_bytes_per_gpu: int = 0
    extra_kv_bytes_per_token_per_gpu: int = 0

    @property
    def num_gpus(self) -> int:
        return self.tp

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-safe dict; `model` and `gpu` become their catalog ids."""
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["model"] = self.model.id
        out["gpu"] = self.gpu.id
        return out


def _check_sizes(util: float, block_size: int, num_gpu_blocks_override: int | None,
                 max_model_len: int | None) -> None:
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
        raise ConfigError(f"gpu_memory_utilization: got {util!r}, expected a value in (0, 1]")
    if isinstance(block_size, bool) or block_size not in BLOCK_SIZES:
        raise ConfigError(f"block_size: got {block_size!r}, expected one of {', '.join(map(str, BLOCK_SIZES))}")
    if num_gpu_blocks_override is not None:
        _positive_int("num_gpu_blocks_override", num_gpu_blocks_override)
    if max_model_len is not None:
        _positive_int("max_model_len", max_model_len)


def _shortfall(util: float, total: float, usable: int, available: int, weights: int, extra: int, activation: int,
               overhead: int, block_bytes: int, larger_tp: int | None) -> str:
    """What does not fit, by how much, and what to try: the tail of kv_capacity's error."""
    hint = (f"try tensor_parallel_size >= {larger_tp} or a smaller weight dtype" if larger_tp
            else "try a smaller weight dtype or a GPU with more memory")
    drafts = f" + {_gb(extra)} of draft model / LoRA buffers" if extra else ""
    terms = f"{_gb(weights)} of weights{drafts} + {_gb(activation)} activations + {_gb(overhead)} overhead per GPU"
    room = f"{_gb(usable)} usable ({util:g} x {total / 1e9:.4g} GB)"
    relation = (f"{terms} > {room}" if available < 0
                else f"{terms} leave {_gb(available)} of {room}, less than one KV block")
    return f"{relation}: short by {_gb(block_bytes - available)}; {hint}"


def kv_capacity(
    model: ModelSpec | str,
    gpu: GpuSpec | str,
    tp: int,
    *,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    weight_dtype: str | None = None,
    num_gpu_blocks_override: int | None = None,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    max_model_len: int | None = None,
    extra_weights_bytes_per_gpu: int = 0,
    extra_kv_bytes_per_token_per_gpu: int = 0,
    gpu_memory_bytes: float | None = None,
) -> Capacity:
    """KV blocks per GPU as vLLM V1 sizes them at startup.

    `num_blocks = (total * utilization - weights - activation_peak - overhead) // (block_size *
    kv_bytes_per_token_per_gpu)`, as vLLM v0.15 does: `Worker.init_device` requests `total *
    gpu_memory_utilization` of the CUDA-reported total (vllm/v1/worker/gpu_worker.py),
    `Worker.determine_available_memory` subtracts `memory_profiling`'s non-KV memory (weights,
    the profile run's torch peak, the non-torch increase; vllm/utils/mem_utils.py), and
    `get_kv_cache_config` (vllm/v1/core/kv_cache_utils.py) divides; the per-layer floor there
    gives the same integer. The activation peak models `GPUModelRunner.profile_run`'s forward of
    max_num_batched_tokens and its `_dummy_sampler_run` (`activation_peak_bytes`); the overhead is
    the non-torch increase, 0.25 GiB at TP1 and 1 GiB at TP > 1 (`overhead_bytes`). `total` is
    `gpu.cuda_total_bytes` unless `gpu_memory_bytes` overrides it (a pool's key of that name).
    `num_gpu_blocks_override` replaces the block count (a measured one is the accurate choice), but
    the weights must still fit. `extra_weights_bytes_per_gpu` (a draft model, LoRA buffers) is
    held like the weights; `extra_kv_bytes_per_token_per_gpu` (a draft model's KV, which vLLM keeps
    in the same blocks) widens every block. `max_model_len`, when given, must fit in the cache, as vLLM
    requires at startup. A model that does not fit raises ConfigError saying by how much.

    `model` and `gpu` are specs or catalog ids. `max_num_seqs` sizes the profile's sampler pass;
    256 is EngineArgs' default here and vLLM's below 70 GiB, while `vllm serve` on H100-class GPUs
    defaults to 1024, which adds ~4 GB of sampler peak for a 128K vocabulary.

    Checks: the three KV sizes vLLM v0.15.1 logged on H100 (tests/unit/test_memory_vllm.py) within
    0.8%; the reference lesson (../shared/reference/003_*.txt), llama-3.1-70b bf16 TP4 at 0.9 with
    `gpu_memory_bytes` 80e9 (its "80 GB"), gives 26,093 blocks = 417,488 tokens, 4.6% above its
    399,169.
    """
    model, gpu = _model(model), _gpu(gpu)
    tp = check_tensor_parallel(model, tp)
    util = gpu_memory_utilization
    _check_sizes(util, block_size, num_gpu_blocks_override, max_model_len)
    dtype, expert_dtype = _weight_dtypes(model, weight_dtype)

    total, source = gpu_memory_total(gpu, gpu_memory_bytes)
    usable = math.floor(total * util)
    weights = weights_bytes_per_gpu(model, tp, weight_dtype)
    extra = _nonnegative_int("extra_weights_bytes_per_gpu", extra_weights_bytes_per_gpu)
    _nonnegative_int("extra_kv_bytes_per_token_per_gpu", extra_kv_bytes_per_token_per_gpu)
    activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    overhead = overhead_bytes(tp)
    per_token_gpu = kv_bytes_per_token_per_gpu(model, tp, kv_cache_dtype)
    block_bytes = block_size * (per_token_gpu + extra_kv_bytes_per_token_per_gpu)
    available = usable - weights - extra - activation - overhead
    if available < block_bytes:
        larger_tp = _smallest_tp_that_fits(model, usable, block_bytes, tp, weight_dtype, max_num_batched_tokens,
                                           max_num_seqs)
        raise ConfigError(_does_not_fit(model, gpu, tp, dtype, expert_dtype) + _shortfall(
            util, total, usable, available, weights, extra, activation, overhead, block_bytes, larger_tp))
    blocks = available // block_bytes if num_gpu_blocks_override is None else num_gpu_blocks_override
    _check_model_len_fits(model, gpu, tp, blocks * block_size, max_model_len)
    return Capacity(
        model=model, gpu=gpu, tp=tp, weight_dtype=dtype, expert_weight_dtype=expert_dtype,
        kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=float(util), block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        num_gpu_blocks_override=num_gpu_blocks_override, hbm_bytes=gpu.hbm_bytes, gpu_memory_bytes=total,
        gpu_memory_source=source, usable_bytes_per_gpu=usable,
        weights_bytes_per_gpu=weights, activation_peak_bytes=activation, overhead_bytes=overhead,
        kv_bytes_per_token=kv_bytes_per_token(model, kv_cache_dtype), kv_bytes_per_token_per_gpu=per_token_gpu,
        available_kv_bytes_per_gpu=available, block_bytes_per_gpu=block_bytes, kv_blocks=blocks,
        kv_tokens=blocks * block_size, extra_weights_bytes_per_gpu=extra_weights_bytes_per_gpu,
        extra_kv_bytes_per_token_per_gpu=extra_kv_bytes_per_token_per_gpu,
    )


def _weight_dtypes(model: ModelSpec, weight_dtype: str | None) -> tuple[str, str | None]:
    """The weights' dtype and a MoE model's experts' (None for a dense model): the experts keep
    their own (a checkpoint's) unless weight_dtype sets all."""
    dtype = normalize_weight_dtype(weight_dtype or model.default_weight_dtype)
    if not model.is_moe:
        return dtype, None
    return dtype, (model.expert_weight_dtype or dtype) if weight_dtype is None else dtype


def _does_not_fit(model: ModelSpec, gpu: GpuSpec, tp: int, dtype: str, expert_dtype: str | None) -> str:
    what = dtype if expert_dtype in (None, dtype) else f"{dtype} with {expert_dtype} experts"
    return f"{model.id} in {what} does not fit on {gpu.id} at tensor_parallel_size {tp}: "


def _check_model_len_fits(model: ModelSpec, gpu: GpuSpec, tp: int, kv_tokens: int, max_model_len: int | None) -> None:
    """vLLM refuses to start when one request of max_model_len cannot fit in the KV cache."""
    if max_model_len is not None and kv_tokens < max_model_len:
        raise ConfigError(
            f"max_model_len: {model.id} on {tp} x {gpu.id} holds {kv_tokens:,} KV tokens, fewer "
            f"than max_model_len {max_model_len:,}; one such request cannot fit (vLLM refuses to start): "
            "lower max_model_len, use fp8 KV cache or a larger tensor_parallel_size"
        )


# A GPU's memory as `gpu_memory_bytes` accepts it: 1 GB to 10 TB (common/bounds.py holds the same).
GPU_MEMORY_MIN, GPU_MEMORY_MAX = 1e9, 1e13


def gpu_memory_total(gpu: GpuSpec, gpu_memory_bytes: float | None = None) -> tuple[int, str]:
    """The per-GPU memory KV capacity is sized from, and where it comes from: the CUDA-reported
    total of `gpu` ("cuda"), or `gpu_memory_bytes` ("override"; 80e9 is read as 80,000,000,000)."""
    if gpu_memory_bytes is None:
        return gpu.cuda_total_bytes, "cuda"
    value = gpu_memory_bytes
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not GPU_MEMORY_MIN <= value <= GPU_MEMORY_MAX:
        raise ConfigError(f"gpu_memory_bytes: got {value!r}, expected bytes of memory per GPU, from 1e9 to 1e13 "
                          "(80e9 for an '80 GB' card)")
    return int(value), "override"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _smallest_tp_that_fits(model: ModelSpec, usable: int, block_bytes: int, tp: int, weight_dtype: str | None,
                           max_num_batched_tokens: int, max_num_seqs: int) -> int | None:
    """The smallest power-of-two TP above `tp` (up to 64) that leaves room for a KV block, if any."""
    candidate = 2 * tp
    while candidate <= 64:
        try:
            check_tensor_parallel(model, candidate)
        except ConfigError:
            candidate *= 2
            continue
        left = (usable - weights_bytes_per_gpu(model, candidate, weight_dtype) - overhead_bytes(candidate)
                - activation_peak_bytes(model, candidate, max_num_batched_tokens, max_num_seqs))
        if left >= block_bytes:
            return candidate
        candidate *= 2
    return None


def max_concurrency(cap: Capacity, tokens_per_request: int) -> int:
    """How many requests of `tokens_per_request` tokens (prompt + output) the cache holds at once."""
    tokens = _positive_int("tokens_per_request", tokens_per_request)
    return cap.kv_blocks // -(-tokens // cap.block_size)
