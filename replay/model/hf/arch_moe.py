"""Parameter counts of the MoE architectures with more than one kind of layer: DeepSeek-V2/V3 (MLA,
shared experts, dense first layers), GLM-MoE-DSA (the same plus a sparse-attention indexer) and
Llama 4 (interleaved MoE layers, a shared expert, a vision tower). See replay/model/hf/arch.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from common.errors import ConfigError
from replay.model.hf import arch as hf_arch
from replay.model.hf.arch import Fields, attention_params, check_divides, spec_fields, top_k_of


def _mla_attention(f: Fields, hidden: int, heads: int) -> tuple[int, dict[str, int], int]:
    """One MLA layer (modeling_deepseek_v2/v3.py): q through an optional low-rank `q_lora_rank`
    (q_a_proj, q_a_layernorm, q_b_proj) to heads x (nope + rope); kv_a_proj_with_mqa to the
    `kv_lora_rank` latent plus one shared rope key, kv_a_layernorm, kv_b_proj back to heads x
    (nope + v); o_proj from heads x v. Returns (params, MLA fields of ModelSpec, v head dim)."""
    nope, rope = f.pos_int("qk_nope_head_dim"), f.pos_int("qk_rope_head_dim")
    v_dim, kv_rank = f.pos_int("v_head_dim"), f.pos_int("kv_lora_rank")
    q_rank = f.count("q_lora_rank")
    bias = f.flag("attention_bias")
    q_width = heads * (nope + rope)
    q = q_rank * (hidden + 1 + q_width) + q_rank * bias if q_rank else hidden * q_width
    kv = hidden * (kv_rank + rope) + (kv_rank + rope) * bias + kv_rank + kv_rank * heads * (nope + v_dim)
    o = heads * v_dim * hidden + hidden * bias
    return q + kv + o, {"kv_lora_rank": kv_rank, "qk_rope_head_dim": rope}, v_dim


def _indexer(f: Fields, hidden: int) -> int:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-MoE-DSA; vLLM
    deepseek_v2.py `Indexer`): wq_b from the q latent to index_n_heads x index_head_dim, wk to
    one index_head_dim key, a LayerNorm on it (weight and bias), weights_proj to one weight per
    head. Its per-token key cache (index_head_dim FP8 values and a scale per layer) is not in
    ModelSpec's KV bytes: it adds about 11% to the MLA latent's."""
    if f.data.get("index_n_heads") is None:
        return 0
    n, dim, q_rank = f.pos_int("index_n_heads"), f.pos_int("index_head_dim"), f.pos_int("q_lora_rank")
    return q_rank * n * dim + hidden * dim + 2 * dim + hidden * n


def deepseek(f: Fields) -> dict[str, Any]:
    """DeepSeek-V2/V3 (and GLM-MoE-DSA, which adds the indexer): layer i has routed experts when
    i >= first_k_dense_replace and i % moe_layer_freq == 0, plus `n_shared_experts` always-on
    experts (one MLP of n_shared x moe_intermediate_size); the router has E weights per hidden
    unit and, with topk_method noaux_tc (V3), an E-entry score-correction bias."""
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    heads = f.pos_int("num_attention_heads")
    experts, moe_width = f.pos_int("n_routed_experts"), f.pos_int("moe_intermediate_size")
    top_k = top_k_of(f, "num_experts_per_tok", experts)
    shared = f.count("n_shared_experts")
    first_dense, freq = f.count("first_k_dense_replace"), f.pos_int("moe_layer_freq", 1)
    moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    dense_layers = layers - moe_layers
    width = f.pos_int("intermediate_size")
    attn, mla, v_dim = _mla_attention(f, hidden, heads)
    router = hidden * experts + experts * (f.data.get("topk_method") == "noaux_tc")
    routed = moe_layers * experts * 3 * hidden * moe_width
    body = layers * (attn + _indexer(f, hidden) + 2 * hidden) + dense_layers * 3 * hidden * width \
        + moe_layers * (router + shared * 3 * hidden * moe_width) + routed
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=heads, head_dim=v_dim,
                       intermediate=width if dense_layers else moe_width * max(shared, 1), body=body,
                       expert_params=routed, experts=experts, top_k=top_k, shared=shared, moe_width=moe_width,
                       dense_layers=dense_layers, **mla)


def _llama4_vision(f: Fields, text_hidden: int) -> int:
    """Llama 4's vision encoder, pixel-shuffle adapter and projector (modeling_llama4.py), which
    vLLM's Llama4ForConditionalGeneration loads and keeps on the GPU even for text-only traffic:
    an unfold-conv patch embedding, class and position embeddings, pre/post LayerNorms, encoder
    layers of biased q/k/v/o and fc1/fc2 with two LayerNorms each, the adapter's fc1
    (intermediate -> projector_input_dim) and fc2, and the projector to the text hidden size."""
    if f.data.get("vision_config") is None:
        return 0
    v = f.sub("vision_config")
    h, width, layers = v.pos_int("hidden_size"), v.pos_int("intermediate_size"), v.pos_int("num_hidden_layers")
    patch, image, channels = v.pos_int("patch_size"), v.pos_int("image_size"), v.pos_int("num_channels", 3)
    layer = 4 * (h * h + h) + 2 * h * width + width + h + 4 * h
    embed = channels * patch * patch * h + h + ((image // patch) ** 2 + 1) * h + 4 * h
    adapter = width * v.pos_int("projector_input_dim") + v.pos_int("projector_output_dim") ** 2
    return layers * layer + embed + adapter + v.pos_int("vision_output_dim") * text_hidden


def llama4(f: Fields) -> dict[str, Any]:
    """Llama 4 (its text model under `text_config`): Llama attention with weightless L2 q/k norms;
    the layers in `moe_layers` (default: every interleave_moe_layer_step-th, counted from
    step - 1) route each token to top-k of `num_local_experts` experts of width intermediate_size
    and always run a shared expert of that width; the other layers have a dense MLP of
    intermediate_size_mlp."""
    root = f
    f = f.sub("text_config") if f.data.get("text_config") is not None else f
    hidden, layers, vocab = f.pos_int("hidden_size"), f.pos_int("num_hidden_layers"), f.pos_int("vocab_size")
    heads = f.pos_int("num_attention_heads")
    kv_heads, head_dim = f.pos_int("num_key_value_heads", heads), f.pos_int("head_dim", 128)
    check_divides(f, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
    experts, width = f.pos_int("num_local_experts"), f.pos_int("intermediate_size")
    top_k = top_k_of(f, "num_experts_per_tok", experts)
    if f.data.get("moe_layers") is not None:
        moe = {i for i in f.int_list("moe_layers") if 0 <= i < layers}
    else:
        step = f.pos_int("interleave_moe_layer_step", 1)
        moe = set(range(step - 1, layers, step))
    dense_layers = layers - len(moe)
    mlp_width = f.pos_int("intermediate_size_mlp") if dense_layers else width
    bias = f.flag("attention_bias")
    attn = attention_params(hidden, heads, kv_heads, head_dim, bias, bias, False)
    routed = len(moe) * experts * 3 * hidden * width
    body = layers * (attn + 2 * hidden) + dense_layers * 3 * hidden * mlp_width \
        + len(moe) * (hidden * experts + 3 * hidden * width) + routed
    return spec_fields(f, layers=layers, hidden=hidden, vocab=vocab, heads=heads, kv_heads=kv_heads,
                       head_dim=head_dim, intermediate=mlp_width, body=body, expert_params=routed, experts=experts,
                       top_k=top_k, shared=1, moe_width=width, dense_layers=dense_layers,
                       vision=_llama4_vision(root, hidden))


# architectures[0] -> the counting code (transformers / vLLM class names).
ARCHITECTURES: dict[str, Callable[[hf_arch.Fields], dict[str, Any]]] = {
    "LlamaForCausalLM": hf_arch.dense,
    "MistralForCausalLM": hf_arch.dense,
    "GraniteForCausalLM": hf_arch.dense,
    "Phi3ForCausalLM": hf_arch.dense,
    "Qwen2ForCausalLM": partial(hf_arch.dense, qkv_bias=True),
    "Qwen3ForCausalLM": partial(hf_arch.dense, qk_norm=True, head_dim=128),
    "MixtralForCausalLM": hf_arch.mixtral,
    "Qwen2MoeForCausalLM": partial(hf_arch.qwen_moe, qwen2=True),
    "Qwen3MoeForCausalLM": hf_arch.qwen_moe,
    "GptOssForCausalLM": hf_arch.gpt_oss,
    "DeepseekV2ForCausalLM": deepseek,
    "DeepseekV3ForCausalLM": deepseek,
    "DeepseekV32ForCausalLM": deepseek,
    "GlmMoeDsaForCausalLM": deepseek,
    "Llama4ForConditionalGeneration": llama4,
    "Llama4ForCausalLM": llama4,
}


def architecture(data: Mapping[str, Any], where: str) -> str:
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"{where}: architectures: got {archs!r}, expected a list naming the model class, "
                          f"one of {', '.join(ARCHITECTURES)}")
    if archs[0] not in ARCHITECTURES:
        raise ConfigError(f"{where}: architectures: {archs[0]!r} is not supported; expected one of "
                          f"{', '.join(ARCHITECTURES)}")
    return archs[0]


def fields_from_config(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """ModelSpec fields (shapes and counts) of one parsed config.json; `where` names it in errors."""
    arch = architecture(data, where)
    return {"architecture": arch, **ARCHITECTURES[arch](hf_arch.Fields(data, where, arch))}
