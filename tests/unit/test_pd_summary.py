"""summary.json of a prefill/decode run: the prefill pool's figures count the requests it
prefilled, and each pool's prefix hit rate counts only its own prefix-cache hits (KV that
arrived from the prefill pool is no hit)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from replay.config import EngineArgs, FleetConfig, PoolConfig, SplitConfig
from replay.run import replay_trace
from traces import LoadedTrace, cast_to_schema

BLOCK_TOKENS = 256


def shared_prefix_trace(n: int = 120) -> LoadedTrace:
    """Prompts of 7 shared blocks of 256 tokens and one of their own (every 10th: its own prefix)."""
    hashes = [([1, 2, 3, 4, 5, 6, 7] if i % 10 else [500 + i, 600 + i, 700 + i]) + [1000 + i] for i in range(n)]
    frame = cast_to_schema(pl.DataFrame({
        "arrival_us": [i * 100_000 for i in range(n)], "prompt_tokens": [len(h) * BLOCK_TOKENS for h in hashes],
        "output_tokens": [20 + i % 30 for i in range(n)], "prefix_hashes": hashes}), source="shared")
    return LoadedTrace(frame, "shared", "synthetic", BLOCK_TOKENS, "", {}, 0)


def pd_fleet(local_prefill_threshold: int) -> FleetConfig:
    engine = EngineArgs(num_gpu_blocks_override=2000, max_model_len=7000)
    return FleetConfig(model="llama-3.1-8b",
                       split=SplitConfig(policy="prefill-decode", local_prefill_threshold=local_prefill_threshold),
                       pools=(PoolConfig(name="prefill", replicas=1, engine=engine),
                              PoolConfig(name="decode", replicas=2, engine=engine)))


def _rate(reqs: pl.DataFrame) -> float | None:
    admitted = reqs.filter(pl.col("first_scheduled_us").is_not_null())
    return round(admitted["cached_tokens"].sum() / admitted["prompt_tokens"].sum(), 4) if admitted.height else None


@pytest.mark.parametrize("threshold", [0, 1000])
def test_a_pools_figures_are_the_requests_it_served_and_its_own_cache_hits(threshold):
    out = replay_trace(shared_prefix_trace(), pd_fleet(threshold))
    req, pools = out.requests, out.summary["pools"]
    remote = req.filter(pl.col("prefill_pool") == "prefill")
    local = req.filter(pl.col("prefill_pool").is_null())
    assert remote.height > 0 and (threshold == 0) == (local.height == 0)
    # the prefill pool's column counts what it prefilled (today's table said 0 requests)
    assert pools["prefill"]["requests"] == remote.height
    assert pools["prefill"]["finished"] == remote.filter(pl.col("status") == "finished").height
    assert pools["prefill"]["ttft_p50_ms"] is not None
    assert pools["decode"]["requests"] == req.height == out.summary["requests"]
    # hit rates: the prefill pool's over its prefills, the decode pool's over its local prefills only
    assert pools["prefill"]["prefix_hit_rate"] == pytest.approx(_rate(remote), abs=1e-4)
    assert pools["decode"]["prefix_hit_rate"] == (None if threshold == 0 else pytest.approx(_rate(local), abs=1e-4))
    assert out.summary["prefix_hit_rate"] == pytest.approx(_rate(req), abs=1e-4)
    assert 0.5 < out.summary["prefix_hit_rate"] < 0.9  # the shared blocks hit, the transferred KV does not


def test_without_prefill_decode_a_pool_is_the_requests_routed_to_it():
    cfg = dataclasses.replace(pd_fleet(0), split=SplitConfig(), pools=(
        PoolConfig(name="a", replicas=1, workloads=("x",)), PoolConfig(name="b", replicas=1)))
    trace = shared_prefix_trace(40)
    trace = dataclasses.replace(trace, frame=trace.frame.with_columns(
        workload=pl.when(pl.int_range(pl.len()) % 2 == 0).then(pl.lit("x")).otherwise(pl.lit("y"))))
    out = replay_trace(trace, cfg)
    pools = out.summary["pools"]
    assert pools["a"]["requests"] == pools["b"]["requests"] == 20


@pytest.mark.parametrize("transfer", ["serial", "layerwise"])
def test_kv_transfer_us_is_the_whole_transfer_and_the_interval_what_outlasts_the_prefill(transfer):
    """A serial transfer shows whole (kv_transfer_us is its interval to the microsecond: the
    formula is the engines'); a layerwise one hides part of itself behind the prefill."""
    cfg = dataclasses.replace(pd_fleet(0), split=SplitConfig(policy="prefill-decode", transfer=transfer,
                                                              link="eth-25g"))
    req = replay_trace(shared_prefix_trace(), cfg).requests
    moved = req.filter(pl.col("kv_transfer_end_us").is_not_null())
    assert moved.height == req.height and req["kv_transfer_us"].null_count() == 0
    shown = moved["kv_transfer_end_us"] - moved["kv_transfer_start_us"]
    if transfer == "serial":
        assert (shown == moved["kv_transfer_us"]).all()
    else:
        assert (shown <= moved["kv_transfer_us"]).all() and (shown < moved["kv_transfer_us"]).any()
        # what was hidden is at most the prefill (from its admission to its end)
        hidden = moved["kv_transfer_us"] - shown
        assert (hidden <= moved["prefill_end_us"] - moved["first_scheduled_us"]).all()


def test_kv_transfer_us_is_null_without_prefill_decode():
    cfg = dataclasses.replace(pd_fleet(0), split=SplitConfig(), pools=(PoolConfig(name="a", replicas=1),))
    req = replay_trace(shared_prefix_trace(20), cfg).requests
    assert req["kv_transfer_us"].dtype == pl.Int64 and req["kv_transfer_us"].null_count() == req.height


@pytest.mark.parametrize("threshold", [0, 1000])
def test_a_spilled_pd_runs_figures_are_those_of_its_rows_in_one_frame(monkeypatch, tmp_path, threshold):
    """Rows spilled past 30 to their Parquet file as they come (replay/outputs/rows.py): the tick windows and
    summary, transfer figures and prefill pool's saturation included, come from the file a batch
    of rows at a time (percentiles by replay/fleet/selection.py) and equal those of the rows held whole."""
    from polars.testing import assert_frame_equal

    import replay.fleet.selection as selection
    import replay.outputs.rows as rows

    whole = replay_trace(shared_prefix_trace(), pd_fleet(threshold))
    assert not whole.request_rows.spilled
    monkeypatch.setattr(rows, "MEMORY_ROWS", 30)
    # percentiles from batches of 16 rows, each search narrowed until it holds 5 values at most
    monkeypatch.setattr(selection, "HELD", 5)
    monkeypatch.setattr(selection, "BATCH_ROWS", 16)
    spilled = replay_trace(shared_prefix_trace(), pd_fleet(threshold), spill_dir=tmp_path / "run")
    assert spilled.request_rows.spilled
    assert spilled.summary["prefill_decode"]["remote_prefills"] > 0
    assert spilled.summary == whole.summary
    assert_frame_equal(spilled.ticks, whole.ticks)
