"""Which kernel variants a command that replays many fleets warms up front (replay.run)."""

from __future__ import annotations

from pathlib import Path

from replay.config import build_config
from replay.run import fleet_variants


def _fleet(**pool) -> object:
    return build_config({"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb",
                         "pools": [{"name": "default", "replicas": 1, **pool}]}, "test.yaml", Path("."))


def test_default_policies_need_the_plain_variant_a_non_default_router_the_full_one():
    plain, routed = _fleet(), _fleet(router="round-robin")
    assert fleet_variants([(plain, "a")]) == ["plain"]
    assert fleet_variants([(routed, "b")]) == ["full"]
    assert fleet_variants([(routed, "b"), (plain, "a")]) == ["plain", "full"]  # each once, in order


def test_a_fleet_that_cannot_be_built_counts_for_none():
    too_big = build_config({"model": "llama-3.1-70b", "gpu": "l40s-48gb",
                            "pools": [{"name": "default", "replicas": 1, "tensor_parallel_size": 1,
                                       "router": "round-robin"}]}, "big.yaml", Path("."))
    assert fleet_variants([(too_big, "big.yaml")]) == ["plain"]
    assert fleet_variants([(too_big, "big.yaml"), (_fleet(router="round-robin"), "b")]) == ["full"]
