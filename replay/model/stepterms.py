"""The step model's terms beyond a dense BF16 model: weight precision, MoE experts and expert
parallelism, speculative decoding, multi-LoRA, and the prefill/decode break-even bandwidth.

Each function is the arithmetic of ../shared/reference/000_*.txt (sections 02, 04, 05, 07) or of
the upstream system named beside it; `pool_terms` turns a pool's engine arguments into what
`stepmodel.step_params`, `memory.kv_capacity` and the engines take. Bytes, FLOPs, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.errors import ConfigError
from replay.engine.common import SPEC_CREDIT_SCALE
from replay.model.memory import idle_weights_bytes_per_gpu, kv_bytes_per_token_per_gpu, weights_bytes
from replay.model.specs import QUANTIZATION_DTYPES, GpuSpec, ModelSpec, get_model, normalize_weight_dtype, weight_bits
from replay.model.stepmodel import DraftShape, ExpertParallel, StepShape

LORA_DTYPE_BYTES = 2  # adapters are BF16 / FP16 whatever the base's precision (vLLM LoRA buffers)


# --- weight precision --------------------------------------------------------------------------


def effective_weight_dtype(quantization: str | None, weight_dtype: str | None, where: str) -> str | None:
    """The weight format a pool loads: vLLM's `quantization` method, else `weight_dtype`, else
    None (the checkpoint's own). Both set and different is a config error naming the key."""
    if quantization is None:
        return weight_dtype
    dtype = QUANTIZATION_DTYPES[quantization]
    if weight_dtype is not None and normalize_weight_dtype(weight_dtype) != dtype:
        raise ConfigError(f"{where}.engine.quantization: {quantization!r} loads {dtype} weights but weight_dtype "
                          f"is {weight_dtype!r}; set one of them")
    return dtype


# --- MoE -----------------------------------------------------------------------------------------


def expected_experts_touched(tokens: float, num_experts: int, top_k: int) -> float:
    """Distinct experts a batch of `tokens` tokens activates per MoE layer under uniform top-k
    routing: E (1 - (1 - k/E)^T). One token reads k experts; a big batch reads them all."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def all_to_all_us(tokens: int, top_k: int, hidden: int, dispatch_bytes_per_s: float, combine_bytes_per_s: float,
                  dispatch_bytes: int = 1, combine_bytes: int = 2) -> tuple[float, float, float]:
    """One MoE layer's dispatch and combine all-to-all (ref 000 section 07, DeepEP's layout):
    (dispatch bytes, combine bytes, microseconds). Each token's hidden state goes to its k
    experts in FP8 and comes back in BF16."""
    dispatch = tokens * top_k * hidden * dispatch_bytes
    combine = tokens * top_k * hidden * combine_bytes
    return dispatch, combine, (dispatch / dispatch_bytes_per_s + combine / combine_bytes_per_s) * 1e6


# --- speculative decoding ------------------------------------------------------------------------


def spec_expected_tokens(acceptance_rate: float, drafts: int) -> float:
    """Tokens one verify step yields: accepted drafts (each accepted with probability a, stopping
    at the first rejection) plus the target's own token: (1 - a^(k+1)) / (1 - a) (Leviathan et
    al. 2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1)."""
    a = acceptance_rate
    return float(drafts + 1) if a >= 1.0 else (1.0 - a ** (drafts + 1)) / (1.0 - a)


def spec_credit_table(acceptance_rate: float | None, k: int) -> np.ndarray:
    """int64[k + 1]: expected tokens of a verify step with d = 0..k drafts, in SPEC_CREDIT_SCALE
    units (d = 0 is a plain decode step: exactly one token)."""
    if k == 0 or acceptance_rate is None:
        return np.array([SPEC_CREDIT_SCALE], np.int64)
    return np.array([round(spec_expected_tokens(acceptance_rate, d) * SPEC_CREDIT_SCALE) for d in range(k + 1)],
                    np.int64)


def _one_layer_head(target: ModelSpec, method: str) -> tuple[float, float]:
    """(parameters a pass reads, parameters it adds to GPU memory) of an EAGLE / MTP head: one
    decoder layer of the target (what a token touches in it), the fc that fuses the target's
    hidden states (2 hidden for EAGLE and MTP, 3 for EAGLE-3), and the shared lm_head (read per
    pass, not stored again). EAGLE: Li et al. 2024; MTP: DeepSeek-V3 report, section 2.2."""
    h = target.hidden_size
    layer = (target.active_params - target.embedding_params) / target.num_layers
    stored_layer = (target.total_params - target.embedding_params) / target.num_layers
    fc = (3 if method == "eagle3" else 2) * h * h
    lm_head = target.vocab_size * h
    return layer + fc + lm_head, stored_layer + fc


@dataclass(frozen=True)
class PoolTerms:
    """What a pool's engine arguments add to the step model, the memory fit and the engines."""

    expert_parallel: ExpertParallel | None = None
    draft: DraftShape | None = None
    spec_k: int = 0  # drafts per step (0: no speculative decoding)
    spec_credit: np.ndarray = None  # type: ignore[assignment]  # int64[spec_k + 1]
    lora_slots: int = 0  # max_loras when enable_lora (0: off)
    lora_bytes_per_adapter: float = 0.0  # per GPU
    lora_flops_per_token: float = 0.0  # per GPU
    lora_load_us: int = 0  # one adapter over the host link, on a miss
    extra_weights_bytes_per_gpu: int = 0
    extra_kv_bytes_per_token_per_gpu: int = 0

    def __post_init__(self) -> None:
        if self.spec_credit is None:
            object.__setattr__(self, "spec_credit", spec_credit_table(None, 0))


def _draft(spec, target: ModelSpec, tp: int, kv_cache_dtype: str, where: str) -> tuple[DraftShape, int, int]:
    """(the draft pass, its weights per GPU, its KV bytes per token per GPU)."""
    k = spec.num_speculative_tokens
    method = spec.proposer
    if method == "ngram":  # prompt lookup on the CPU: no GPU pass, no memory
        return DraftShape(0, 0.0, 0.0, 0.0), 0, 0
    if method == "draft_model":
        try:
            draft = get_model(spec.model)
        except ConfigError as exc:
            raise ConfigError(f"{where}.engine.speculative_config.model: {exc}") from None
        dtp = spec.draft_tensor_parallel_size or tp
        if dtp not in (1, tp):  # as vLLM's SpeculativeConfig requires
            raise ConfigError(f"{where}.engine.speculative_config.draft_tensor_parallel_size: got {dtp}, expected 1 "
                              f"or the target's tensor_parallel_size {tp}")
        try:
            kv = kv_bytes_per_token_per_gpu(draft, dtp, kv_cache_dtype)
        except ConfigError as exc:
            raise ConfigError(f"{where}.engine.speculative_config: {exc}") from None
        weights = math.ceil(weights_bytes(draft) / dtp)
        read = weights - idle_weights_bytes_per_gpu(draft, dtp)
        return DraftShape(k, 2.0 * draft.active_params / dtp, read, float(kv)), weights, kv
    read, stored = _one_layer_head(target, method)
    kv = math.ceil(kv_bytes_per_token_per_gpu(target, tp, kv_cache_dtype) / target.num_layers)
    weights = math.ceil(stored * 2 / tp)  # the head ships in BF16
    return DraftShape(k, 2.0 * read / tp, read * 2 / tp, float(kv)), weights, kv


def pool_terms(model: ModelSpec, gpu: GpuSpec, tp: int, engine, step_model, host_link_bytes_per_s: float,
               where: str) -> PoolTerms:
    """The terms of one pool: `engine` is its EngineArgs, `step_model` its StepModelArgs."""
    ep = None
    if engine.enable_expert_parallel:
        if not model.is_moe:
            raise ConfigError(f"{where}.engine.enable_expert_parallel: {model.id} has no experts")
        bw = step_model.all_to_all_bytes_per_s or gpu.interconnect_bytes_per_s
        ep = ExpertParallel(all_to_all_bytes_per_s=bw, load_imbalance=step_model.moe_load_imbalance)
    elif step_model.moe_load_imbalance != 1.0:
        raise ConfigError(f"{where}.step_model.moe_load_imbalance: applies under engine.enable_expert_parallel only "
                          "(under tensor parallelism every GPU computes a slice of every expert)")
    draft, spec_k, credit, extra_w, extra_kv = None, 0, None, 0, 0
    spec = engine.speculative_config
    if spec is not None:
        draft, extra_w, extra_kv = _draft(spec, model, tp, engine.kv_cache_dtype, where)
        spec_k = spec.num_speculative_tokens
        credit = spec_credit_table(spec.acceptance_rate, spec_k)
    lora = {}
    if engine.enable_lora:
        params = lora_adapter_params(model, engine.max_lora_rank)
        per_gpu = params * LORA_DTYPE_BYTES / tp
        # vLLM preallocates max_loras slots of max_lora_rank for every adapted layer.
        extra_w += math.ceil(engine.max_loras * per_gpu)
        lora = {"lora_slots": engine.max_loras, "lora_bytes_per_adapter": per_gpu,
                "lora_flops_per_token": 2.0 * params / tp,
                "lora_load_us": math.ceil(per_gpu / host_link_bytes_per_s * 1e6)}
    return PoolTerms(expert_parallel=ep, draft=draft, spec_k=spec_k, spec_credit=credit,
                     extra_weights_bytes_per_gpu=extra_w, extra_kv_bytes_per_token_per_gpu=extra_kv, **lora)


def step_shape(model: ModelSpec, gpu: GpuSpec, cap) -> StepShape:
    """The step model's view of a pool from its `memory.Capacity`: weights and KV per GPU in the
    loaded formats; the matmuls run at the peak vLLM's kernel for the format reaches on this GPU
    (`GpuSpec.matmul_flops`: FP8 tensor cores where the GPU has them, H100 2x BF16, ref 000
    section 05; an A100 runs FP8 weight-only through Marlin, so reads 8-bit weights and computes at
    the BF16 peak; INT8 W8A8 on INT8 tensor cores; weight-only formats at the BF16 peak)."""
    tp = cap.tp
    return StepShape(
        active_params=model.active_params,
        num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        head_dim=model.head_dim,
        hidden_size=model.hidden_size,
        tp=tp,
        # What a step reads: less the input embedding (a lookup) and a vision tower, which cap counts.
        weights_bytes_per_gpu=float(cap.weights_bytes_per_gpu) - idle_weights_bytes_per_gpu(model, tp),
        kv_bytes_per_token_per_gpu=float(cap.kv_bytes_per_token_per_gpu),
        peak_flops=gpu.matmul_flops(cap.weight_dtype),
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        link_bytes_per_s=gpu.interconnect_bytes_per_s,
        expert_weights_bytes_per_gpu=(model.expert_params * weight_bits(cap.expert_weight_dtype) / 8 / tp
                                      if model.is_moe else 0.0),
        expert_active_params=model.expert_active_params,
        num_experts=model.num_experts,
        experts_per_token=model.experts_per_token,
        moe_layers=model.moe_layers,
    )


# --- multi-LoRA ----------------------------------------------------------------------------------


def lora_target_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(d_out, d_in) of the matrices an adapter adapts in each layer: q, k, v, o (the reference's
    choice and PEFT's usual target_modules for Llama)."""
    h, q = model.hidden_size, model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    return [(q, h), (kv, h), (kv, h), (h, q)]


def lora_adapter_params(model: ModelSpec, rank: int) -> int:
    """r (d_in + d_out) per adapted matrix (A is r x d_in, B is d_out x r), over every layer."""
    return sum(rank * (d_in + d_out) for d_out, d_in in lora_target_shapes(model)) * model.num_layers


# --- prefill/decode disaggregation -------------------------------------------------------------


def break_even_bytes_per_s(kv_bytes_per_token: float, flops_per_s: float, active_params: float) -> float:
    """The link speed at which shipping a prompt's KV costs as long as computing it:
    W* = kv_bytes_per_token x F / (2 P) (ref 000 section 02; the prompt length cancels)."""
    return kv_bytes_per_token * flops_per_s / (2.0 * active_params)


def transfer_share(kv_bytes_per_token: float, flops_per_s: float, active_params: float, link_bytes_per_s: float) -> float:
    """The KV transfer's time as a share of the prefill that made it: W* / W."""
    return break_even_bytes_per_s(kv_bytes_per_token, flops_per_s, active_params) / link_bytes_per_s


def break_even_rows(models: list[ModelSpec], flops_per_s: float, links: dict[str, float],
                    kv_cache_dtypes: tuple[str, ...] = ("auto", "fp8")) -> list[dict[str, object]]:
    """One row per model and KV dtype: KV bytes per token, W* and the transfer's share of the
    prefill over each link (`llm-replay capacity --break-even`; the table of ref 000 section 02)."""
    from replay.model.memory import kv_bytes_per_token

    rows = []
    for model in models:
        for dtype in kv_cache_dtypes:
            kv = kv_bytes_per_token(model, dtype)
            rows.append({
                "model": model.id, "kv_cache_dtype": dtype, "kv_bytes_per_token": kv,
                "active_params": model.active_params, "flops_per_s": flops_per_s,
                "break_even_bytes_per_s": break_even_bytes_per_s(kv, flops_per_s, model.active_params),
                "transfer_share": {name: transfer_share(kv, flops_per_s, model.active_params, bw)
                                   for name, bw in links.items()},
            })
    return rows
