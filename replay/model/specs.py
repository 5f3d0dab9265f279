"""Model and GPU catalogs, dtype sizes, and lookups that fail with the list of known names.

Bits per weight include the scale factors each format stores; KV dtypes are vLLM's
`--kv-cache-dtype` values, in bytes per element.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import ConfigError
from replay.model.gpus import GPUS, GpuSpec
from replay.model.models import MODELS, ModelSpec

__all__ = [
    "GPUS", "KV_DTYPE_BYTES", "MODELS", "QUANTIZATION_DTYPES", "WEIGHT_DTYPE_BITS", "GpuSpec", "ModelSpec", "catalog_rows",
    "get_gpu", "get_model", "kv_dtype_bytes", "model_details", "normalize_weight_dtype", "weight_bits",
]

# Bits stored per weight, scale factors included.
WEIGHT_DTYPE_BITS: dict[str, float] = {
    "fp32": 32.0,
    "bf16": 16.0,
    "fp16": 16.0,
    # Per-channel (or 128x128 block) FP32 scales add < 0.01 bit per weight: ignored.
    "fp8": 8.0,
    # W8A8: INT8 weights and per-token INT8 activations, on INT8 tensor cores (GpuSpec.matmul_flops).
    "int8": 8.0,
    # W8A16: 8-bit weights (INT8 or FP8) that a weight-only kernel (Marlin) dequantizes to BF16:
    # GPTQ 8-bit, compressed-tensors W8A16. Bytes as int8, compute at the BF16 peak.
    "w8a16": 8.0,
    # Bare 4-bit integers (per-channel scales, negligible).
    "int4": 4.0,
    # AWQ / GPTQ as vLLM loads them: groups of 128 weights share an FP16 scale and a 4-bit zero
    # point, 4 + (16 + 4) / 128 = 4.15625 bits.
    "awq": 4.15625,
    "gptq": 4.15625,
    # OCP Microscaling v1.0: 32 E2M1 elements share one 8-bit E8M0 scale, 4 + 8/32 (reference
    # 000_*.txt, section 05).
    "mxfp4": 4.25,
    # NVFP4: 16 E2M1 elements share one FP8 E4M3 scale, 4 + 8/16 (plus one FP32 per tensor).
    "nvfp4": 4.5,
}

# vLLM's `--quantization` methods this tool models, and the weight format each loads. ("int8" is
# W8A8 INT8 as compressed-tensors checkpoints load it; "modelopt_fp4" is vLLM's name for NVFP4.)
QUANTIZATION_DTYPES: dict[str, str] = {
    "fp8": "fp8",
    "int8": "int8",
    "awq": "awq",
    "gptq": "gptq",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4",
    "modelopt_fp4": "nvfp4",
}

_WEIGHT_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}

# vLLM `--kv-cache-dtype` choices; "auto" follows the model's activation dtype (`ModelSpec.dtype`).
KV_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def normalize_weight_dtype(dtype: str) -> str:
    """Canonical weight dtype name (`bfloat16` -> `bf16`); ConfigError listing the known ones."""
    if not isinstance(dtype, str):
        raise ConfigError(f"weight_dtype: expected a string, got {dtype!r}; known: {', '.join(WEIGHT_DTYPE_BITS)}")
    name = dtype.strip().lower()
    name = _WEIGHT_ALIASES.get(name, name)
    if name not in WEIGHT_DTYPE_BITS:
        raise ConfigError(f"unknown weight dtype {dtype!r}; known: {', '.join(WEIGHT_DTYPE_BITS)}")
    return name


def weight_bits(dtype: str) -> float:
    """Bits per stored weight for `dtype`, scale overhead included."""
    return WEIGHT_DTYPE_BITS[normalize_weight_dtype(dtype)]


def kv_dtype_bytes(kv_cache_dtype: str, model: ModelSpec) -> int:
    """Bytes per KV-cache element; "auto" stores KV in the model's activation dtype (BF16: 2)."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype.strip().lower() not in KV_DTYPE_BYTES:
        raise ConfigError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; known: {', '.join(KV_DTYPE_BYTES)}")
    nbytes = KV_DTYPE_BYTES[kv_cache_dtype.strip().lower()]
    if nbytes is None:
        return int(weight_bits(model.dtype)) // 8
    return nbytes


def get_model(model_id: str) -> ModelSpec:
    """The catalog entry for `model_id`, or the model a Hugging Face config.json describes when
    `model_id` is its path (or its folder's): it holds a slash or ends in .json, or names no
    catalog entry but an existing file or folder."""
    from replay.model.hf.config import load_model, looks_like_path

    if isinstance(model_id, str) and model_id in MODELS:
        return MODELS[model_id]
    if looks_like_path(model_id) or (isinstance(model_id, str) and model_id and Path(model_id).exists()):
        return load_model(model_id)
    raise ConfigError(f"unknown model {model_id!r}; known: {', '.join(sorted(MODELS))} "
                      "(or the path of a Hugging Face config.json)")


def get_gpu(gpu_id: str) -> GpuSpec:
    """The catalog entry for `gpu_id`."""
    try:
        return GPUS[gpu_id]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown gpu {gpu_id!r}; known: {', '.join(sorted(GPUS))}") from None


def model_details(m: ModelSpec) -> dict[str, Any]:
    """What `llm-replay catalog --model` prints about one model (a catalog id or a config.json)."""
    return {
        "id": m.id,
        "name": m.name,
        "architecture": m.architecture or None,
        "layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "attention": m.attention,
        "heads": m.num_attention_heads,
        "kv_heads": 1 if m.is_mla else m.num_kv_heads,
        "head_dim": m.head_dim,
        "mla_latent_dim": m.kv_lora_rank + m.qk_rope_head_dim if m.is_mla else None,
        "experts_total": m.num_experts,
        "experts_active": m.experts_per_token,
        "experts_shared": m.num_shared_experts,
        "moe_layers": m.moe_layers,
        "params_total": int(m.total_params),
        "params_active": int(m.active_params),
        "params_routed_experts": int(m.expert_params),
        "params_vision": int(m.vision_params),
        "params_unquantized": int(m.unquantized_params),
        "weight_format": m.default_weight_dtype
        + (f" ({m.expert_weight_dtype} experts)" if m.expert_weight_dtype else ""),
        "activation_dtype": m.dtype,
        "kv_bytes_per_token": m.kv_elements_per_token * kv_dtype_bytes("auto", m),
        "context_tokens": m.max_model_len,
    }


def catalog_rows() -> dict[str, list[dict[str, Any]]]:
    """Rows for the `llm-replay catalog` tables: {"models": [...], "gpus": [...]}, catalog order."""
    models = [
        {
            "id": m.id,
            "params_b": round(m.total_params / 1e9, 2),
            "active_params_b": round(m.active_params / 1e9, 2),
            "layers": m.num_layers,
            "attention": m.attention,
            "kv_heads": 1 if m.is_mla else m.num_kv_heads,
            "head_dim": m.kv_lora_rank + m.qk_rope_head_dim if m.is_mla else m.head_dim,
            "context_tokens": m.max_model_len,
            "weight_dtype": m.default_weight_dtype
            + (f" ({m.expert_weight_dtype} experts)" if m.expert_weight_dtype else ""),
            "kv_bytes_per_token_bf16": m.kv_elements_per_token * 2,
        }
        for m in MODELS.values()
    ]
    gpus = [
        {
            "id": g.id,
            "hbm_gb": round(g.hbm_bytes / 1e9, 1),
            # what CUDA reports, and vLLM sizes the KV cache from
            "cuda_total_gib": round(g.cuda_total_bytes / 2**30, 2),
            "hbm_tb_per_s": round(g.hbm_bandwidth_bytes_per_s / 1e12, 3),
            "bf16_tflops": round(g.bf16_flops / 1e12, 1),
            "fp8_tflops": round(g.fp8_flops / 1e12, 1) if g.fp8_native else None,
            "interconnect_gb_per_s": round(g.interconnect_bytes_per_s / 1e9, 1),
            "interconnect": g.interconnect,
            "price_usd_per_gpu_hour": g.price_usd_per_gpu_hour,
        }
        for g in GPUS.values()
    ]
    return {"models": models, "gpus": gpus}
