"""A sweep's dotted keys against the config schema, its cells, and its results table's columns."""

from __future__ import annotations

import polars as pl
import pytest

from common.errors import ConfigError
from replay.sweep.keys import check_key, set_key
from replay.sweep.spec import _cells
from replay.sweep.store import _column, flatten

BASE = {"pools": [{"name": "a"}, {"name": "b"}], "trace": {"path": "x.csv", "merge": [{"path": "y.csv"}]}}


@pytest.mark.parametrize("key, full", [
    ("pools.0.replicas", "pools.0.replicas"),
    ("pools.*.engine.max_num_seqs", "pools.*.engine.max_num_seqs"),
    ("router", "pools.*.router"),  # a pool key alone: every pool
    ("engine.max_num_seqs", "pools.*.engine.max_num_seqs"),
    ("autoscaler.params.target", "pools.*.autoscaler.params.target"),  # a policy's own parameter
    ("pools.1.router.scorers.prefix", "pools.1.router.scorers.prefix"),
    ("model", "model"),  # a fleet key wins over the pool key of the same name
    ("trace.rate_scale", "trace.rate_scale"),
    ("trace.window.end_s", "trace.window.end_s"),
    ("trace.merge.0.offset_s", "trace.merge.0.offset_s"),
    ("slo.ttft_ms", "slo.ttft_ms"),
])
def test_known_keys_are_accepted_in_canonical_form(key, full):
    assert check_key(key, BASE, "s.yaml") == full


def test_an_unknown_key_names_the_file_and_the_nearest_keys():
    with pytest.raises(ConfigError) as exc:
        check_key("pools.0.replicaz", BASE, "s.yaml")
    text = str(exc.value)
    assert text.startswith("s.yaml: key 'pools.0.replicaz': not a config key")
    assert "pools.0.replicas" in text.split("nearest known keys:")[1]


@pytest.mark.parametrize("key, words", [
    ("pools.2.replicas", "index 0 to 1"),
    ("trace.merge.1.path", "index 0 to 0"),
    ("pools.0.replicas.max", "pools.0.replicas is a value"),
    ("trace.rate_scal", "trace.rate_scale"),
    ("", "dotted config key"),
    ("pools..replicas", "dotted config key"),
])
def test_bad_keys_say_why(key, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        check_key(key, BASE, "s.yaml")


def test_set_key_sets_one_pool_or_every_pool_and_makes_sections():
    data = {"pools": [{"name": "a"}, {"name": "b", "router": "round-robin"}]}
    set_key(data, "pools.*.engine.max_num_seqs", 64, "s")
    set_key(data, "pools.1.router", "least-kv", "s")
    set_key(data, "trace.window.end_s", 30, "s")
    assert data == {"pools": [{"name": "a", "engine": {"max_num_seqs": 64}},
                              {"name": "b", "router": "least-kv", "engine": {"max_num_seqs": 64}}],
                    "trace": {"window": {"end_s": 30}}}
    with pytest.raises(ConfigError, match="not a section"):
        set_key(data, "pools.1.router.scorers", {"prefix": 1}, "s")  # the base names the router by a string


def test_a_grid_is_every_combination_in_key_order():
    cells = _cells({"a": [1, 2], "b": ["x", "y"]}, ("a", "b"), None, "s")
    assert cells == ((1, "x"), (1, "y"), (2, "x"), (2, "y"))


def test_a_sample_is_seeded_distinct_and_bounded():
    grid = {"a": list(range(10)), "b": list(range(10))}
    one = _cells(grid, ("a", "b"), {"n": 7, "seed": 3}, "s")
    assert one == _cells(grid, ("a", "b"), {"n": 7, "seed": 3}, "s")
    assert one != _cells(grid, ("a", "b"), {"n": 7, "seed": 4}, "s")
    assert len(set(one)) == 7
    with pytest.raises(ConfigError, match="at most the grid's 100 cells"):
        _cells(grid, ("a", "b"), {"n": 101}, "s")
    ranged = _cells({"a": {"low": 1, "high": 4}, "b": {"low": 0.5, "high": 1.0}}, ("a", "b"), {"n": 20}, "s")
    assert all(isinstance(a, int) and 1 <= a <= 4 and 0.5 <= b <= 1.0 for a, b in ranged)
    with pytest.raises(ConfigError, match="needs sample"):
        _cells({"a": {"low": 1, "high": 4}}, ("a",), None, "s")
    with pytest.raises(ConfigError, match="non-empty list"):
        _cells({"a": 3}, ("a",), None, "s")


def test_summary_fields_flatten_and_columns_keep_one_type():
    flat = flatten({"ttft_p99_ms": 1.5, "pools": {"chat": {"requests": 3}}, "verdict": ["late"], "x": {}})
    assert flat == {"ttft_p99_ms": 1.5, "pools.chat.requests": 3, "verdict": '["late"]'}
    assert _column("n", [1, None, 3]).dtype == pl.Int64
    assert _column("n", [1, 2.5]).to_list() == [1.0, 2.5]
    mixed = _column("router", ["least-kv", {"policy": "weighted"}])
    assert mixed.to_list() == ['"least-kv"', '{"policy": "weighted"}']
