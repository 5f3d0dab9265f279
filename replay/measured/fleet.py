"""The fleet of one experiment: one vLLM server as the run started it, through the normal config
path (common/configtools.py `from_dict` into replay/config.py's FleetConfig), so any key a fleet
config takes can be overridden.

Overrides are a mapping of fleet config keys merged over the experiment's own, mapping into mapping:
    {"pools": {"vllm": {"step_model": {"mfu": 0.5}}}}
The experiment's single pool is named POOL ("vllm"); under `pools`, a mapping is keyed by that name
(a list instead replaces the pools whole). Dotted keys are the same thing spelled flat and may be
mixed with nested ones: {"pools.vllm.step_model.mfu": 0.5, "tick_s": 0.5}. A key the config does not
know is a ConfigError naming its path (pools[0].step_model.nosuch).
"""

from __future__ import annotations

import copy
from typing import Any

from common.configtools import from_dict
from common.errors import ConfigError
from replay.config import FleetConfig, _resolve_profiles
from replay.measured.experiments import Experiment
from replay.validate import DRAIN_S

POOL = "vllm"


def experiment_config(exp: Experiment) -> dict[str, Any]:
    """The experiment's fleet as a config mapping (what a fleet YAML would hold).

    vLLM's data parallelism (dp > 1) is `dp` replicas behind vLLM's own DP balancer (router
    vllm-dp). FP8 rows are pre-quantized checkpoints whose config.json says so, so no
    `quantization` is set (vLLM read the format from the checkpoint); a model entry that does not
    load FP8 itself gets weight_dtype fp8. CPU KV offload has no counterpart in the engine (see
    Experiment.not_modelled), nor has a measured block count been forced: the replay computes its
    own (set pools.vllm.engine.num_gpu_blocks_override to `exp.num_gpu_blocks` to force it)."""
    from replay.model.specs import get_model

    pool: dict[str, Any] = {
        "name": POOL,
        "replicas": exp.dp,
        "tensor_parallel_size": exp.tp,
        "engine": {
            "max_num_seqs": exp.max_num_seqs,
            "max_num_batched_tokens": exp.max_num_batched_tokens,
            "max_model_len": exp.max_model_len,
            "block_size": exp.block_size,
            "gpu_memory_utilization": exp.gpu_memory_utilization,
            "enable_prefix_caching": exp.enable_prefix_caching,
        },
    }
    if exp.dp > 1:
        pool["router"] = "vllm-dp"
    if exp.precision == "FP8" and get_model(exp.model).default_weight_dtype != "fp8":
        pool["weight_dtype"] = "fp8"
    # Validation replays run every request to completion (replay/validate.py DRAIN_S).
    return {"model": exp.model, "gpu": exp.gpu, "max_drain_s": DRAIN_S, "pools": [pool]}


def _expand(overrides: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys ("a.b.c": v) as nested mappings, merged with the nested ones."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"overrides: key {key!r}: expected a config key (a non-empty string)")
        value = _expand(value) if isinstance(value, dict) else value
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"overrides: {key}: {part} is given both as a value and as a mapping")
        node[last] = _merge(node[last], value) if isinstance(node.get(last), dict) and isinstance(value, dict) \
            else value
    return out


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return over


def apply_overrides(config: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """`config` with `overrides` (nested and/or dotted, see the module docstring) merged over it."""
    config = copy.deepcopy(config)
    if not overrides:
        return config
    if not isinstance(overrides, dict):
        raise ConfigError(f"overrides: got {type(overrides).__name__}, expected a mapping of config keys")
    over = _expand(overrides)
    pools = over.pop("pools", None)
    config = _merge(config, over)
    if isinstance(pools, list):
        config["pools"] = pools
    elif isinstance(pools, dict):
        names = [p.get("name") for p in config["pools"]]
        for name, change in pools.items():
            index = names.index(name) if name in names else int(name) if str(name).isdigit() else None
            if index is None or index >= len(names):
                raise ConfigError(f"overrides: pools.{name}: no such pool; the experiment's pool is {POOL!r}")
            config["pools"][index] = _merge(config["pools"][index], change)
    elif pools is not None:
        raise ConfigError(f"overrides: pools: got {pools!r}, expected a mapping keyed by pool name ({POOL!r})")
    return config


def experiment_fleet(exp: Experiment, overrides: dict[str, Any] | None = None) -> FleetConfig:
    """The FleetConfig of `exp` with `overrides` applied (a ConfigError names a bad key). Paths in
    overrides (a step-model profile or table, a model config.json) are relative to the working
    directory."""
    from pathlib import Path

    data = apply_overrides(experiment_config(exp), overrides)
    cfg = from_dict(FleetConfig, data, "", source=f"experiment {exp.id}" + (" (with overrides)" if overrides else ""))
    return _resolve_profiles(cfg, Path.cwd())
