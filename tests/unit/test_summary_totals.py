"""summary.json's totals of Int32 request columns are summed in 64 bits: a day's served prompts
pass 2^31 tokens, where polars' own sum of an Int32 column wraps (cost per million tokens then
came out negative)."""

from __future__ import annotations

import polars as pl
import pytest

from replay.config import EngineArgs, FleetConfig, PoolConfig
from replay.run import replay_trace
from traces import LoadedTrace, cast_to_schema

PROMPT = 128_000
N = 2**31 // PROMPT + 200  # served prompts: past 2^31 tokens


def test_served_prompt_tokens_past_2_31_price_every_token():
    frame = cast_to_schema(pl.DataFrame({
        "arrival_us": [i * 2_000_000 for i in range(N)], "prompt_tokens": [PROMPT] * N, "output_tokens": [1] * N}),
        source="long prompts")
    cfg = FleetConfig(model="llama-3.1-8b", tick_s=60.0, pools=(PoolConfig(
        name="default", replicas=16, engine=EngineArgs(num_gpu_blocks_override=9000, max_model_len=131072)),))
    out = replay_trace(LoadedTrace(frame, "long", "synthetic", 16, "", {}, 0), cfg)
    s = out.summary
    assert s["finished"] == N
    served = int(out.requests["prompt_tokens"].cast(pl.Int64).sum())
    assert served == N * PROMPT > 2**31
    assert s["cost_per_mtok_all_usd"] == pytest.approx(s["cost_usd"] / (served + N) * 1e6, abs=1e-4)
    assert s["cost_per_mtok_all_usd"] > 0
