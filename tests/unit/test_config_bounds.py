"""Every numeric config key has a range, checked with a clean error (issue 10, item 9).

The walk below finds every int and float field of every config section (the fleet, its pools,
engines and trace, every admission and autoscaler's parameters, the shared guard), so a key
added later without a range in common/bounds.py fails here.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from common.bounds import bound_for, first_out_of_bounds
from common.configtools import from_dict
from common.errors import ConfigError
from policies.autoscalers.guard import GuardParams
from policies.registry import ADMISSIONS, AUTOSCALERS
from replay.config import FleetConfig, load_config

# What a section needs besides the key under test, so its own checks reach that key.
REQUIRED = {"MergeSource": {"path": "x.csv"}, "SampleConfig": {"n": 10},
            "SpeculativeConfig": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.5},
            "QueueLimitParams": {"max_waiting": 5},
            "BurstConfig": {"at_s": 10.0, "duration_s": 5.0, "factor": 2.0}}


def _leaf_types(hint) -> set:
    out = {hint}
    for arg in typing.get_args(hint):
        out |= _leaf_types(arg)
    return out


def _sections() -> list[type]:
    found: list[type] = []

    def walk(cls: type) -> None:
        if cls in found:
            return
        found.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for leaf in _leaf_types(hint):
                if dataclasses.is_dataclass(leaf):
                    walk(leaf)

    for root in (FleetConfig, GuardParams, *(s.params_cls for s in ADMISSIONS.values()),
                 *(s.params_cls for s in AUTOSCALERS.values())):
        walk(root)
    return found


NUMERIC = [
    (cls, f.name, typing.get_type_hints(cls)[f.name])
    for cls in _sections() for f in dataclasses.fields(cls)
    if _leaf_types(typing.get_type_hints(cls)[f.name]) & {int, float}
]


def test_the_walk_finds_the_sections_it_should():
    names = {cls.__name__ for cls in _sections()}
    assert {"FleetConfig", "PoolConfig", "EngineArgs", "TraceConfig", "MergeSource", "WindowConfig", "KpaParams",
            "TokenBucketParams", "GuardParams", "SpeculativeConfig"} <= names
    assert len(NUMERIC) > 100


@pytest.mark.parametrize(("cls", "name", "hint"), NUMERIC, ids=[f"{c.__name__}.{n}" for c, n, _ in NUMERIC])
def test_every_numeric_key_has_a_range_and_absurd_values_are_clean_errors(cls, name, hint):
    assert bound_for(cls, name) is not None, f"{cls.__name__}.{name}: add its range to common/bounds.py"
    leaves = _leaf_types(hint)
    if float in leaves:
        absurd = [1e300, -1e300, math.nan, math.inf, -1.0] if bound_for(cls, name).lo >= 0 else [1e300, math.nan]
    else:
        absurd = [2**70, -(2**70)] + ([-1] if bound_for(cls, name).lo >= 0 else [])
    for value in absurd:
        data = {**REQUIRED.get(cls.__name__, {}), name: [value] if tuple in {typing.get_origin(h) for h in leaves}
                else value}
        with pytest.raises(ConfigError) as err:
            from_dict(cls, data, "sec", source="c.yaml")
        text = str(err.value)
        # The section's own check (`sec.key: ...` or `key=...`) or the range's, naming the key.
        assert text.startswith("c.yaml: sec") and name in text and len(text) < 300, (value, text)


@pytest.mark.parametrize("cls", _sections(), ids=lambda c: c.__name__)
def test_every_default_is_within_its_range(cls):
    for f in dataclasses.fields(cls):
        if isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
            bound = bound_for(cls, f.name)
            assert bound is None or bound.holds(f.default), f"{cls.__name__}.{f.name} = {f.default}"


def test_the_default_fleet_is_within_every_range():
    assert first_out_of_bounds(FleetConfig()) is None


@pytest.mark.parametrize(("text", "fragment"), [
    ("pools: [{replicas: 1000000}]", "pools[0].replicas: got 1000000, expected >= 0 and <= 1,024 (replicas per pool)"),
    ("pools: [{replicas: 1180591620717411303424}]", "pools[0].replicas: got 1180591620717411303424"),
    ("tick_s: 1e300", "tick_s: got 1e+300, expected >= 1e-06 and <= 3,600 (seconds)"),
    ("tick_s: 1e-9", "tick_s: got 1e-09, expected a whole number of microseconds, at least 1e-06"),
    ("tick_s: 1.5e-6", "tick_s: got 1.5e-06, expected a whole number of microseconds"),
    ("metrics_window_s: 1e300", "metrics_window_s: got 1e+300"),
    ("seed: 100000000000000000000000", "seed: got 100000000000000000000000, expected >= 0 and <= 9,223,372,036,854,775,807 (a seed)"),
    ("pools: [{engine: {num_gpu_blocks_override: 2000000000}}]",
     "pools[0].engine.num_gpu_blocks_override: got 2000000000, expected >= 1 and <= 4,194,304 (KV blocks per replica)"),
    ("pools: [{autoscaler: {max_replicas: 1000000000}}]", "pools[0].autoscaler.max_replicas: got 1000000000"),
    ("pools: [{lifecycle: {load_bytes_per_s: 1e-300}}]",
     "pools[0].lifecycle.load_bytes_per_s: got 1e-300, expected >= 1,000,000 and <= 1e+15 (bytes/s)"),
    ("trace: {rate_scale: 1e-300}", "trace: rate_scale=1e-300 (expected a number in [1e-06, 1e+06])"),
    ("pools: [{autoscaler: {policy: kpa, params: {stable_window_s: .nan}}}]", "stable_window_s: got nan"),
    # an efficiency so small the kernel's step time overflowed into 0 us: instant steps, a healthy verdict
    ("pools: [{step_model: {mbu: 1e-15}}]", "pools[0].step_model.mbu: got 1e-15, expected >= 0.01 and <= 1"),
    ("pools: [{step_model: {mfu: 1e-300}}]", "pools[0].step_model.mfu: got 1e-300, expected >= 0.01 and <= 1"),
])
def test_the_reported_values_are_refused_naming_the_key(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        cfg = load_config(path)
        # autoscaler parameters are checked against the policy's own dataclass when the fleet is planned
        from replay.fleet.control import make_decider

        for i, pool in enumerate(cfg.pools):
            make_decider(pool.autoscaler, 1_000_000, f"pools[{i}].autoscaler")
    assert fragment in str(err.value), str(err.value)


def test_a_fleet_whose_kv_blocks_no_machine_holds_is_refused_before_any_memory(tmp_path):
    from replay.fleet.cluster import MAX_FLEET_KV_BLOCKS, plan_pools

    path = tmp_path / "c.yaml"
    path.write_text("model: llama-3.1-8b\ngpu: h200-sxm-141gb\n"
                    "pools: [{replicas: 1024, engine: {block_size: 1}}]\n")
    with pytest.raises(ConfigError) as err:
        plan_pools(load_config(path), str(path))
    assert f"at most {MAX_FLEET_KV_BLOCKS:,}" in str(err.value) and "pools[0] (default): 1,024 replica slots" \
        in str(err.value)
    path.write_text("model: llama-3.1-8b\npools: [{replicas: 8}]\n")
    assert len(plan_pools(load_config(path), str(path))) == 1
