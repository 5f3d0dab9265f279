"""Shapes and exact parameter counts of Hugging Face decoder architectures, from config.json fields.

`architecture_fields(cfg, where)` reads one parsed config.json (a dict) and returns the keyword
arguments of `replay.model.models.ModelSpec` that follow from it. Counts sum the tensors each
architecture's transformers modeling file creates (`modeling_<type>.py`), which vLLM's model class
of the same name loads one for one; the multi-token-prediction layers of DeepSeek-V3 / GLM
(`num_nextn_predict_layers`) are not loaded for plain decoding and not counted. Every missing or
inconsistent field is a ConfigError naming `where` (the file) and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.errors import ConfigError

_MISSING = object()


# Every size a config.json gives (layers, widths, heads, experts, vocabulary, context) is at most
# this: 16.7M, above any published model's (Llama 4 Scout's 10M-token context is the largest), far
# below sizes whose parameter counts would overflow what the memory arithmetic can mean.
MAX_SIZE = 1 << 24


class Fields:
    """Typed access to one config.json object; errors name the file and the (dotted) key."""

    def __init__(self, data: Mapping[str, Any], where: str, arch: str, prefix: str = "") -> None:
        self.data, self.where, self.arch, self.prefix = data, where, arch, prefix

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.prefix}{key}: {message}")

    def pos_int(self, key: str, default: Any = _MISSING) -> int:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, f"missing; {self.arch} needs it (a positive integer)")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
            raise self.error(key, f"got {value!r}, expected a positive integer up to {MAX_SIZE:,}")
        return value

    def count(self, key: str, default: int = 0) -> int:
        """A whole number >= 0 (null or absent: `default`)."""
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
            raise self.error(key, f"got {value!r}, expected a whole number from 0 to {MAX_SIZE:,}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"got {value!r}, expected true or false")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(key, f"got {value!r}, expected a list of layer indices")
        return value

    def sub(self, key: str) -> Fields:
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            raise self.error(key, f"got {value!r}, expected an object ({self.arch} keeps its text model there)")
        return Fields(value, self.where, self.arch, f"{self.prefix}{key}.")


def check_divides(f: Fields, key: str, part: int, whole_key: str, whole: int) -> None:
    if whole % part:
        raise f.error(key, f"got {part}, expected a divisor of {whole_key} ({whole})")


def _max_model_len(f: Fields) -> int:
    """vLLM's derived context length (vllm/config/model.py `_get_and_verify_max_len`): the smallest
    of the length keys present, times a YaRN / dynamic rope scaling factor (not llama3 / longrope,
    whose max_position_embeddings already is the scaled length)."""
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
    lengths = [f.pos_int(k) for k in keys if f.data.get(k) is not None]
    if not lengths:
        raise f.error("max_position_embeddings", f"missing; {f.arch} needs a context length (a positive integer)")
    length = min(lengths)
    rope = f.data.get("rope_scaling")
    if isinstance(rope, Mapping):
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in ("llama3", "longrope", "su", "mrope", "default") and isinstance(factor, (int, float)) \
                and not isinstance(factor, bool) and factor > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            length = int((base if isinstance(base, int) and base > 0 else length) * factor)
    return length


def _dtype(f: Fields) -> str:
    """The activation dtype vLLM's `dtype="auto"` picks: the checkpoint's 16-bit type; FP32
    checkpoints are served in a 16-bit type too, so they count as bf16."""
    key = "torch_dtype" if "torch_dtype" in f.data else "dtype"
    name = f.data.get(key) or "bfloat16"
    known = {"float16": "fp16", "half": "fp16", "fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16",
             "float32": "bf16", "float": "bf16", "fp32": "bf16"}
    if not isinstance(name, str) or name.lower().removeprefix("torch.") not in known:
        raise f.error(key, f"got {name!r}, expected one of float16, bfloat16, float32")
    return known[name.lower().removeprefix("torch.")]


def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool,
                     o_bias: bool, qk_norm: bool) -> int:
    """One grouped-query attention layer: q/k/v/o projections, their biases, optional q/k norms."""
    q, kv = heads * head_dim, kv_heads * head_dim
    params = hidden * (q + 2 * kv) + q * hidden
    params += (q + 2 * kv) * qkv_bias + hidden * o_bias
    return params + 2 * head_dim * qk_norm  # Qwen3's per-head q_norm / k_norm weights


def _gqa_heads(f: Fields, hidden: int, default_head_dim: int | None) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim). HF's default head_dim is hidden / heads, which then must divide;
    num_key_value_heads defaults to heads (plain multi-head attention), and must divide heads."""
    heads = f.pos_int("num_attention_heads")
    head_dim = f.pos_int("head_dim", default_head_dim or 0) or None
    if head_dim is None:
        check_divides(f, "num_attention_heads", heads, "hidden_size", hidden)
        head_dim = hidden // heads
    kv_heads = f.pos_int("num_key_value_heads", heads)
    check_divides(f, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
    return heads, kv_heads, head_dim


def spec_fields(f: Fields, *, layers: int, hidden: int, vocab: int, heads: int, kv_heads: int, head_dim: int,
                intermediate: int, body: int, expert_params: int = 0, experts: int = 0, top_k: int = 0,
                shared: int = 0, moe_width: int = 0, dense_layers: int = 0, extra_inactive: int = 0,
                vision: int = 0, **mla: int) -> dict[str, Any]:
    """ModelSpec fields from the layer sums: `body` is every weight but embeddings and the final norm."""
    tied = f.flag("tie_word_embeddings")
    total = vocab * hidden * (1 if tied else 2) + body + hidden + vision
    inactive = expert_params - expert_params * top_k // experts if experts else 0
    return dict(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab, total_params=total,
        active_params=total - inactive - vision - extra_inactive, max_model_len=_max_model_len(f),
        dtype=_dtype(f), tie_word_embeddings=tied, num_experts=experts, experts_per_token=top_k,
        num_shared_experts=shared, moe_intermediate_size=moe_width, expert_params=expert_params,
        num_dense_layers=dense_layers if experts else 0, vision_params=vision, **mla,
    )


def top_k_of(f: Fields, key: str, experts: int) -> int:
    k = f.pos_int(key)
    if k > experts:
        raise f.error(key, f"got {k}, expected at most the {experts} experts")
    return k


def dense(f: Fields, qkv_bias: bool = False, qk_norm: bool = False, head_dim: int | None = None) -> dict[str, Any]:
    """Llama, Mistral, Qwen2 (QKV bias), Qwen3 (q/k norms, head_dim 128 by default), Granite, Phi3
    (fused qkv / gate_up: the same counts). `attention_bias` / `mlp_bias` as LlamaConfig reads them."""
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    width = f.pos_int("intermediate_size")
    heads, kv_heads, hd = _gqa_heads(f, hidden, head_dim)
    bias = f.flag("attention_bias")
    attn = attention_params(hidden, heads, kv_heads, hd, qkv_bias or bias, bias, qk_norm)
    mlp = 3 * hidden * width + (2 * width + hidden) * f.flag("mlp_bias")
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=hd,
                       intermediate=width, body=layers * (attn + mlp + 2 * hidden))


def mixtral(f: Fields) -> dict[str, Any]:
    """Mixtral: Llama attention; every layer routes to top-k of `num_local_experts` SwiGLU experts."""
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    width, experts = f.pos_int("intermediate_size"), f.pos_int("num_local_experts")
    top_k = top_k_of(f, "num_experts_per_tok", experts)
    heads, kv_heads, hd = _gqa_heads(f, hidden, None)
    attn = attention_params(hidden, heads, kv_heads, hd, False, False, False)
    routed = layers * experts * 3 * hidden * width
    body = layers * (attn + hidden * experts + 2 * hidden) + routed
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=hd,
                       intermediate=width, body=body, expert_params=routed, experts=experts, top_k=top_k,
                       moe_width=width)


def qwen_moe(f: Fields, qwen2: bool = False) -> dict[str, Any]:
    """Qwen3-MoE (and Qwen2-MoE): layer i is MoE unless listed in `mlp_only_layers`, and when
    (i + 1) is a multiple of `decoder_sparse_step` (modeling_qwen3_moe.py); the rest are dense.
    Qwen3 attention has q/k norms and head_dim 128 by default; Qwen2-MoE's has QKV biases, and its
    MoE layers add an always-on shared expert (shared_expert_intermediate_size) with a one-unit gate."""
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    experts, moe_width = f.pos_int("num_experts"), f.pos_int("moe_intermediate_size")
    top_k = top_k_of(f, "num_experts_per_tok", experts)
    step, dense_only = f.pos_int("decoder_sparse_step", 1), set(f.int_list("mlp_only_layers"))
    moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    dense_layers = layers - moe_layers
    width = f.pos_int("intermediate_size") if dense_layers else f.pos_int("intermediate_size", moe_width)
    shared_width = f.pos_int("shared_expert_intermediate_size") if qwen2 else 0
    heads, kv_heads, hd = _gqa_heads(f, hidden, None if qwen2 else 128)
    bias = f.flag("attention_bias")
    attn = attention_params(hidden, heads, kv_heads, hd, qwen2 or bias, bias, not qwen2)
    routed = moe_layers * experts * 3 * hidden * moe_width
    router = hidden * experts + (3 * hidden * shared_width + hidden if qwen2 else 0)
    body = layers * (attn + 2 * hidden) + dense_layers * 3 * hidden * width + moe_layers * router + routed
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=hd,
                       intermediate=width if dense_layers else (shared_width or moe_width), body=body,
                       expert_params=routed, experts=experts, top_k=top_k, shared=int(qwen2), moe_width=moe_width,
                       dense_layers=dense_layers)


def gpt_oss(f: Fields) -> dict[str, Any]:
    """gpt-oss (modeling_gpt_oss.py): biased q/k/v/o, one attention-sink logit per head, a biased
    router, and experts with biased gate_up (2 x I) and down projections. The model card's
    "active" figure leaves out the input embedding (a lookup, no matmul); so does this count."""
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    width, experts = f.pos_int("intermediate_size"), f.pos_int("num_local_experts")
    top_k = top_k_of(f, "num_experts_per_tok", experts)
    heads, kv_heads, hd = _gqa_heads(f, hidden, 64)
    attn = attention_params(hidden, heads, kv_heads, hd, True, True, False) + heads
    per_expert = 3 * hidden * width + 2 * width + hidden
    routed = layers * experts * per_expert
    body = layers * (attn + experts * (hidden + 1) + 2 * hidden) + routed
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=hd,
                       intermediate=width, body=body, expert_params=routed, experts=experts, top_k=top_k,
                       moe_width=width, extra_inactive=vocab * hidden)
