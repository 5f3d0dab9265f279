"""Observed series to pools and replicas by their labels, then onto the tick grid: gauges
summed or averaged, counters as rates, histograms as quantiles, renamed metrics once."""

from __future__ import annotations

import numpy as np
import pytest

from tests.observed_files import write_json
from traces.observed import Grid, ObservedConfig, align, read_observed, select
from traces.observed.mapping import pod_owners

T0 = 1_700_000_000.0
TIMES = np.arange(0.0, 601.0, 15.0)


def _series(name, labels, values):
    return (name, labels, [(T0 + t, float(v)) for t, v in zip(TIMES, values)])


def _read(tmp_path, series, pools=("chat", "batch"), config=None, **kw):
    observed = read_observed([write_json(tmp_path / "obs.json", series)])
    config = config or ObservedConfig()
    return select(observed, config, list(pools), (0.0, 600.0), T0, **kw), config


def test_pods_map_to_their_deployment_and_the_pool_of_that_name(tmp_path):
    mapped, _ = _read(tmp_path, [
        _series("vllm:num_requests_waiting", {"pod": "chat-7f9c6d5b4-abcde"}, TIMES * 0),
        _series("vllm:num_requests_waiting", {"pod": "batch-0"}, TIMES * 0),
        _series("kube_deployment_status_replicas", {"deployment": "chat", "pod": "kube-state-metrics-6d4-x"}, TIMES * 0),
        _series("vllm:num_requests_running", {"model_name": "llama", "pod": "x-1"}, TIMES * 0),
    ], config=ObservedConfig(pools={"llama": "batch"}))
    assert mapped.series.select("metric", "pool", "replica").rows() == [
        ("vllm:num_requests_waiting", "chat", "chat-7f9c6d5b4-abcde"),
        ("vllm:num_requests_waiting", "batch", "batch-0"),
        ("kube_deployment_status_replicas", "chat", ""),
        ("vllm:num_requests_running", "batch", "x-1"),
    ]
    assert pod_owners("chat-7f9c6d5b4-abcde") == ["chat"]


def test_gauges_sum_or_average_over_the_pool(tmp_path):
    mapped, config = _read(tmp_path, [
        _series("vllm:num_requests_waiting", {"pool": "chat", "replica": "0"}, np.full(len(TIMES), 2)),
        _series("vllm:num_requests_waiting", {"pool": "chat", "replica": "1"}, np.full(len(TIMES), 5)),
        _series("vllm:kv_cache_usage_perc", {"pool": "chat", "replica": "0"}, np.full(len(TIMES), 0.2)),
        _series("vllm:kv_cache_usage_perc", {"pool": "chat", "replica": "1"}, np.full(len(TIMES), 0.6)),
        _series("DCGM_FI_DEV_GPU_UTIL", {"pool": "chat", "gpu": "0", "Hostname": "h"}, np.full(len(TIMES), 80)),
    ])
    aligned = align(mapped, Grid(15.0, 15.0, 40), config)
    np.testing.assert_allclose(aligned.values[("waiting", "chat")], 7.0)
    np.testing.assert_allclose(aligned.values[("kv_usage", "chat")], 0.4)
    np.testing.assert_allclose(aligned.values[("gpu_busy", "chat")], 0.8)
    per_replica = align(mapped, Grid(15.0, 15.0, 40), config, by_replica=True)
    np.testing.assert_allclose(per_replica.values[("waiting", "chat", "1")], 5.0)


def test_counters_become_rates_and_histograms_quantiles(tmp_path):
    series = [_series("vllm:generation_tokens_total", {"pool": "chat"}, 1000 + 40 * TIMES)]
    for le, share in (("0.1", 0.5), ("1", 0.9), ("+Inf", 1.0)):
        series.append(_series("vllm:time_to_first_token_seconds_bucket", {"pool": "chat", "le": le}, share * 2 * TIMES))
    series.append(_series("vllm:time_to_first_token_seconds_count", {"pool": "chat"}, 2 * TIMES))
    mapped, config = _read(tmp_path, series)
    assert mapped.unused == ("vllm:time_to_first_token_seconds_count",)
    aligned = align(mapped, Grid(60.0, 15.0, 37), config)
    np.testing.assert_allclose(aligned.values[("output_tokens_per_s", "chat")], 40.0)
    np.testing.assert_allclose(aligned.values[("ttft_s_p50", "chat")], 0.1)    # rank 0.5 of 1: the top of le=0.1
    np.testing.assert_allclose(aligned.values[("ttft_s_p90", "chat")], 1.0)
    np.testing.assert_allclose(aligned.values[("ttft_s_p99", "chat")], 1.0)    # +Inf bucket: the bound below it
    frame = aligned.frame()
    assert set(frame["signal"]) == {"output_tokens_per_s", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99"}
    assert frame.columns == ["t", "signal", "pool", "value"]


def test_the_new_name_wins_over_the_deprecated_one(tmp_path):
    mapped, config = _read(tmp_path, [
        _series("vllm:kv_cache_usage_perc", {"pool": "chat"}, np.full(len(TIMES), 0.5)),
        _series("vllm:gpu_cache_usage_perc", {"pool": "chat"}, np.full(len(TIMES), 0.5)),
        _series("vllm:gpu_cache_usage_perc", {"pool": "batch"}, np.full(len(TIMES), 0.25)),
    ])
    assert sorted(mapped.series.select("metric", "pool").rows()) == [
        ("vllm:gpu_cache_usage_perc", "batch"), ("vllm:kv_cache_usage_perc", "chat")]
    aligned = align(mapped, Grid(15.0, 15.0, 40), config)
    np.testing.assert_allclose(aligned.values[("kv_usage", "batch")], 0.25)


def test_cache_config_info_gives_each_pools_block_count(tmp_path):
    mapped, _ = _read(tmp_path, [
        _series("vllm:num_requests_waiting", {"pool": "chat"}, TIMES * 0),
        ("vllm:cache_config_info", {"pool": "chat", "num_gpu_blocks": "31022", "block_size": "16"}, [(T0, 1.0)]),
        ("vllm:cache_config_info", {"pool": "batch", "num_gpu_blocks": "4096"}, [(T0 - 86_400, 1.0)]),
    ])
    assert mapped.gpu_blocks == {"batch": (4096,), "chat": (31022,)}


def test_samples_far_outside_the_window_are_dropped_and_counted(tmp_path):
    series = [("vllm:num_requests_waiting", {"pool": "chat"}, [(T0 - 3600, 9.0), (T0 + 10, 1.0), (T0 + 5000, 9.0)])]
    mapped, _ = _read(tmp_path, series)
    assert mapped.dropped == 2
    assert mapped.samples.frame()["t"].to_list() == [10.0]


def test_a_gauge_without_a_recent_sample_is_absent(tmp_path):
    series = [("vllm:num_requests_waiting", {"pool": "chat"}, [(T0 + 10, 4.0)])]
    mapped, config = _read(tmp_path, series, config=ObservedConfig(lookback_s=30))
    got = align(mapped, Grid(0.0, 20.0, 4), config).values[("waiting", "chat")]
    # at 40 the sample is exactly the lookback old: out, the window being (40 - 30, 40]
    np.testing.assert_equal(got, [np.nan, 4.0, np.nan, np.nan])


def test_config_offset_wins_over_the_traces_own(tmp_path):
    observed = read_observed([write_json(tmp_path / "o.json", [_series("vllm:num_requests_waiting", {"pool": "chat"}, TIMES)])])
    mapped = select(observed, ObservedConfig(offset_s=T0 - 100), ["chat"], (0.0, 800.0), trace_offset_s=0.0)
    assert mapped.samples.frame()["t"][0] == pytest.approx(100.0)


def test_histogram_quantiles_are_one_per_rate_window_ending_at_the_last_tick(tmp_path):
    # TTFTs of 0.05 s until t=300, then of 0.7 s: each 60 s window's p50 says which it saw
    times = np.arange(0.0, 601.0, 5.0)
    fast = np.minimum(times, 300.0)
    total = times
    series = [("vllm:time_to_first_token_seconds_bucket", {"pool": "chat", "le": le}, [(T0 + t, float(c)) for t, c in zip(times, counts)])
              for le, counts in (("0.1", fast), ("1", total), ("+Inf", total))]
    mapped, config = _read(tmp_path, series)
    got = align(mapped, Grid(30.0, 15.0, 39), config).values[("ttft_s_p50", "chat")]  # ticks 30..600
    # windows of 4 ticks end at 600, 540, ..., 60: ticks 30-60 are the first, 75-120 the next
    assert len(set(got[0:3])) == 1 and len(set(got[3:7])) == 1 and len(set(got[-4:])) == 1
    assert got[18] == pytest.approx(0.05)  # (240, 300]: all fast, the middle of le=0.1
    assert got[19] == pytest.approx(0.55)  # (300, 360]: all slow, the middle of (0.1, 1]


def test_series_of_one_replica_scraped_at_other_instants_are_placed_on_their_own(tmp_path):
    # same replica, same sample count and first time, other instants: no sharing of positions
    series = [("vllm:num_requests_waiting", {"pool": "chat", "replica": "0"}, [(T0, 1.0), (T0 + 10, 2.0)]),
              ("vllm:num_requests_running", {"pool": "chat", "replica": "0"}, [(T0, 5.0), (T0 + 30, 6.0)])]
    mapped, config = _read(tmp_path, series)
    aligned = align(mapped, Grid(0.0, 10.0, 4), config)
    np.testing.assert_equal(aligned.values[("waiting", "chat")], [1.0, 2.0, 2.0, 2.0])
    np.testing.assert_equal(aligned.values[("running", "chat")], [5.0, 5.0, 5.0, 6.0])


def test_observe_reads_maps_and_aligns_and_says_what_it_left_out(tmp_path):
    from traces.observed import observe
    series = [_series("vllm:num_requests_waiting", {"pool": "chat"}, np.full(len(TIMES), 3)),
              _series("vllm:e2e_request_latency_seconds_sum", {"pool": "chat"}, TIMES),
              _series("process_cpu_seconds_total", {"pool": "chat"}, TIMES),
              ("vllm:num_requests_running", {"pool": "chat"}, [(T0 - 3600, 1.0), (T0, 2.0)])]
    got = observe([write_json(tmp_path / "o.json", series)], ObservedConfig(), ["chat"], Grid(15.0, 15.0, 40), T0)
    np.testing.assert_allclose(got.aligned.values[("waiting", "chat")], 3.0)
    assert got.notes() == ["observed: not a metric this tool knows, left out: process_cpu_seconds_total",
                           "observed: known, not compared: vllm:e2e_request_latency_seconds_sum",
                           "observed: 1 sample outside the trace's window left out"]
