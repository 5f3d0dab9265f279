"""The policy registry: one name in one place, and every numba id has its dispatch branch."""

from __future__ import annotations

import pytest

from policies.registry import ROUTERS, router_id
from replay import engine_common
from traces.errors import ConfigError


def test_router_ids_are_unique_and_match_the_engine_dispatch():
    ids = [spec.numba_id for spec in ROUTERS.values()]
    assert len(set(ids)) == len(ids)
    assert router_id("least-outstanding") == engine_common.ROUTER_LEAST_OUTSTANDING
    assert router_id("round-robin") == engine_common.ROUTER_ROUND_ROBIN
    for name, constant in (("random", "ROUTER_RANDOM"), ("vllm-dp", "ROUTER_VLLM_DP"), ("least-kv", "ROUTER_LEAST_KV"),
                           ("power-of-two", "ROUTER_POWER_OF_TWO"), ("prefix-aware", "ROUTER_PREFIX_AWARE"),
                           ("kv-cost", "ROUTER_KV_COST")):
        assert router_id(name) == getattr(engine_common, constant)


def test_every_router_documents_what_it_does_and_where_it_comes_from():
    for spec in ROUTERS.values():
        assert spec.family == "router" and spec.summary and spec.source


def test_unknown_router_lists_the_known_ones():
    with pytest.raises(ConfigError, match="kv-cost, least-kv, least-outstanding, power-of-two"):
        router_id("fastest")


def test_core_packages_import_without_a_terminal_ui():
    import subprocess
    import sys

    code = (
        "import sys, replay.run, replay.fleet.cluster, replay.engine_nb, replay.engine_ref, policies.registry, traces;"
        "bad = [m for m in ('textual', 'rich') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pool_split_parameters_listed_are_the_configs_keys_and_defaults():
    """`llm-replay policies` lists each split's keys of `split:` with SplitConfig's defaults."""
    import dataclasses

    from policies.registry import SPLITS
    from replay.config import SplitConfig

    defaults = {f.name: f.default for f in dataclasses.fields(SplitConfig)}
    for spec in SPLITS.values():
        for key, value in (spec.params or {}).items():
            assert defaults[key] == value, (spec.name, key)
