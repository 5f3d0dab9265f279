"""YAML that expands: aliases, nesting and size are bounded before a value is built (issue 10, item 8)."""

from __future__ import annotations

import os
import resource
import time

import pytest

from common.errors import ConfigError
from common.yamlfile import MAX_DEPTH, MAX_NODES, load_yaml_text
from replay.calibration.profiles import read_profile
from replay.config import load_config

# Nine levels, each listing the previous one nine times: 9**9 (387 million) values once expanded.
LAUGHS = "\n".join(
    ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("key", ["seed", "pools: [{autoscaler: {policy: hpa, params: {x"])
def test_a_billion_laughs_config_is_refused_quickly_naming_the_file(tmp_path, key):
    before, start = _peak_rss_mb(), time.monotonic()
    closing = "}}}]" if key.startswith("pools") else ""
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS + f"\n{key}: *a8{closing}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert text.startswith(f"{path} line ") and f"more than {MAX_NODES:,} values" in text
    assert len(text) < 300, "the message never shows the expanded value"
    assert time.monotonic() - start < 5 and _peak_rss_mb() - before < 200


def test_deep_nesting_is_one_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("seed: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=rf"deep.yaml line 1: nested more than {MAX_DEPTH} levels deep"):
        load_config(path)


def test_nesting_up_to_the_bound_reads():
    lists = MAX_DEPTH - 1  # and the scalar inside them is the last level
    value = load_yaml_text("[" * lists + "1" + "]" * lists, "t.yaml")
    for _ in range(lists):
        value = value[0]
    assert value == 1
    with pytest.raises(ConfigError, match="nested more than"):
        load_yaml_text("[" * (lists + 1) + "1" + "]" * (lists + 1), "t.yaml")


def test_an_alias_inside_its_own_anchor_is_refused():
    with pytest.raises(ConfigError, match="t.yaml line .*recursive value"):
        load_yaml_text("a: &a [1, *a]\n", "t.yaml")


def test_aliases_that_stay_small_still_work():
    data = load_yaml_text("base: &b {ttft_ms: 500}\nslo: *b\nother: *b\n", "t.yaml")
    assert data["slo"] == {"ttft_ms": 500} and data["other"] is data["slo"]


def test_a_step_model_profile_goes_through_the_same_bounds(tmp_path):
    path = tmp_path / "prof.yaml"
    path.write_text(LAUGHS + "\nformat: *a8\n")
    with pytest.raises(ConfigError, match="pools\\[0\\].step_model.profile: .*prof.yaml line .*values"):
        read_profile(path, "pools[0].step_model.profile")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_config_that_is_a_pipe_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="c.yaml: is a FIFO \\(named pipe\\), not a regular file"):
        load_config(fifo)


def test_an_error_about_a_big_value_shows_only_its_start(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: [" + ", ".join(["123456789"] * 5000) + "]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "seed: got [123456789" in str(err.value) and len(str(err.value)) < 200
