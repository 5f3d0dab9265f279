"""The step model's terms against the arithmetic of ../shared/reference/000_*.txt (sections 02-07):
weight precision, FP8 KV, KV offload, multi-LoRA, MoE and expert parallelism, speculative
decoding, long context and the prefill/decode break-even bandwidth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.model import stepmodel as sm
from llm_replay.app import main
from replay.model.memory import kv_bytes_per_token
from replay.model.specs import get_gpu, get_model, weight_bits
from replay.model.stepmodel import DraftShape, ExpertParallel, StepShape, step_params, step_time_us_nb
from replay.model.stepterms import (
    all_to_all_us,
    break_even_bytes_per_s,
    expected_experts_touched,
    lora_adapter_params,
    spec_credit_table,
    spec_expected_tokens,
    transfer_share,
)

GB, MB = 1e9, 1e6
H100 = get_gpu("h100-sxm-80gb")
# Only the term under test: no overheads, full efficiencies.
BARE = {"mfu": 1.0, "mbu": 1.0, "per_step_overhead_us": 0.0, "per_seq_overhead_us": 0.0, "allreduce_latency_us": 0.0}


def shape_8b(**kw) -> StepShape:
    base = dict(active_params=8.0e9, num_layers=32, num_attention_heads=32, head_dim=128, hidden_size=4096, tp=1,
                weights_bytes_per_gpu=16.0e9, kv_bytes_per_token_per_gpu=131072.0, peak_flops=989.4e12,
                hbm_bytes_per_s=3.35e12, link_bytes_per_s=450e9)
    return StepShape(**{**base, **kw})


# --- section 02: prefill/decode break-even bandwidth -----------------------------------------


def test_break_even_table_of_the_reference():
    f = 4.0e14
    rows = [(32, 8, 128, 2, 8.0e9), (80, 8, 128, 2, 70.0e9), (80, 8, 128, 1, 70.0e9)]
    got = []
    for layers, heads, dim, nbytes, params in rows:
        c = 2 * layers * heads * dim * nbytes
        got.append((round(c / 1024), round(break_even_bytes_per_s(c, f, params) / 1e9, 2)))
    assert got == [(128, 3.28), (320, 0.94), (160, 0.47)]
    c70 = 2 * 80 * 8 * 128 * 2
    assert round(c70 * 8192 / 2**30, 2) == 2.5  # GiB to move for an 8k-token prompt
    shares = [round(transfer_share(c70, f, 70e9, bw) * 100, 1) for bw in (450e9, 64e9, 50e9, 3.125e9)]
    assert shares == [0.2, 1.5, 1.9, 30.0]


def test_break_even_from_the_catalog_matches_the_lesson_kv_sizes():
    """The catalog's KV per token is the reference's; W* differs from its table only by the exact
    parameter counts (8.03e9 and 70.55e9 against its round 8e9 and 70e9)."""
    assert kv_bytes_per_token("llama-3.1-8b") == 128 * 1024
    assert kv_bytes_per_token("llama-3.1-70b") == 320 * 1024
    assert kv_bytes_per_token("llama-3.1-70b", "fp8") == 160 * 1024


def test_capacity_break_even_cli_prints_the_table(capsys):
    assert main(["capacity", "--break-even", "--flops", "4e14", "--json"]) == 0
    rows = {(r["model"], r["kv_cache_dtype"]): r for r in json.loads(capsys.readouterr().out)}
    for key, ref_gb_s in {("llama-3.1-8b", "auto"): 3.28, ("llama-3.1-70b", "auto"): 0.936,
                          ("llama-3.1-70b", "fp8"): 0.468}.items():
        assert rows[key]["break_even_bytes_per_s"] / 1e9 == pytest.approx(ref_gb_s, rel=0.01)
    assert rows[("llama-3.1-70b", "auto")]["transfer_share"]["eth-25g"] == pytest.approx(0.2996, rel=0.01)
    assert main(["capacity", "--break-even", "--model", "llama-3.1-70b", "--flops", "4e14"]) == 0
    text = capsys.readouterr().out
    assert "llama-3.1-70b" in text and "0.93" in text and "0.46" in text and "llama-3.1-8b" not in text


def test_capacity_break_even_on_a_gpu_uses_the_mfu_its_pools_run_at(capsys):
    from replay.calibration.profiles import default_coefficients

    mfu = default_coefficients("h100-sxm-80gb")["mfu"]
    assert main(["capacity", "--break-even", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--json"]) == 0
    rows = {r["kv_cache_dtype"]: r for r in json.loads(capsys.readouterr().out)}
    w = break_even_bytes_per_s(320 * 1024, H100.bf16_flops * mfu, get_model("llama-3.1-70b").active_params)
    assert rows["auto"]["break_even_bytes_per_s"] == pytest.approx(w)


def test_capacity_break_even_without_gpu_or_flops_is_a_usage_error(capsys):
    assert main(["capacity", "--break-even"]) == 2
    assert "--gpu" in capsys.readouterr().err
    assert main(["capacity", "--model", "llama-3.1-8b"]) == 2


# --- section 03: KV offload, decode KV read linear in context ------------------------------------


def test_decode_reads_the_whole_kv_cache_every_step():
    """32 requests at 8,192 tokens on the 70B: 85.9 GB per step, 25.6 ms over HBM3 at 3.35 TB/s,
    1.34 s over PCIe Gen5 x16 (a 52x slowdown); W* = 0.94 GB/s is 68x below PCIe."""
    kv = 320 * 1024
    ctx = 32 * 8192
    assert round(ctx * kv / GB, 1) == 85.9
    p = step_params(shape_8b(weights_bytes_per_gpu=0.0, kv_bytes_per_token_per_gpu=float(kv), active_params=1.0),
                    **BARE)
    assert step_time_us_nb(p, 0, 0.0, 0, 32, ctx, 32) / 1000 == pytest.approx(25.6, abs=0.05)
    pcie = step_params(shape_8b(weights_bytes_per_gpu=0.0, kv_bytes_per_token_per_gpu=float(kv), active_params=1.0,
                                hbm_bytes_per_s=64e9), **BARE)
    slow = step_time_us_nb(pcie, 0, 0.0, 0, 32, ctx, 32)
    assert slow / 1e6 == pytest.approx(1.34, abs=0.01)
    assert round(slow / step_time_us_nb(p, 0, 0.0, 0, 32, ctx, 32)) == 52
    assert round(64e9 / break_even_bytes_per_s(kv, 4e14, 70e9)) == 68


def test_decode_kv_bytes_are_linear_and_prefill_attention_quadratic_in_context():
    p = step_params(shape_8b(weights_bytes_per_gpu=0.0), **BARE)
    kv_us = [step_time_us_nb(p, 0, 0.0, 0, 1, n, 1) for n in (100_000, 200_000, 400_000)]
    assert kv_us[1] / kv_us[0] == pytest.approx(2.0, rel=1e-3) and kv_us[2] / kv_us[1] == pytest.approx(2.0, rel=1e-3)
    p = step_params(shape_8b(), **BARE)

    def prefill(n):  # one chunk of n prompt tokens from scratch: n (n + 1) / 2 attention pairs
        return step_time_us_nb(p, n, n * (n + 1) / 2.0, 0, 0, 0, 1)

    # Short prompts are dominated by the linear matmuls; at 128K tokens attention dominates.
    assert prefill(2048) / prefill(1024) == pytest.approx(2.0, rel=0.1)
    assert prefill(131072) / prefill(65536) > 3.0


def test_fp8_kv_halves_kv_bytes_per_token_in_the_step_model_and_doubles_the_cache():
    from replay.fleet.cluster import plan_pools
    from replay.config import EngineArgs, FleetConfig, PoolConfig

    def plan(dtype):
        pool = PoolConfig(tensor_parallel_size=4, engine=EngineArgs(kv_cache_dtype=dtype))
        return plan_pools(FleetConfig(model="llama-3.1-70b", pools=(pool,)))[0]

    auto, fp8 = plan("auto"), plan("fp8")
    assert fp8.step_params[sm.KV_BYTES_PER_TOKEN] * 2 == auto.step_params[sm.KV_BYTES_PER_TOKEN] == 80 * 1024
    assert fp8.capacity.kv_tokens == pytest.approx(2 * auto.capacity.kv_tokens, rel=1e-3)


# --- section 04: multi-LoRA ----------------------------------------------------------------------


def test_lora_adapter_sizes_of_the_reference():
    m = get_model("llama-3.1-8b")  # q (4096, 4096), k and v (1024, 4096), o (4096, 4096); 32 layers
    got = {r: (round(lora_adapter_params(m, r) / MB, 2), round(lora_adapter_params(m, r) * 2 / MB, 1))
           for r in (8, 16, 64)}
    assert got == {8: (6.82, 13.6), 16: (13.63, 27.3), 64: (54.53, 109.1)}
    assert round(lora_adapter_params(m, 8) * 2 * 1000 / GB, 1) == 13.6  # 1000 adapters


def test_lora_step_cost_table_of_the_reference():
    """A memory-bound decode step reads 16 GB of base weights plus one adapter per distinct
    adapter in the batch: rank 16 at 1/32/128 adapters is 1.002x/1.055x/1.218x longer, rank 64
    1.007x/1.218x/1.872x."""
    m = get_model("llama-3.1-8b")
    table = {}
    for r in (16, 64):
        adapter = lora_adapter_params(m, r) * 2
        # (a slow memory keeps whole-microsecond rounding out of the third decimal)
        p = step_params(shape_8b(kv_bytes_per_token_per_gpu=0.0, active_params=1.0, hbm_bytes_per_s=3.35e9),
                        **BARE, lora_bytes_per_adapter=adapter, lora_flops_per_token=1.0)
        base = step_time_us_nb(p, 0, 0.0, 0, 1, 0, 1)
        for n in (1, 32, 128):
            table[(r, n)] = (round(n * adapter / GB, 2), round(step_time_us_nb(p, 0, 0.0, 0, 1, 0, 1, 0, n) / base, 3))
    assert table == {(16, 1): (0.03, 1.002), (16, 32): (0.87, 1.055), (16, 128): (3.49, 1.218),
                     (64, 1): (0.11, 1.007), (64, 32): (3.49, 1.218), (64, 128): (13.96, 1.872)}


# --- section 05: FP8 and 4-bit weights -----------------------------------------------------------


def test_bits_per_weight_of_the_microscaling_formats():
    assert weight_bits("mxfp4") == 4 + 8 / 32 == 4.25
    assert weight_bits("nvfp4") == 4 + 8 / 16 == 4.5
    assert [round(16 / weight_bits(f), 2) for f in ("mxfp4", "nvfp4")] == [3.76, 3.56]
    # gpt-oss-120b: 120 billion weights at 4.25 bits is 63.75 GB; 240 GB in BF16.
    assert 120e9 * weight_bits("mxfp4") / 8 / GB == 63.75
    assert 120e9 * weight_bits("bf16") / 8 / GB == 240


def test_quantization_sets_bytes_read_memory_fit_and_fp8_tensor_cores():
    from replay.fleet.cluster import plan_pools
    from replay.config import EngineArgs, FleetConfig, PoolConfig

    def plan(quantization, tp=1):
        pool = PoolConfig(tensor_parallel_size=tp, engine=EngineArgs(quantization=quantization))
        return plan_pools(FleetConfig(model="llama-3.1-8b", pools=(pool,)))[0]

    bf16, fp8, awq, mx, nv = (plan(q) for q in (None, "fp8", "awq", "mxfp4", "nvfp4"))
    w = {name: pl.step_params[sm.WEIGHT_BYTES] for name, pl in
         {"bf16": bf16, "fp8": fp8, "awq": awq, "mxfp4": mx, "nvfp4": nv}.items()}
    assert w["bf16"] > w["fp8"] > w["nvfp4"] > w["mxfp4"] > w["awq"]
    assert bf16.capacity.kv_blocks < fp8.capacity.kv_blocks < mx.capacity.kv_blocks
    # The H100 datasheet: 3,958 FP8 against 1,979 BF16 TFLOPS (with sparsity), exactly 2x.
    assert fp8.step_params[sm.FLOPS_RATE] == pytest.approx(2 * bf16.step_params[sm.FLOPS_RATE], rel=1e-3)
    assert awq.step_params[sm.FLOPS_RATE] == bf16.step_params[sm.FLOPS_RATE]  # W4A16: BF16 tensor cores
    decode = [step_time_us_nb(x.step_params, 0, 0.0, 0, 1, 1000, 1) for x in (bf16, fp8, mx)]
    assert decode[0] > decode[1] > decode[2]  # a memory-bound decode step follows the bytes


# --- section 07: MoE and expert parallelism ------------------------------------------------------


def test_deepep_all_to_all_of_the_reference():
    """8K tokens, hidden 7168, top-8, FP8 dispatch and BF16 combine: 470 MB and 940 MB per MoE
    layer; 1.9 ms over NVLink (726 / 740 GB/s), 16.8 ms over RDMA (90 / 81 GB/s), about 9x."""
    dispatch, combine, nvlink = all_to_all_us(8192, 8, 7168, 726e9, 740e9)
    _, _, rdma = all_to_all_us(8192, 8, 7168, 90e9, 81e9)
    assert (round(dispatch / MB), round(combine / MB)) == (470, 940)
    assert (round(nvlink / 1000, 1), round(rdma / 1000, 1)) == (1.9, 16.8)
    assert round(rdma / nvlink) == 9


def _reference_router_imbalance() -> tuple[float, float]:
    """The reference's routing simulation, as printed there (seed 0)."""
    e, k, t = 256, 8, 8192
    rng = np.random.default_rng(0)

    def load(scores):
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        return np.bincount(top.ravel(), minlength=e)

    aff = rng.normal(0, 1, (t, e))
    uniform = load(aff)
    skewed = load(aff + rng.normal(0, 0.6, e))
    return uniform.max() / uniform.mean(), skewed.max() / skewed.mean()


def test_busiest_expert_sets_the_step_under_expert_parallelism():
    uniform, skewed = _reference_router_imbalance()
    assert (round(uniform, 2), round(skewed, 2)) == (1.16, 8.75)
    ds = get_model("deepseek-v3")
    shape = StepShape(active_params=ds.active_params, num_layers=61, num_attention_heads=128, head_dim=128,
                      hidden_size=7168, tp=8, weights_bytes_per_gpu=671e9 / 8, kv_bytes_per_token_per_gpu=70272.0,
                      peak_flops=1978.9e12, hbm_bytes_per_s=3.35e12, link_bytes_per_s=450e9,
                      expert_weights_bytes_per_gpu=ds.expert_params / 8, expert_active_params=ds.expert_active_params,
                      num_experts=256, experts_per_token=8, moe_layers=ds.moe_layers)
    times = {}
    for factor in (1.0, uniform, skewed):
        p = step_params(shape, **BARE, expert_parallel=ExpertParallel(450e9, factor))
        times[factor] = step_time_us_nb(p, 8192, 8192 * 8193 / 2.0, 0, 0, 0, 1)
        expert_share = ds.expert_active_params / ds.active_params
        assert p[sm.FLOPS_PER_TOKEN] == pytest.approx(2 * ds.active_params * (1 - expert_share + expert_share * factor)
                                                      / 8)
    assert times[1.0] < times[uniform] < times[skewed]
    # The all-to-all: per GPU, its 1/8 of the tokens, k copies each, 1 + 2 bytes per element.
    p = step_params(shape, **BARE, expert_parallel=ExpertParallel(450e9, 1.0))
    assert p[sm.A2A_US_PER_TOKEN] == pytest.approx(ds.moe_layers * 8 * 7168 * 3 / 450e9 * 1e6 / 8)
    assert ds.moe_layers == 58  # the first 3 of 61 layers are dense


def test_moe_weights_read_are_the_experts_the_batch_touches():
    ds = get_model("deepseek-v3")
    assert expected_experts_touched(1, 256, 8) == pytest.approx(8.0)
    assert expected_experts_touched(8192, 256, 8) == pytest.approx(256.0)
    from replay.fleet.cluster import plan_pools
    from replay.config import FleetConfig, PoolConfig

    plan = plan_pools(FleetConfig(model="deepseek-v3", gpu="h200-sxm-141gb",
                                  pools=(PoolConfig(tensor_parallel_size=8),)))[0]
    p = plan.step_params
    per_gpu = plan.capacity.weights_bytes_per_gpu
    # Batch 1 decode reads the dense part plus 8 of 256 experts, in FP8 with 16-bit embeddings
    # (one more byte each): ~39 GB over the 8 GPUs, not the 671 GB they hold.
    read_1 = p[sm.WEIGHT_BYTES] + p[sm.EXPERT_BYTES_EACH] * expected_experts_touched(1, 256, 8)
    assert read_1 * 8 == pytest.approx(ds.dense_params + ds.embedding_params + ds.expert_active_params, rel=1e-6)
    assert read_1 < per_gpu / 10
    one = step_time_us_nb(p, 0, 0.0, 0, 1, 1000, 1)
    many = step_time_us_nb(p, 0, 0.0, 0, 256, 256 * 1000, 256)
    assert one < many  # 256 decode tokens touch (nearly) every expert


@given(st.integers(1, 10_000), st.integers(1, 256), st.integers(1, 16))
def test_experts_touched_is_between_k_and_all_and_grows_with_tokens(tokens, experts, top_k):
    top_k = min(top_k, experts)
    touched = expected_experts_touched(tokens, experts, top_k)
    assert top_k - 1e-9 <= touched <= min(experts, tokens * top_k) + 1e-9
    assert expected_experts_touched(tokens + 1, experts, top_k) >= touched - 1e-12


# --- speculative decoding ------------------------------------------------------------------------


def test_expected_tokens_per_verify_step():
    assert spec_expected_tokens(0.0, 4) == 1.0
    assert spec_expected_tokens(0.7, 4) == pytest.approx((1 - 0.7**5) / 0.3) == pytest.approx(2.7731)
    assert spec_expected_tokens(0.999999, 3) == pytest.approx(4.0, rel=1e-5)
    assert list(spec_credit_table(0.5, 3)) == [1_000_000, 1_500_000, 1_750_000, 1_875_000]


@given(st.floats(0.0, 0.99), st.integers(1, 16))
def test_verify_step_yields_between_one_and_k_plus_one_tokens(a, k):
    table = spec_credit_table(a, k)
    assert table[0] == 1_000_000 and all(table[1:] >= table[:-1])
    assert 1_000_000 <= table[-1] <= (k + 1) * 1_000_000


def test_speculation_pays_at_batch_one_and_costs_more_than_it_saves_at_saturation():
    """Decode time per output token, with and without k = 4 drafts at a = 0.7 from a 1B draft
    model: memory-bound batch 1 gains (the weights are read once for ~2.8 tokens); a
    compute-bound batch (1024 sequences of 128 tokens) loses, as rejected drafts are pure waste."""
    p_plain = step_params(shape_8b())
    p_spec = step_params(shape_8b(), draft=DraftShape(4, 2 * 1.24e9, 2.48e9, 32768.0))
    gain = spec_expected_tokens(0.7, 4)

    def per_token(seqs, ctx):
        plain = step_time_us_nb(p_plain, 0, 0.0, 0, seqs, seqs * ctx, seqs) / seqs
        spec = step_time_us_nb(p_spec, 0, 0.0, 0, seqs, seqs * ctx, seqs, 4 * seqs) / (seqs * gain)
        return plain, spec

    plain, spec = per_token(1, 1000)
    assert spec < plain
    flops_us = p_plain[sm.FLOPS_PER_TOKEN] * 1024 / p_plain[sm.FLOPS_RATE] * 1e6
    bytes_us = (p_plain[sm.WEIGHT_BYTES] + p_plain[sm.KV_BYTES_PER_TOKEN] * 1024 * 129) / p_plain[sm.BYTES_RATE] * 1e6
    assert flops_us > bytes_us  # saturated: compute-bound without speculation
    plain, spec = per_token(1024, 128)
    assert spec > 1.5 * plain


def _pool_plan(gpu: str, weight_dtype: str | None, model: str = "llama-3.1-8b", tp: int = 1):
    from replay.config import FleetConfig, PoolConfig
    from replay.fleet.cluster import plan_pools

    pool = PoolConfig(tensor_parallel_size=tp, weight_dtype=weight_dtype)
    return plan_pools(FleetConfig(model=model, gpu=gpu, pools=(pool,)))[0]


def test_fp8_on_an_a100_reads_8_bit_weights_and_computes_at_the_bf16_peak():
    """An A100 (SM80) has no FP8 tensor cores: vLLM runs FP8 checkpoints weight-only through FP8
    Marlin, which streams the 8-bit weights and dequantizes them to BF16 for BF16 tensor cores. So
    a decode step reads about half the bytes and a prefill computes no faster than BF16."""
    a100 = get_gpu("a100-sxm-80gb")
    bf16, fp8 = _pool_plan(a100.id, "bf16"), _pool_plan(a100.id, "fp8")
    # embeddings and lm_head (1.05 of 8.03 B parameters) stay 16-bit in FP8 checkpoints
    assert fp8.step_params[sm.WEIGHT_BYTES] / bf16.step_params[sm.WEIGHT_BYTES] == pytest.approx(
        (1.05 * 2 + 6.98) / (8.03 * 2), abs=0.005)
    assert fp8.step_params[sm.FLOPS_RATE] == bf16.step_params[sm.FLOPS_RATE] == pytest.approx(312e12 * 0.631)
    decode = [step_time_us_nb(p.step_params, 0, 0.0, 0, 1, 1000, 1) for p in (bf16, fp8)]
    prefill = [step_time_us_nb(p.step_params, 8192, 8192 * 4096.0, 0, 0, 0, 1) for p in (bf16, fp8)]
    assert decode[1] < 0.62 * decode[0]
    assert prefill[1] == pytest.approx(prefill[0], rel=0.02)  # compute-bound: the same BF16 tensor cores


@pytest.mark.parametrize("gpu, fp8_peak", [("h100-sxm-80gb", 1978.9e12), ("l40s-48gb", 733e12)])
def test_fp8_on_gpus_with_fp8_tensor_cores_computes_at_the_fp8_peak(gpu, fp8_peak):
    """SM89 (L40S) and SM90 (H100) run FP8 W8A8 on FP8 tensor cores (CUTLASS scaled_mm)."""
    bf16, fp8 = _pool_plan(gpu, "bf16"), _pool_plan(gpu, "fp8")
    assert fp8.step_params[sm.FLOPS_RATE] / bf16.step_params[sm.FLOPS_RATE] == pytest.approx(
        fp8_peak / get_gpu(gpu).bf16_flops)


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "h100-sxm-80gb", "l40s-48gb"])
def test_int8_w8a8_runs_on_int8_tensor_cores_and_weight_only_formats_at_the_bf16_peak(gpu):
    """W8A8 INT8 (CUTLASS int8 GEMM) reaches the INT8 peak: 2x BF16 on an A100, where FP8 cannot;
    8-bit weight-only (w8a16) and 4-bit AWQ / GPTQ (Marlin) compute in BF16."""
    g = get_gpu(gpu)
    rate = {d: _pool_plan(gpu, d).step_params[sm.FLOPS_RATE] for d in ("bf16", "int8", "w8a16", "awq", "gptq")}
    assert rate["int8"] / rate["bf16"] == pytest.approx(g.int8_ops / g.bf16_flops)
    assert rate["w8a16"] == rate["awq"] == rate["gptq"] == rate["bf16"]
    assert g.matmul_flops("int8") >= g.matmul_flops("fp8") >= g.bf16_flops
