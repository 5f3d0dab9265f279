"""KV bytes, weight bytes and KV block counts against the reference texts' numbers and vLLM's rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ConfigError
from replay.model.memory import (
    Capacity,
    activation_peak_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_capacity,
    kv_heads_per_gpu,
    max_concurrency,
    overhead_bytes,
    weights_bytes,
    weights_bytes_per_gpu,
)
from replay.model.specs import GPUS, MODELS, get_gpu, get_model

LESSON_KV_TOKENS = 399_169  # ../shared/reference/003_*.txt: Llama 3.1 70B bf16, TP4, 80 GB, 0.9
LESSON_GPU_BYTES = 80e9  # the lesson's "80 GB": decimal, not the 79.22 GiB CUDA reports


def test_kv_bytes_per_token_reference_numbers():
    assert kv_bytes_per_token("llama-3.1-8b") == 131_072 == 128 * 1024
    assert kv_bytes_per_token("llama-3.1-70b") == 327_680 == 320 * 1024
    assert kv_bytes_per_token("llama-3.1-8b", "fp8") == 65_536
    assert kv_bytes_per_token("llama-3.1-70b", "fp8_e4m3") == 163_840
    assert kv_bytes_per_token("llama-3.1-70b", "fp8_e5m2") == 163_840


def test_mla_stores_the_latent_once():
    # DeepSeek-V3: 61 layers x (512 + 64) latent elements x 2 bytes, no factor 2 for K and V.
    assert kv_bytes_per_token("deepseek-v3") == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token("deepseek-v3", "fp8") == 35_136
    # Every TP rank keeps the whole latent.
    assert kv_heads_per_gpu("deepseek-v3", 8) == 1
    assert kv_bytes_per_token_per_gpu("deepseek-v3", 8) == 70_272


def test_a_4000_token_conversation_on_the_8b_is_about_half_a_gigabyte():
    assert 4000 * kv_bytes_per_token("llama-3.1-8b") == pytest.approx(0.5e9, rel=0.05)


def test_one_100k_request_holds_the_kv_of_about_eighty_1280_token_conversations():
    # The lesson's replica (its 80 GB cards): 4 requests of 100K fit where 326 of 1,280 do.
    cap = kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 4, gpu_memory_bytes=LESSON_GPU_BYTES)
    ratio = max_concurrency(cap, 1280) / max_concurrency(cap, 100_000)
    assert ratio == pytest.approx(80, rel=0.05)
    assert 100_000 / 1280 == pytest.approx(80, rel=0.05)


def test_kv_heads_split_under_tp_and_replicate_past_the_kv_head_count():
    assert kv_heads_per_gpu("llama-3.1-70b", 1) == 8
    assert kv_heads_per_gpu("llama-3.1-70b", 4) == 2
    assert kv_heads_per_gpu("llama-3.1-70b", 8) == 1
    assert kv_heads_per_gpu("llama-3.1-70b", 16) == 1  # replicated: 16 GPUs, 8 KV heads
    assert kv_bytes_per_token_per_gpu("llama-3.1-70b", 4) == 327_680 // 4
    assert kv_bytes_per_token_per_gpu("llama-3.1-70b", 16) == kv_bytes_per_token_per_gpu("llama-3.1-70b", 8)
    assert kv_heads_per_gpu("llama-2-7b", 4) == 8  # MHA: 32 KV heads


def test_weights_bytes():
    assert weights_bytes_per_gpu("llama-3.1-70b", 4) == pytest.approx(35.3e9, rel=0.01)
    assert weights_bytes("llama-3.1-70b") == 2 * 70_553_706_496
    assert weights_bytes("llama-3.1-8b") == pytest.approx(16.06e9, rel=1e-3)
    # FP8 halves the linear layers; embeddings and lm_head stay 16-bit.
    m = get_model("llama-3.1-70b")
    assert weights_bytes(m, "fp8") == m.total_params + m.embedding_params
    assert weights_bytes(m, "bfloat16") == weights_bytes(m)
    # gpt-oss-120b: MXFP4 experts (4.25 bits) + BF16 rest, ~65 GB; all-BF16 would be ~234 GB.
    gpt = get_model("gpt-oss-120b")
    assert weights_bytes(gpt) == pytest.approx(gpt.expert_params * 4.25 / 8 + gpt.dense_params * 2, rel=1e-9)
    assert weights_bytes(gpt) == pytest.approx(65.2e9, rel=0.01)
    assert weights_bytes(gpt, "bf16") == pytest.approx(233.7e9, rel=0.01)
    # DeepSeek-V3 ships FP8: ~673 GB, ~84 GB per GPU on 8.
    assert weights_bytes_per_gpu("deepseek-v3", 8) == pytest.approx(84.1e9, rel=0.01)
    with pytest.raises(ConfigError, match="unknown weight dtype 'fp3'"):
        weights_bytes("llama-3.1-8b", "fp3")


def test_lesson_replica_capacity_within_five_percent():
    cap = kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 4, gpu_memory_utilization=0.9,
                      gpu_memory_bytes=LESSON_GPU_BYTES)
    assert (cap.gpu_memory_bytes, cap.gpu_memory_source) == (80_000_000_000, "override")
    assert cap.usable_bytes_per_gpu == 72_000_000_000
    assert cap.weights_bytes_per_gpu == pytest.approx(35.3e9, rel=0.01)
    assert cap.kv_tokens == pytest.approx(LESSON_KV_TOKENS, rel=0.05)
    # Pinned so a change to the activation or overhead model is a visible decision.
    assert (cap.kv_blocks, cap.kv_tokens) == (26_093, 417_488)
    assert cap.kv_tokens == cap.kv_blocks * cap.block_size
    assert cap.available_kv_bytes_per_gpu == (cap.usable_bytes_per_gpu - cap.weights_bytes_per_gpu
                                              - cap.activation_peak_bytes - cap.overhead_bytes)
    assert cap.kv_blocks == cap.available_kv_bytes_per_gpu // (16 * 81_920)


def test_capacity_is_sized_from_the_memory_cuda_reports_unless_overridden():
    h100 = get_gpu("h100-sxm-80gb")
    assert h100.cuda_total_bytes == round(79.22 * 2**30)  # vLLM's "total_gpu_memory (79.22GiB)"
    cap = kv_capacity("llama-3.1-70b", h100, 4)
    assert (cap.gpu_memory_bytes, cap.gpu_memory_source) == (h100.cuda_total_bytes, "cuda")
    assert cap.usable_bytes_per_gpu == int(h100.cuda_total_bytes * 0.9)
    lesson = kv_capacity("llama-3.1-70b", h100, 4, gpu_memory_bytes=LESSON_GPU_BYTES)
    # 0.9 x 5.06e9 more bytes per GPU is 55,600 tokens more of the 70B's KV (81,920 bytes each per GPU).
    assert cap.kv_tokens - lesson.kv_tokens == pytest.approx(0.9 * (h100.cuda_total_bytes - 80e9) / 81_920, abs=16)
    # an int is taken as is; the H200's larger total gives more blocks than its override to 80e9
    assert kv_capacity("llama-3.1-8b", "h200-sxm-141gb", 1, gpu_memory_bytes=80 * 10**9).kv_blocks < \
        kv_capacity("llama-3.1-8b", "h200-sxm-141gb", 1).kv_blocks


def test_fp8_kv_doubles_the_blocks():
    bf16 = kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 4)
    fp8 = kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 4, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token // 2
    assert fp8.kv_blocks in (2 * bf16.kv_blocks, 2 * bf16.kv_blocks + 1)


def test_gpt_oss_120b_fits_one_80gb_gpu_only_with_mxfp4_experts():
    # Reference 000_*.txt quotes the model card: MXFP4 MoE weights make it "run on a single 80GB GPU".
    cap = kv_capacity("gpt-oss-120b", "h100-sxm-80gb", 1)
    assert cap.weight_dtype == "bf16" and cap.expert_weight_dtype == "mxfp4"
    assert cap.kv_blocks > 0
    with pytest.raises(ConfigError, match=r"gpt-oss-120b in bf16 does not fit on h100-sxm-80gb .*short by"):
        kv_capacity("gpt-oss-120b", "h100-sxm-80gb", 1, weight_dtype="bf16")


def test_does_not_fit_says_by_how_much_and_what_to_try():
    with pytest.raises(ConfigError) as err:
        kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 1)
    msg = str(err.value)
    assert msg.startswith("llama-3.1-70b in bf16 does not fit on h100-sxm-80gb at tensor_parallel_size 1: ")
    assert "141.1 GB of weights" in msg and "> 76.6 GB usable (0.9 x 85.06 GB)" in msg
    assert "short by 66." in msg and "try tensor_parallel_size >= 2 or a smaller weight dtype" in msg
    # On the lesson's 80e9-byte cards bf16 needs TP4, FP8 weights fit at TP2.
    with pytest.raises(ConfigError, match=r"> 72.0 GB usable \(0.9 x 80 GB\).*try tensor_parallel_size >= 4"):
        kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 2, gpu_memory_bytes=80e9)
    with pytest.raises(ConfigError, match="try tensor_parallel_size >= 2"):
        kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 1, weight_dtype="fp8", gpu_memory_bytes=80e9)
    assert kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 2, weight_dtype="fp8", gpu_memory_bytes=80e9).kv_blocks > 0
    # on the 79.22 GiB CUDA reports, FP8 weights leave one H100 about 6,000 tokens of KV
    assert 5_000 < kv_capacity("llama-3.1-70b", "h100-sxm-80gb", 1, weight_dtype="fp8").kv_tokens < 7_000


def test_num_gpu_blocks_override_sets_the_blocks_but_weights_must_fit():
    cap = kv_capacity("llama-3.1-8b", "a100-sxm-80gb", 1, num_gpu_blocks_override=1000, block_size=32)
    assert (cap.kv_blocks, cap.kv_tokens, cap.num_gpu_blocks_override) == (1000, 32_000, 1000)
    with pytest.raises(ConfigError, match="does not fit"):
        kv_capacity("llama-3.1-405b", "h100-sxm-80gb", 1, num_gpu_blocks_override=1000)
    with pytest.raises(ConfigError, match="num_gpu_blocks_override: got 0"):
        kv_capacity("llama-3.1-8b", "a100-sxm-80gb", 1, num_gpu_blocks_override=0)


def test_max_model_len_must_fit_when_given():
    with pytest.raises(ConfigError, match="fewer than max_model_len 131,072"):
        kv_capacity("gpt-oss-120b", "h100-sxm-80gb", 1, max_model_len=131_072)
    assert kv_capacity("gpt-oss-120b", "h100-sxm-80gb", 1, max_model_len=16_000).kv_tokens >= 16_000


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"tp": 0}, "tensor_parallel_size: got 0, expected a positive integer"),
    ({"tp": 3}, "tensor_parallel_size: got 3, expected a divisor of llama-3.1-70b's 64 attention heads"),
    ({"tp": True}, "tensor_parallel_size: got True"),
    ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization: got 0.0, expected a value in \(0, 1\]"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: got 1.5"),
    ({"gpu_memory_utilization": "0.9"}, "gpu_memory_utilization: got '0.9'"),
    ({"block_size": 24}, "block_size: got 24, expected one of 1, 2, 4, 8, 16, 32, 64, 128"),
    ({"kv_cache_dtype": "int8"}, "unknown kv_cache_dtype 'int8'; known: auto"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens: got 0"),
    ({"gpu_memory_bytes": 5e8}, r"gpu_memory_bytes: got 500000000.0, expected bytes of memory per GPU, from 1e9"),
    ({"gpu_memory_bytes": float("inf")}, "gpu_memory_bytes: got inf"),
    ({"gpu_memory_bytes": "80e9"}, "gpu_memory_bytes: got '80e9'"),
    ({"model": "llama-5"}, "unknown model 'llama-5'"),
    ({"gpu": "tpu-v5"}, "unknown gpu 'tpu-v5'"),
])
def test_invalid_inputs_name_the_parameter(kwargs, pattern):
    args = {"model": "llama-3.1-70b", "gpu": "h100-sxm-80gb", "tp": 4} | kwargs
    with pytest.raises(ConfigError, match=pattern):
        kv_capacity(args.pop("model"), args.pop("gpu"), args.pop("tp"), **args)


def test_to_dict_is_json_safe():
    cap = kv_capacity("mixtral-8x7b", "h100-sxm-80gb", 2, kv_cache_dtype="fp8", weight_dtype="fp8")
    data = cap.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["model"] == "mixtral-8x7b" and data["gpu"] == "h100-sxm-80gb"
    assert data["expert_weight_dtype"] == "fp8"
    assert isinstance(cap, Capacity) and cap.num_gpus == 2


def test_activation_and_overhead_terms():
    # The sampler's full-vocabulary logits dominate at the default 256 rows ...
    act = activation_peak_bytes("llama-3.1-70b", 4)
    assert act == 8192 * 8192 * 2 + 256 * 128_256 * 40
    # ... and the layer activations take over at TP1 with 8192 tokens.
    assert activation_peak_bytes("llama-3.1-70b", 1) == 8192 * 2 * (2 * 8192 + 3 * 28672)
    # non-torch memory: 0.25 GiB of kernels, plus 0.75 GiB of NCCL buffers at TP > 1; no CUDA
    # context or graphs (vLLM v0.15 charges neither)
    assert overhead_bytes(1) == 0.25 * 2**30 and overhead_bytes(8) == 1.0 * 2**30


def _blocks(model_id, gpu_id, tp, **kwargs) -> int:
    """Blocks, with "does not fit" counted as 0."""
    try:
        return kv_capacity(model_id, gpu_id, tp, **kwargs).kv_blocks
    except ConfigError as err:
        assert "does not fit" in str(err)
        return 0


@st.composite
def setups(draw):
    model = get_model(draw(st.sampled_from(sorted(MODELS))))
    tps = [t for t in (1, 2, 4, 8, 16) if model.num_attention_heads % t == 0
           and (model.is_mla or model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)]
    return model.id, get_gpu(draw(st.sampled_from(sorted(GPUS)))).id, draw(st.sampled_from(tps))


@settings(max_examples=150, deadline=None)
@given(setups(), st.floats(0.05, 1.0), st.floats(0.05, 1.0), st.sampled_from([1, 16, 128]))
def test_blocks_never_decrease_with_utilization(setup, u1, u2, block_size):
    lo, hi = sorted((u1, u2))
    assert _blocks(*setup, gpu_memory_utilization=lo, block_size=block_size) <= _blocks(
        *setup, gpu_memory_utilization=hi, block_size=block_size)


@settings(max_examples=150, deadline=None)
@given(setups(), st.integers(1, 65_536), st.integers(1, 65_536), st.integers(1, 2048))
def test_blocks_never_increase_with_max_num_batched_tokens(setup, t1, t2, seqs):
    lo, hi = sorted((t1, t2))
    assert _blocks(*setup, max_num_batched_tokens=lo, max_num_seqs=seqs) >= _blocks(
        *setup, max_num_batched_tokens=hi, max_num_seqs=seqs)


@settings(max_examples=150, deadline=None)
@given(setups(), st.sampled_from(["fp8", "fp8_e4m3", "fp8_e5m2"]), st.floats(0.3, 1.0))
def test_fp8_kv_never_yields_fewer_blocks(setup, fp8, util):
    assert _blocks(*setup, kv_cache_dtype=fp8, gpu_memory_utilization=util) >= _blocks(
        *setup, gpu_memory_utilization=util)
