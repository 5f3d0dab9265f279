"""Catalog entries agree with their own architectures; lookups and dtypes fail with the known names."""

from __future__ import annotations

import json

import pytest

from common.errors import ConfigError
from replay.model.specs import (
    GPUS,
    KV_DTYPE_BYTES,
    MODELS,
    WEIGHT_DTYPE_BITS,
    GpuSpec,
    ModelSpec,
    catalog_rows,
    get_gpu,
    get_model,
    kv_dtype_bytes,
    normalize_weight_dtype,
    weight_bits,
)

MODEL_IDS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-7b", "llama-2-70b", "mixtral-8x7b",
             "qwen2.5-72b", "deepseek-v3", "gpt-oss-120b",
             # counted from their config.json files (tests/unit/test_hf_config.py)
             "codellama-34b", "yi-34b", "llama-3.3-70b", "mistral-nemo-12b", "qwen2.5-7b", "qwen3-14b",
             "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x22b", "llama-4-scout-fp8", "deepseek-v2-lite",
             "deepseek-r1", "glm-5.2-fp8", "gpt-oss-20b"]
GPU_IDS = ["a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb",
           "b200-sxm-180gb", "l40s-48gb", "mi300x-192gb"]


def test_catalogs_hold_exactly_the_documented_ids():
    assert sorted(MODELS) == sorted(MODEL_IDS)
    assert sorted(GPUS) == sorted(GPU_IDS)
    assert all(MODELS[k].id == k for k in MODELS) and all(GPUS[k].id == k for k in GPUS)


def _llama_style_params(m: ModelSpec, qkv_bias: bool) -> int:
    """Slow, obvious parameter count of a Llama-style dense decoder from its dimensions."""
    q, kv = m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attn = m.hidden_size * (q + 2 * kv) + q * m.hidden_size + ((q + 2 * kv) if qkv_bias else 0)
    layer = attn + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size
    return m.embedding_params + m.num_layers * layer + m.hidden_size


@pytest.mark.parametrize("model_id", ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-7b",
                                      "llama-2-70b", "qwen2.5-72b"])
def test_dense_param_counts_follow_from_the_architecture(model_id):
    m = get_model(model_id)
    assert m.total_params == _llama_style_params(m, qkv_bias=model_id.startswith("qwen"))
    assert m.active_params == m.total_params and not m.is_moe


def test_published_sizes():
    assert get_model("llama-3.1-8b").total_params == pytest.approx(8.03e9, rel=1e-3)
    assert get_model("llama-3.1-70b").total_params == pytest.approx(70.6e9, rel=1e-3)
    assert get_model("llama-3.1-405b").total_params == pytest.approx(405.9e9, rel=1e-3)
    assert get_model("mixtral-8x7b").total_params == pytest.approx(46.7e9, rel=1e-3)
    assert get_model("mixtral-8x7b").active_params == pytest.approx(12.9e9, rel=1e-2)
    assert get_model("deepseek-v3").total_params == pytest.approx(671e9, rel=1e-3)
    assert get_model("deepseek-v3").active_params == pytest.approx(37e9, rel=0.03)
    assert get_model("gpt-oss-120b").total_params == pytest.approx(116.8e9, rel=1e-3)
    assert get_model("gpt-oss-120b").active_params == pytest.approx(5.1e9, rel=0.01)


@pytest.mark.parametrize("model_id", ["mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"])
def test_moe_expert_params_and_active_params_agree(model_id):
    m = get_model(model_id)
    moe_layers = m.num_layers - (3 if model_id == "deepseek-v3" else 0)  # DeepSeek: first 3 layers dense
    per_expert = 3 * m.hidden_size * m.moe_intermediate_size
    # gpt-oss experts carry biases (gate_up 2 x I, down H): under 0.1% on top.
    assert m.expert_params == pytest.approx(moe_layers * m.num_experts * per_expert, rel=1e-3)
    routed_active = m.expert_params * m.experts_per_token / m.num_experts
    active = m.dense_params + routed_active
    if model_id == "gpt-oss-120b":  # the model card leaves the input embedding out of "active"
        active -= m.vocab_size * m.hidden_size
    assert m.active_params == pytest.approx(active, rel=1e-6)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_every_model_is_internally_consistent(model_id):
    m = get_model(model_id)
    for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "max_model_len"):
        assert getattr(m, name) > 0, name
    assert 0 < m.active_params <= m.total_params
    assert 0 <= m.expert_params < m.total_params and m.dense_params > m.embedding_params
    assert m.num_attention_heads % m.num_kv_heads == 0
    if not m.is_mla:
        assert m.num_attention_heads * m.head_dim <= 2 * m.hidden_size
    if m.is_moe:
        assert 0 < m.experts_per_token <= m.num_experts and m.moe_intermediate_size > 0
    else:
        assert m.num_experts == m.experts_per_token == 0
    normalize_weight_dtype(m.default_weight_dtype)
    if m.expert_weight_dtype:
        normalize_weight_dtype(m.expert_weight_dtype)
    assert m.kv_elements_per_token > 0


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_every_gpu_is_internally_consistent(gpu_id):
    g = get_gpu(gpu_id)
    assert g.hbm_bytes > 0 and isinstance(g.hbm_bytes, int)
    assert g.hbm_bandwidth_bytes_per_s > 0 and g.interconnect_bytes_per_s > 0
    assert 0 < g.bf16_flops <= g.fp8_flops
    if g.fp8_native:  # FP8 tensor cores run at about twice the BF16 rate
        assert g.fp8_flops == pytest.approx(2 * g.bf16_flops, rel=0.02)
    else:  # no FP8 tensor cores: FP8 checkpoints run at BF16 speed
        assert g.fp8_flops == g.bf16_flops
    assert 0 < g.price_usd_per_gpu_hour < 20
    # Decimal marketed gigabytes: "80gb" is 80e9 bytes.
    assert g.hbm_bytes == int(gpu_id.rsplit("-", 1)[1].removesuffix("gb")) * 10**9
    # What CUDA reports is the board's memory less the driver's reservation: between the marketed
    # decimal size's 99% and 108% (79.22 GiB = 85.06e9 bytes for an "80 GB" H100).
    assert isinstance(g.cuda_total_bytes, int) and 0.99 < g.cuda_total_bytes / g.hbm_bytes < 1.08


def test_datasheet_spot_checks():
    h100 = get_gpu("h100-sxm-80gb")
    assert h100.bf16_flops == pytest.approx(989e12, rel=1e-3)  # 1,979 with sparsity, halved
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert not get_gpu("a100-sxm-80gb").fp8_native
    assert get_gpu("a100-sxm-80gb").fp8_flops == get_gpu("a100-sxm-80gb").bf16_flops
    assert get_gpu("h100-pcie-80gb").interconnect_bytes_per_s == 64e9


def test_unknown_ids_list_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown model 'llama-4'; known: .*llama-3.1-70b"):
        get_model("llama-4")
    with pytest.raises(ConfigError, match=r"unknown gpu 'h300'; known: a100-sxm-40gb, .*mi300x-192gb"):
        get_gpu("h300")
    with pytest.raises(ConfigError, match="unknown model"):
        get_model(None)


def test_weight_dtype_bits():
    assert weight_bits("bf16") == weight_bits("fp16") == weight_bits("bfloat16") == 16
    assert weight_bits("fp8") == weight_bits("int8") == 8
    assert weight_bits("int4") == 4
    assert 4 < weight_bits("awq") < 4.2
    assert weight_bits("mxfp4") == 4.25 and weight_bits("nvfp4") == 4.5
    assert weight_bits(" FP8 ") == 8
    with pytest.raises(ConfigError, match=r"unknown weight dtype 'fp6'; known: fp32, bf16, .*nvfp4"):
        weight_bits("fp6")


def test_kv_dtype_bytes():
    m = get_model("llama-3.1-8b")
    assert kv_dtype_bytes("auto", m) == 2
    assert kv_dtype_bytes("fp8", m) == kv_dtype_bytes("fp8_e4m3", m) == kv_dtype_bytes("fp8_e5m2", m) == 1
    assert set(KV_DTYPE_BYTES) >= {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
    with pytest.raises(ConfigError, match=r"unknown kv_cache_dtype 'int4'; known: auto, .*fp8_e5m2"):
        kv_dtype_bytes("int4", m)
    assert "mxfp4" in WEIGHT_DTYPE_BITS


def test_spec_construction_rejects_inconsistent_numbers():
    with pytest.raises(ConfigError, match="active_params <= total_params"):
        ModelSpec("x", "X", "x/x", 2, 64, 4, 2, 16, 128, 100, 1e6, 2e6, 128)
    with pytest.raises(ConfigError, match="num_layers must be a positive integer"):
        ModelSpec("x", "X", "x/x", 0, 64, 4, 2, 16, 128, 100, 1e6, 1e6, 128)
    with pytest.raises(ConfigError, match="hbm_bytes must be positive"):
        GpuSpec("g", "G", 0, 10**9, 1e12, 1e14, 1e14, False, 1e9, "PCIe", 1.0, int8_ops=1e14)
    with pytest.raises(ConfigError, match="cuda_total_bytes must be positive"):
        GpuSpec("g", "G", 10**9, 0, 1e12, 1e14, 1e14, False, 1e9, "PCIe", 1.0, int8_ops=1e14)


def test_catalog_rows_are_json_safe_tables():
    rows = catalog_rows()
    json.dumps(rows)
    assert [r["id"] for r in rows["models"]] == list(MODELS)
    assert [r["id"] for r in rows["gpus"]] == list(GPUS)
    by_id = {r["id"]: r for r in rows["models"]}
    assert by_id["llama-3.1-8b"]["kv_bytes_per_token_bf16"] == 131_072
    assert by_id["llama-3.1-70b"]["params_b"] == 70.55
    assert by_id["deepseek-v3"]["attention"] == "MLA" and by_id["deepseek-v3"]["head_dim"] == 576
    gpus = {r["id"]: r for r in rows["gpus"]}
    assert gpus["h100-sxm-80gb"]["hbm_gb"] == 80.0 and gpus["h100-sxm-80gb"]["bf16_tflops"] == 989.4
    assert gpus["h100-sxm-80gb"]["cuda_total_gib"] == 79.22  # vLLM's "total_gpu_memory (79.22GiB)"
    assert gpus["a100-sxm-80gb"]["fp8_tflops"] is None
    assert len({tuple(r) for r in rows["models"]}) == 1 and len({tuple(r) for r in rows["gpus"]}) == 1
