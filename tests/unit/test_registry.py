"""The policy registry: one name in one place, and every numba id has its dispatch branch."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from policies.registry import ROUTERS, router_id
from replay.engine import common as engine_common
from common.errors import ConfigError


def test_router_ids_are_the_kernels_positions_in_the_registry():
    """One name in one place: a router's id is its kernel module's position in ROUTER_MODULES,
    every module has its numba kernel and its reference twin, and presets share a kernel."""
    from policies.registry import ROUTER_MODULES
    from policies.routers import _view, weighted

    assert [ROUTER_MODULES.index(spec.module) for spec in ROUTERS.values()] == [
        spec.numba_id for spec in ROUTERS.values()]
    for module in ROUTER_MODULES:
        assert callable(module.kernel.py_func) and callable(module.reference)
    for module in ROUTER_MODULES[:-1]:
        assert module.SPECS and all(name in ROUTERS for name, *_ in module.SPECS)
    # The last is the link to a user's router (policies/user.py): no name of its own.
    assert ROUTER_MODULES[-1].__name__ == "policies.routers.user" and ROUTER_MODULES[-1].SPECS == ()
    for name in ("prefix-aware", "least-kv", "vllm-dp", "kv-cost"):
        assert ROUTERS[name].module is weighted
    assert router_id("prefix-aware") == router_id("weighted") != router_id("round-robin")
    assert _view.R_ACTIVE == engine_common.R_ACTIVE


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
        "import sys, replay.run, replay.fleet.cluster, replay.engine.loop, replay.engine.reference.engine, policies.registry, traces;"
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


def test_router_parameters_from_a_mapping():
    from policies.registry import router_columns, router_params
    from policies.routers.weighted import SCORERS

    spec, params = router_params({"policy": "weighted", "scorers": {"prefix": 2, "queue": 1, "kv_free": 1}})
    assert spec.name == "weighted" and params == ROUTERS["prefix-aware"].defaults
    ids, rows = router_columns(["least-kv", {"policy": "weighted", "scorers": {"running": 3}}, "random"])
    assert ids.tolist() == [router_id("weighted"), router_id("weighted"), router_id("random")]
    assert rows[0, SCORERS.index("kv_use")] == 1.0 and rows[1, SCORERS.index("running")] == 3.0
    assert not rows[2].any()


@pytest.mark.parametrize("value, fragments", [
    ({"policy": "weighted", "scorers": {"prefx": 1}}, ["router.scorers", "'prefx'", "did you mean 'prefix'", "kv_cost"]),
    ({"policy": "weighted", "weights": {"prefix": 1}}, ["router", "'weights'", "'weighted'", "scorers"]),
    ({"policy": "round-robin", "scorers": {"prefix": 1}}, ["router", "'scorers'", "'round-robin'", "known: policy"]),
    ({"policy": "weighted", "scorers": {"queue": -1}}, ["router.scorers.queue", "-1", ">= 0"]),
    ({"policy": "weighted", "scorers": {"queue": 0}}, ["router.scorers", "at least one"]),
    ({"scorers": {"queue": 1}}, ["router", "'policy'"]),
])
def test_bad_router_parameters_name_the_key(value, fragments):
    from policies.registry import router_params

    with pytest.raises(ValueError) as err:
        router_params(value)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
