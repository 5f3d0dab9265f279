"""The roofline step model against hand-computed values."""

from __future__ import annotations

import math

import pytest

from replay.model.stepmodel import StepShape, step_params, step_time_us_nb

# Llama-3.1-8B in BF16 on one H100 SXM: 16 GB of weights, 128 KiB of KV per token.
H100_8B = StepShape(
    active_params=8.0e9, num_layers=32, num_attention_heads=32, head_dim=128, hidden_size=4096, tp=1,
    weights_bytes_per_gpu=16.0e9, kv_bytes_per_token_per_gpu=131072.0, peak_flops=989e12,
    hbm_bytes_per_s=3.35e12, link_bytes_per_s=450e9,
)


def test_small_decode_is_memory_bound_weights_plus_kv():
    p = step_params(H100_8B, mfu=0.5, mbu=0.65, per_step_overhead_us=1000, per_seq_overhead_us=10)
    # one sequence at 1,000 tokens of context: read 16 GB + 1,001 tokens of KV at 65% of 3.35 TB/s
    memory_us = (16.0e9 + 131072 * (1000 + 1)) / (3.35e12 * 0.65) * 1e6
    assert step_time_us_nb(p, 0, 0.0, 0, 1, 1000, 1) == math.ceil(memory_us + 1000 + 10)


def test_long_prefill_is_compute_bound():
    p = step_params(H100_8B, mfu=0.5, mbu=0.65, per_step_overhead_us=1000, per_seq_overhead_us=10)
    tokens = 8192
    pairs = tokens * (tokens + 1) / 2
    flops = 2 * 8.0e9 * tokens + 4 * 32 * 32 * 128 * pairs
    compute_us = flops / (989e12 * 0.5) * 1e6
    assert compute_us > (16.0e9 + 131072 * tokens) / (3.35e12 * 0.65) * 1e6  # really compute-bound
    assert step_time_us_nb(p, tokens, pairs, 0, 0, 0, 1) == math.ceil(compute_us + 1000 + 10)


def test_tensor_parallel_adds_allreduce_traffic_and_latency():
    shape = StepShape(**{**H100_8B.__dict__, "tp": 4, "active_params": 70.0e9, "num_layers": 80,
                         "num_attention_heads": 64, "hidden_size": 8192, "weights_bytes_per_gpu": 35.3e9,
                         "kv_bytes_per_token_per_gpu": 81920.0})
    p = step_params(shape, mfu=0.5, mbu=0.65, per_step_overhead_us=0, per_seq_overhead_us=0,
                    allreduce_latency_us=6)
    tokens = 64
    compute_us = (2 * 70.0e9 / 4 * tokens + 4 * 80 * 64 * 128 / 4 * 64 * 500) / (989e12 * 0.5) * 1e6
    memory_us = (35.3e9 + 81920 * (64 * 500 + tokens)) / (3.35e12 * 0.65) * 1e6
    # 160 all-reduces, each of fixed latency 6 us x log2(4) (a tree over four GPUs) plus its traffic
    comm_us = 2 * 80 * 8192 * 2 * 2 * 3 / 4 * tokens / 450e9 * 1e6 + 2 * 80 * 6 * 2
    expected = max(compute_us, memory_us) + comm_us
    assert step_time_us_nb(p, 0, 0.0, 0, tokens, 64 * 500, tokens) == math.ceil(expected)


def test_overheads_are_never_zero_by_default_and_time_grows_with_batch():
    p = step_params(H100_8B)
    empty = step_time_us_nb(p, 0, 0.0, 0, 0, 0, 0)
    assert empty > 0
    times = [step_time_us_nb(p, 0, 0.0, 0, n, n * 1000, n) for n in (1, 8, 64, 256)]
    assert times == sorted(times) and times[0] < times[-1]


@pytest.mark.parametrize("seqs", [1, 32, 256])
def test_fewer_bytes_per_weight_is_a_faster_decode(seqs):
    fp8 = StepShape(**{**H100_8B.__dict__, "weights_bytes_per_gpu": 8.0e9})
    slow = step_time_us_nb(step_params(H100_8B), 0, 0.0, 0, seqs, seqs * 1000, seqs)
    fast = step_time_us_nb(step_params(fp8), 0, 0.0, 0, seqs, seqs * 1000, seqs)
    assert fast < slow


def test_a_prefill_chunk_reads_the_kv_of_its_context():
    """A short suffix after a long cached prefix still reads the prefix's KV from HBM."""
    p = step_params(H100_8B, mfu=0.5, mbu=0.65, per_step_overhead_us=0, per_seq_overhead_us=0)
    new, ctx = 64, 100_000
    memory_us = (16.0e9 + 131072 * (ctx + new)) / (3.35e12 * 0.65) * 1e6
    pairs = new * ctx + new * (new + 1) / 2
    compute_us = (2 * 8.0e9 * new + 4 * 32 * 32 * 128 * pairs) / (989e12 * 0.5) * 1e6
    assert step_time_us_nb(p, new, pairs, ctx, 0, 0, 1) == math.ceil(max(memory_us, compute_us))
    assert step_time_us_nb(p, new, pairs, ctx, 0, 0, 1) > step_time_us_nb(p, new, pairs, 0, 0, 0, 1)


def test_kv_reads_and_routed_experts_stream_at_their_own_share_of_bandwidth():
    # 64 sequences at 1,000 tokens of context: 8.4 GB of KV beside the 16 GB of weights
    base = dict(mfu=0.5, mbu=0.65, per_step_overhead_us=0, per_seq_overhead_us=0)
    kv = 131072 * 64 * 1001
    same = step_time_us_nb(step_params(H100_8B, **base), 0, 0.0, 0, 64, 64 * 1000, 64)
    assert step_time_us_nb(step_params(H100_8B, **base, attention_mbu=0.65), 0, 0.0, 0, 64, 64 * 1000, 64) == same
    fast_kv = step_time_us_nb(step_params(H100_8B, **base, attention_mbu=0.9), 0, 0.0, 0, 64, 64 * 1000, 64)
    assert fast_kv == math.ceil((16.0e9 / 0.65 + kv / 0.9) / 3.35e12 * 1e6)
    # an MoE model whose experts hold 12 of its 16 GB: one token touches 2 of 8 experts' 1.5 GB each
    moe = StepShape(**{**H100_8B.__dict__, "expert_weights_bytes_per_gpu": 12.0e9, "expert_active_params": 1.5e9,
                       "num_experts": 8, "experts_per_token": 2, "moe_layers": 32})
    slow_experts = step_time_us_nb(step_params(moe, **base, expert_mbu=0.4), 0, 0.0, 0, 1, 1000, 1)
    dense_part, experts = 4.0e9, 2 * 1.5e9
    assert slow_experts == math.ceil((dense_part / 0.65 + experts / 0.4 + 131072 * 1001 / 0.65) / 3.35e12 * 1e6)
