"""Window, rate scaling, sampling, filters, merging, and the config that drives them."""

from __future__ import annotations

import pathlib

import polars as pl
import pytest
import yaml

from common.configtools import from_dict
from common.errors import ConfigError, TraceError
from traces import (
    FilterConfig, MergeSource, SampleConfig, TraceConfig, WindowConfig,
    cast_to_schema, filter_rows, label, load_from_config, load_trace, merge, sample, scale_rate, window,
)  # fmt: skip

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def frame(arrivals_s, prompts=None, outputs=None, workloads=None, tenants=None):
    n = len(arrivals_s)
    return cast_to_schema(pl.DataFrame({
        "arrival_us": [round(a * 1e6) for a in arrivals_s],
        "prompt_tokens": prompts or [10 * (i + 1) for i in range(n)],
        "output_tokens": outputs or [i + 1 for i in range(n)],
        "workload": workloads or ["w"] * n,
        "tenant": tenants or ["default"] * n,
    }))  # fmt: skip


def ids(f):
    return f["request_id"].to_list()


def us(f):
    return f["arrival_us"].to_list()


def test_window_keeps_half_open_range_and_rezeroes():
    f = frame([0, 1, 2, 3, 4])
    w = window(f, 1.0, 3.0)
    assert us(w) == [0, 1_000_000]
    assert w["prompt_tokens"].to_list() == [20, 30]
    assert ids(w) == [0, 1]
    assert us(window(f, 2.5)) == [500_000, 1_500_000]


def test_rate_scale_compresses_and_stretches():
    f = frame([0, 1, 3])
    assert us(scale_rate(f, 2.0)) == [0, 500_000, 1_500_000]
    assert us(scale_rate(f, 0.5)) == [0, 2_000_000, 6_000_000]
    assert us(scale_rate(frame([0, 1e-6, 2e-6]), 3.0)) == [0, 0, 1]  # rounds, stays sorted
    with pytest.raises(ValueError, match="rate_scale"):
        scale_rate(f, 0)


def test_sample_is_deterministic_and_ordered():
    f = frame([i * 0.1 for i in range(100)])
    a = sample(f, fraction=0.3, seed=7)
    b = sample(f, fraction=0.3, seed=7)
    c = sample(f, fraction=0.3, seed=8)
    assert a.height == 30 and a.equals(b) and not a.equals(c)
    assert us(a) == sorted(us(a)) and ids(a) == list(range(30))
    assert sample(f, n=5, seed=1).height == 5
    assert sample(f, fraction=1.0).equals(f)
    with pytest.raises(TraceError, match="sample.n=101 is more than the 100"):
        sample(f, n=101)


def test_sample_of_a_session_trace_keeps_whole_sessions():
    # 30 sessions of 1-4 turns (interleaved in time) and 10 requests without a session.
    sessions = [f"s{i % 30}" if i < 75 else None for i in range(85)]
    sizes = {s: sessions.count(s) for s in set(sessions) - {None}}
    f = frame([i * 0.1 for i in range(85)]).with_columns(pl.Series("session_id", sessions, dtype=pl.String))
    for kwargs in ({"fraction": 0.3}, {"n": 20}):
        got = sample(f, seed=3, **kwargs)
        kept = got["session_id"].drop_nulls().to_list()
        assert all(kept.count(s) == sizes[s] for s in set(kept)), "a session lost turns"
        assert us(got) == sorted(us(got)) and ids(got) == list(range(got.height))
        assert got.equals(sample(f, seed=3, **kwargs)) and not got.equals(sample(f, seed=4, **kwargs))
    units = 30 + 10
    fraction = sample(f, fraction=0.3, seed=3)
    assert fraction["session_id"].n_unique() - (fraction["session_id"].null_count() > 0) \
        + fraction["session_id"].null_count() == round(0.3 * units)
    by_count = sample(f, n=20, seed=3)
    assert 20 <= by_count.height < 20 + max(sizes.values())
    assert sample(f, fraction=1.0).equals(f)


def test_filter_bounds_and_labels():
    f = frame([0, 1, 2, 3], prompts=[5, 50, 500, 5000], outputs=[1, 10, 100, 1000],
              workloads=["a", "b", "a", "b"], tenants=["x", "x", "y", "y"])
    bounded = filter_rows(f, FilterConfig(min_prompt_tokens=50, max_prompt_tokens=500))
    assert bounded["prompt_tokens"].to_list() == [50, 500]
    assert filter_rows(f, FilterConfig(max_output_tokens=10))["output_tokens"].to_list() == [1, 10]
    assert filter_rows(f, FilterConfig(min_output_tokens=100)).height == 2
    got = filter_rows(f, FilterConfig(workloads=("a",), tenants=("y",)))
    assert got["prompt_tokens"].to_list() == [500] and ids(got) == [0]


def test_merge_sorts_by_arrival_and_renumbers():
    a = label(frame([0, 2, 4]), "conv")
    b = label(frame([1, 2, 3]), "code")
    m = merge([a, b])
    assert us(m) == [0, 1_000_000, 2_000_000, 2_000_000, 3_000_000, 4_000_000]
    assert m["workload"].to_list() == ["conv", "code", "conv", "code", "code", "conv"]
    assert ids(m) == list(range(6))
    shifted = merge([a, b], [0, 10_000_000])
    assert shifted["workload"].to_list() == ["conv"] * 3 + ["code"] * 3
    cast_to_schema(m)  # still valid


@pytest.mark.parametrize("section, message", [
    ({"window": {"start_s": -1}}, "trace.window: start_s=-1.0"),
    ({"window": {"start_s": 5, "end_s": 5}}, "end_s=5.0"),
    ({"rate_scale": 0}, "rate_scale=0.0 (expected a number in [1e-06, 1e+06])"),
    ({"rate_scale": -2}, "rate_scale=-2.0"),
    ({"sample": {"fraction": 0}}, "trace.sample: fraction=0.0"),
    ({"sample": {"fraction": 1.5}}, "fraction=1.5"),
    ({"sample": {"fraction": 0.5, "n": 3}}, "exactly one of fraction and n"),
    ({"sample": {"n": 0}}, "n=0"),
    ({"filter": {"min_prompt_tokens": -1}}, "min_prompt_tokens=-1"),
    ({"filter": {"min_output_tokens": 9, "max_output_tokens": 2}}, "min_output_tokens=9 > max_output_tokens=2"),
    ({"filter": {"workloads": []}}, "workloads is an empty list"),
    ({"format": "csvv"}, "format='csvv' is not known; known: aiperf, azure"),
    ({"time_unit": "min"}, "time_unit='min' is not known"),
    ({"column_map": {"arrival": "t", "tokens": "p"}}, "column_map.tokens is not known"),
    ({"column_map": {"arrival": "t"}}, "missing prompt_tokens, output_tokens"),
    ({"prefix_block_tokens": 0}, "prefix_block_tokens=0"),
    ({"merge": [{"path": "a.csv", "offset_s": -1}]}, "trace.merge[0]: offset_s=-1.0"),
    ({"merge": [{"path": "a.csv", "label": "x"}]}, "unknown key 'trace.merge[0].label'; known keys: column_map"),
    ({"windows": {}}, "unknown key 'trace.windows' (did you mean 'window'?); known keys: closed_loop, column_map, filter, format, merge"),
])  # fmt: skip
def test_config_validation_names_the_field(section, message):
    with pytest.raises(ConfigError) as err:
        from_dict(TraceConfig, section, "trace", source="run.yaml")
    assert str(err.value).startswith("run.yaml: ") and message in str(err.value), str(err.value)


def test_config_dataclasses_are_frozen():
    cfg = TraceConfig()
    with pytest.raises(AttributeError):
        cfg.path = "x"  # type: ignore[misc]
    assert WindowConfig().start_s == 0.0 and SampleConfig(n=1).seed == 0


def test_load_from_config_default_is_bundled_conv():
    trace = load_from_config(TraceConfig())
    assert trace.source == "azure-conv-2023" and trace.frame.height == 19_366


def test_load_from_config_relative_paths_and_overrides(tmp_path):
    (tmp_path / "t.csv").write_text((FIX / "splitwise_code_small.csv").read_text())
    cfg = from_dict(TraceConfig, yaml.safe_load("path: t.csv\nworkload: mine\n"), "trace")
    trace = load_from_config(cfg, base_dir=tmp_path)
    assert trace.frame.height == 4 and set(trace.frame["workload"]) == {"mine"}
    other = load_from_config(cfg, path_override=str(FIX / "vidur_small.csv"), base_dir=tmp_path)
    assert other.format == "vidur" and other.reordered == 1
    forced = load_from_config(cfg, format_override="vidur", base_dir=tmp_path)
    assert forced.format == "vidur"
    with pytest.raises(TraceError, match="unsorted.csv line 4"):
        load_from_config(TraceConfig(path=str(FIX / "unsorted.csv")), strict=True)


def test_load_from_config_merge_then_transforms_in_order(tmp_path):
    text = """
path: azure-code-2023
merge:
  - {path: azure-conv-2023, offset_s: 10}
filter: {min_prompt_tokens: 10, workloads: [conv, code]}
window: {start_s: 600, end_s: 1800}
rate_scale: 2
sample: {fraction: 0.5, seed: 3}
"""
    cfg = from_dict(TraceConfig, yaml.safe_load(text), "trace", source="run.yaml")
    assert cfg.merge == (MergeSource(path="azure-conv-2023", offset_s=10.0),)
    trace = load_from_config(cfg)
    code, conv = load_trace("azure-code-2023").frame, load_trace("azure-conv-2023").frame
    # by hand: merge -> filter -> window -> rate -> sample
    both = merge([code, conv], [0, 10_000_000])
    kept = filter_rows(both, cfg.filter)
    windowed = window(kept, 600, 1800)
    expected = sample(scale_rate(windowed, 2.0), fraction=0.5, seed=3)
    assert trace.frame.equals(expected)
    assert trace.format == "merged" and trace.source == "azure-code-2023 + azure-conv-2023"
    assert trace.frame["arrival_us"].max() < 600_000_000  # 1200 s of trace at twice the rate
    assert trace.dropped == {
        "filtered": both.height - kept.height,
        "outside_window": kept.height - windowed.height,
        "sampled_out": windowed.height - expected.height,
    }
    assert set(trace.frame["workload"]) == {"conv", "code"}
    assert len(trace.sha256) == 64 and trace.sha256 != load_trace("azure-code-2023").sha256


def test_merge_only_config_and_block_sizes(tmp_path):
    cfg = TraceConfig(merge=(MergeSource(path=str(FIX / "mooncake_small.jsonl"), workload="a"),
                             MergeSource(path=str(FIX / "vidur_small.csv"), workload="b")))
    trace = load_from_config(cfg)
    assert trace.prefix_block_tokens == 512 and trace.frame.height == 9 and trace.reordered == 1
    assert trace.frame["prefix_hashes"].null_count() == 3
    clash = TraceConfig(merge=(MergeSource(path=str(FIX / "mooncake_small.jsonl")),
                               MergeSource(path=str(FIX / "mooncake_small.jsonl"), prefix_block_tokens=16)))
    with pytest.raises(TraceError, match="different prefix block sizes"):
        load_from_config(clash)


def test_burstgpt_drops_survive_merge_and_empty_results_are_errors():
    cfg = TraceConfig(path=str(FIX / "burstgpt_v1_small.csv"),
                      merge=(MergeSource(path=str(FIX / "burstgpt_v2_small.csv")),))
    assert load_from_config(cfg).dropped == {"zero_output_tokens": 3}
    with pytest.raises(TraceError, match="no requests left"):
        load_from_config(TraceConfig(path=str(FIX / "vidur_small.csv"), window=WindowConfig(100, 200)))
