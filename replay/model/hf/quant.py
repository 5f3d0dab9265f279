"""The weight format a Hugging Face `quantization_config` loads, as replay.model.specs.WEIGHT_DTYPE_BITS names it.

Formats follow what vLLM's quantization method of the same name stores per weight
(vllm/model_executor/layers/quantization/): FP8 checkpoints (static or dynamic activation scales)
keep 8-bit weights; compressed-tensors says its format per group of layers; AWQ and GPTQ keep
4-bit groups with scales and zero points; MXFP4 (gpt-oss) quantizes only the experts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from common.errors import ConfigError

QUANT_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors", "awq", "awq_marlin", "gptq", "gptq_marlin",
                 "mxfp4", "modelopt", "modelopt_fp4")


def _err(where: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: quantization_config.{key}: {message}")


def _bits(q: Mapping[str, Any], where: str, allowed: dict[int, str]) -> str:
    bits = q.get("bits", q.get("w_bit", 4))
    if bits not in allowed or isinstance(bits, bool):
        raise _err(where, "bits", f"got {bits!r}, expected {' or '.join(map(str, allowed))}")
    return allowed[bits]


def _compressed_tensors(q: Mapping[str, Any], where: str) -> str | None:
    """compressed-tensors: the weights of the group that targets `Linear` (else the first group).
    8-bit weights with 8-bit input activations: W8A8 int -> int8, float -> fp8; 8-bit weights
    with none (W8A16) -> w8a16: vLLM runs them weight-only through Marlin whatever the GPU
    (`CompressedTensorsWNA16`, `CompressedTensorsW8A16Fp8`); W4A16 int in groups -> "gptq" (vLLM runs it
    with the same Marlin kernels; 16-bit scale per 128 weights, within 1% of GPTQ's bits), int4
    per channel -> int4; float 4-bit in groups of 16 -> nvfp4, of 32 -> mxfp4."""
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise _err(where, "config_groups", f"got {groups!r}, expected an object of quantization groups")
    names = [n for n, g in groups.items() if isinstance(g, Mapping) and "Linear" in (g.get("targets") or [])]
    name = names[0] if names else next(iter(groups))
    group = groups[name]
    if not isinstance(group, Mapping):
        raise _err(where, f"config_groups.{name}", f"got {group!r}, expected an object with targets and weights")
    weights = group.get("weights")
    key = f"config_groups.{name}.weights"
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise _err(where, key, f"got {weights!r}, expected an object with num_bits and type")
    kind, bits = weights.get("type", "int"), weights.get("num_bits")
    if kind in ("int", "float") and bits == 8 and not group.get("input_activations"):
        return "w8a16"
    if kind == "float" and bits == 8:
        return "fp8"
    if kind == "int" and bits == 8:
        return "int8"
    if kind == "int" and bits == 4:
        return "int4" if weights.get("strategy") == "channel" else "gptq"
    if kind == "float" and bits == 4:
        size = weights.get("group_size")
        if size in (16, 32):
            return "nvfp4" if size == 16 else "mxfp4"
        raise _err(where, f"{key}.group_size", f"got {size!r}, expected 16 (NVFP4) or 32 (MXFP4) for 4-bit floats")
    raise _err(where, key, f"type {kind!r} with num_bits {bits!r}; expected int or float weights of 4 or 8 bits")


# Prefixes of the text model's modules in an ignore list (Llama 4 nests it under `language_model`).
_TEXT_PREFIXES = ("language_model.model.", "model.language_model.", "model.", "")
_MAX_IGNORE = 100_000


def _text_modules(fields: Mapping[str, Any]) -> dict[str, int]:
    """Parameter count of each text-model module a quantization ignore list can name: the attention
    projections and, for MoE models, the router of every MoE layer, by their names in Hugging Face
    checkpoints (`layers.{i}.self_attn.q_proj`, `layers.{i}.mlp.gate`, Llama 4's
    `layers.{i}.feed_forward.router`, Mixtral's `layers.{i}.block_sparse_moe.gate`)."""
    if fields.get("kv_lora_rank"):
        return {}  # MLA's projections have other shapes; their checkpoints ship block-FP8 without ignores
    hidden, heads, kv = fields["hidden_size"], fields["num_attention_heads"], fields["num_kv_heads"]
    q, k = heads * fields["head_dim"], kv * fields["head_dim"]
    shapes = {"q_proj": hidden * q, "k_proj": hidden * k, "v_proj": hidden * k, "o_proj": q * hidden}
    experts = fields.get("num_experts", 0)
    modules: dict[str, int] = {}
    for i in range(fields["num_layers"]):
        for name, size in shapes.items():
            modules[f"layers.{i}.self_attn.{name}"] = size
        if experts:
            for router in ("mlp.gate", "feed_forward.router", "block_sparse_moe.gate"):
                modules[f"layers.{i}.{router}"] = hidden * experts
    return modules


def unquantized_params(data: Mapping[str, Any], where: str, fields: Mapping[str, Any]) -> int:
    """Parameters of the text model that a quantized checkpoint leaves in its 16-bit dtype because
    its quantization_config's ignore list names them (compressed-tensors `ignore`, FP8's
    `ignored_layers`, `modules_to_not_convert`): RedHatAI's Llama-4-Scout FP8 keeps attention and
    routers in BF16, 3.0 B of its 17.2 B active parameters. Exact names (a fused `qkv_proj` names
    its three parts) and `re:` patterns are matched against the attention projections and routers
    (see `_text_modules`; a pattern as compressed-tensors applies it, `re.match` on the module's full
    name under each text prefix); entries for other modules (the vision tower; lm_head and embeddings,
    16-bit anyway) add nothing."""
    q = data.get("quantization_config")
    if not isinstance(q, Mapping):
        return 0
    key = next((k for k in ("ignore", "ignored_layers", "modules_to_not_convert") if q.get(k) is not None), None)
    if key is None:
        return 0
    entries = q[key]
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise _err(where, key, f"got {str(entries)[:80]}, expected a list of module names")
    if len(entries) > _MAX_IGNORE:
        raise _err(where, key, f"{len(entries):,} entries, expected at most {_MAX_IGNORE:,}")
    exact: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for entry in entries:
        if entry.startswith("re:"):
            try:
                patterns.append(re.compile(entry[3:]))
            except re.error as exc:
                raise _err(where, key, f"{entry!r} is not a regular expression ({exc})") from None
            continue
        names = {entry.removeprefix(p) for p in _TEXT_PREFIXES if entry.startswith(p)}
        exact |= names | {n.removesuffix("qkv_proj") + part for n in names if n.endswith(".qkv_proj")
                          for part in ("q_proj", "k_proj", "v_proj")}
    return sum(size for name, size in _text_modules(fields).items()
               if name in exact or any(p.match(prefix + name) for p in patterns for prefix in _TEXT_PREFIXES[:3]))


def weight_formats(data: Mapping[str, Any], where: str, dtype: str, has_experts: bool) -> tuple[str, str | None]:
    """(default weight format, routed experts' format or None when the same), from config.json's
    `quantization_config`; none gives the checkpoint's 16-bit `dtype`."""
    q = data.get("quantization_config")
    if q is None:
        return dtype, None
    if not isinstance(q, Mapping):
        raise ConfigError(f"{where}: quantization_config: got {q!r}, expected an object with quant_method")
    method = q.get("quant_method")
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", None
    if method == "compressed-tensors":
        return _compressed_tensors(q, where) or dtype, None
    if method in ("awq", "awq_marlin"):
        return _bits(q, where, {4: "awq"}), None
    if method in ("gptq", "gptq_marlin"):
        return _bits(q, where, {4: "gptq", 8: "w8a16"}), None  # GPTQ is weight-only: 8-bit through Marlin
    if method == "mxfp4":
        # gpt-oss: "MXFP4 quantization of the MoE weights"; attention, router and embeddings stay 16-bit.
        return (dtype, "mxfp4") if has_experts else ("mxfp4", None)
    if method == "modelopt_fp4":
        return "nvfp4", None
    if method == "modelopt":
        nested = q.get("quantization")  # hf_quant_config.json's layout, copied into config.json
        algo = q.get("quant_algo", nested.get("quant_algo") if isinstance(nested, Mapping) else None)
        if algo in ("FP8", "NVFP4"):
            return ("fp8" if algo == "FP8" else "nvfp4"), None
        raise _err(where, "quant_algo", f"got {algo!r}, expected FP8 or NVFP4")
    raise _err(where, "quant_method", f"got {method!r}, expected one of {', '.join(QUANT_METHODS)}")
