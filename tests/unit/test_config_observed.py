"""The fleet config's `observed:` section: read through the same strict loader as every section,
kept out of what identifies a replay, and absent from config.yaml when absent from the config."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from replay.config import FleetConfig, load_config


def _load(tmp_path, text: str) -> FleetConfig:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_config(path)


def test_the_section_is_read_with_its_keys(tmp_path):
    cfg = _load(tmp_path, "observed: {pool_label: [deployment, pod], pools: {vllm-a: default}, offset_s: 1700000000,"
                          " window_s: 30}\n")
    assert cfg.observed.pool_label == ("deployment", "pod")
    assert cfg.observed.pools == {"vllm-a": "default"} and cfg.observed.offset_s == 1.7e9
    assert cfg.to_dict()["observed"]["window_s"] == 30


def test_it_does_not_change_what_replays(tmp_path):
    with_section = _load(tmp_path, "observed: {offset_s: 1700000000}\n")
    assert with_section.sha256() == FleetConfig().sha256()
    assert "observed" not in FleetConfig().to_dict()


@pytest.mark.parametrize("text, expected", [
    ("observed: {offset: 1}\n", "unknown key 'observed.offset' (did you mean 'offset_s'?)"),
    ("observed: {window_s: 0}\n", "observed.window_s: got 0"),
    ("observed: {pool_label: []}\n", "observed.pool_label"),
    ("observed: [1]\n", "observed: expected a mapping"),
])
def test_a_bad_section_names_its_key(tmp_path, text, expected):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert expected in str(err.value) and "fleet.yaml" in str(err.value)
