"""Fleet config: defaults, strict YAML, unknown keys with their key path, type and value errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from common.errors import ConfigError, UserError
from replay.config import EngineArgs, FleetConfig, PoolConfig, SloConfig, StepModelArgs, load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "e2e"


@pytest.fixture
def load(tmp_path):
    """`load(text)` -> FleetConfig from a file `fleet.yaml` holding `text`."""

    def go(text: str) -> FleetConfig:
        path = tmp_path / "fleet.yaml"
        path.write_text(text)
        return load_config(path)

    return go


@pytest.fixture
def error(load):
    """`error(text)` -> the ConfigError message (one line, naming the file) for `text`."""

    def go(text: str) -> str:
        with pytest.raises(ConfigError) as err:
            load(text)
        assert isinstance(err.value, UserError)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith("fleet.yaml") or "/fleet.yaml" in message.split(":")[0], message
        return message

    return go


# --- defaults --------------------------------------------------------------------------------------


def test_engine_args_defaults_are_vllm_v1s():
    e = EngineArgs()
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.block_size) == (256, 8192, 16)
    assert e.gpu_memory_utilization == 0.9
    assert e.enable_prefix_caching is True
    assert e.kv_cache_dtype == "auto"
    assert e.num_gpu_blocks_override is None and e.max_model_len is None
    assert e.long_prefill_token_threshold == 0


def test_pool_config_defaults():
    p = PoolConfig()
    assert (p.name, p.replicas, p.tensor_parallel_size, p.router) == ("default", 1, 1, "least-outstanding")
    assert p.workloads == ()
    assert p.model is None and p.gpu is None and p.weight_dtype is None and p.price_usd_per_gpu_hour is None
    assert p.engine == EngineArgs() and p.step_model == StepModelArgs()


def test_fleet_config_defaults_and_default_load():
    f = FleetConfig()
    assert (f.model, f.gpu) == ("llama-3.1-70b", "h100-sxm-80gb")
    assert f.slo == SloConfig(ttft_ms=2000.0, tpot_ms=100.0)
    assert (f.tick_s, f.metrics_window_s, f.max_drain_s, f.seed) == (1.0, 60.0, 3600.0, 0)
    assert f.trace is None and f.weight_dtype is None and f.price_usd_per_gpu_hour is None
    assert f.pools == (PoolConfig(replicas=2, tensor_parallel_size=4),)
    assert load_config(None) == f


def test_a_minimal_file_keeps_every_other_default(load):
    cfg = load("pools: [{name: a}]\n")
    assert cfg.pools == (PoolConfig(name="a"),)
    assert dataclasses.replace(cfg, pools=FleetConfig().pools) == FleetConfig()
    assert load("slo: null\n").slo == SloConfig()


def test_issue_config_loads_as_is():
    cfg = load_config(FIXTURES / "issue_fleet.yaml")
    assert cfg.pools == (PoolConfig(
        name="default", replicas=4, tensor_parallel_size=4, router="least-outstanding",
        engine=EngineArgs(max_num_seqs=256, max_num_batched_tokens=8192, enable_prefix_caching=True),
    ),)
    assert cfg.slo == SloConfig(2000.0, 100.0)


def test_values_are_coerced_and_frozen(load):
    cfg = load("tick_s: 2\nslo: {ttft_ms: 500}\npools:\n  - {name: a, workloads: [x, y]}\n")
    assert cfg.tick_s == 2.0 and isinstance(cfg.tick_s, float)
    assert cfg.slo.ttft_ms == 500.0 and cfg.slo.tpot_ms == 100.0
    assert cfg.pools[0].workloads == ("x", "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tick_s = 3.0  # type: ignore[misc]


def test_to_dict_round_trips_and_the_hash_is_stable(load, tmp_path):
    cfg = load(
        "model: llama-3.1-8b\ntrace: {path: azure-code-2023, window: {end_s: 60}, sample: {n: 5, seed: 2}}\n"
        "pools:\n  - {name: a, replicas: 2, workloads: [code], engine: {max_num_seqs: 8}}\n  - {name: b}\n"
    )
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    assert load_config(again) == cfg
    assert load_config(again).sha256() == cfg.sha256()
    assert dataclasses.replace(cfg, seed=1).sha256() != cfg.sha256()


# --- unknown keys name their path and list the known ones -----------------------------------------

UNKNOWN = {
    "top": ("modle: llama-3.1-8b\n", "'modle'", ["gpu", "model", "pools", "slo", "trace"]),
    "slo": ("slo: {ttft: 5}\n", "'slo.ttft'", ["tpot_ms", "ttft_ms"]),
    "pool": ("pools: [{name: a, replica: 2}]\n", "'pools[0].replica'", ["replicas", "router", "workloads"]),
    "second pool engine": ("pools: [{name: a}, {name: b, engine: {max_num_seq: 3}}]\n",
                           "'pools[1].engine.max_num_seq'", ["max_num_seqs", "block_size"]),
    "step model": ("pools: [{name: a, step_model: {mfo: 1}}]\n", "'pools[0].step_model.mfo'", ["mfu", "mbu"]),
    "trace": ("trace: {windw: {end_s: 1}}\n", "'trace.windw'", ["window", "sample", "merge"]),
    "trace window": ("trace: {window: {end: 1}}\n", "'trace.window.end'", ["end_s", "start_s"]),
    "trace sample": ("trace: {sample: {n: 3, sed: 1}}\n", "'trace.sample.sed'", ["fraction", "n", "seed"]),
    "trace filter": ("trace: {filter: {min_prompt: 3}}\n", "'trace.filter.min_prompt'", ["min_prompt_tokens"]),
    "trace merge": ("trace: {merge: [{path: a.csv, offst_s: 1}]}\n", "'trace.merge[0].offst_s'", ["offset_s", "path"]),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN))
def test_unknown_keys_name_the_key_path(error, case):
    text, key, known = UNKNOWN[case]
    message = error(text)
    assert f"unknown key {key}" in message
    listed = message.split("known keys:")[1]
    for name in known:
        assert name in listed


# --- type errors ------------------------------------------------------------------------------------

TYPES = {
    "replicas string": ("pools: [{name: a, replicas: two}]\n", ["pools[0].replicas", "'two'", "an integer"]),
    "replicas fraction": ("pools: [{name: a, replicas: 2.5}]\n", ["pools[0].replicas", "2.5", "an integer"]),
    "replicas bool": ("pools: [{name: a, replicas: true}]\n", ["pools[0].replicas", "an integer"]),
    "max_num_seqs float": ("pools: [{name: a, engine: {max_num_seqs: 8.0}}]\n",
                           ["pools[0].engine.max_num_seqs", "8.0", "an integer"]),
    "bool as string": ("pools: [{name: a, engine: {enable_prefix_caching: 'yes'}}]\n",
                       ["pools[0].engine.enable_prefix_caching", "'yes'", "true or false"]),
    "bool as int": ("pools: [{name: a, engine: {enable_prefix_caching: 1}}]\n",
                    ["pools[0].engine.enable_prefix_caching", "1", "true or false"]),
    "float as string": ("tick_s: fast\n", ["tick_s", "'fast'", "a finite number"]),
    "infinite float": ("tick_s: .inf\n", ["tick_s", "inf", "a finite number"]),
    "NaN float": ("slo: {ttft_ms: .nan}\n", ["slo.ttft_ms", "nan", "a finite number"]),
    "string as int": ("model: 8\n", ["model", "8", "a string"]),
    "null model": ("model: null\n", ["model", "None", "a string"]),
    "workloads not a list": ("pools: [{name: a, workloads: conv}]\n", ["pools[0].workloads", "'conv'", "a list"]),
    "workload not a string": ("pools: [{name: a, workloads: [1]}]\n", ["pools[0].workloads[0]", "1", "a string"]),
    "pools a mapping": ("pools: {name: a}\n", ["pools", "a list"]),
    "pools null": ("pools: null\n", ["pools", "a list"]),
    "slo a number": ("slo: 5\n", ["slo", "a mapping", "5"]),
    "engine a list": ("pools: [{name: a, engine: [1]}]\n", ["pools[0].engine", "a mapping"]),
    "top level a list": ("- a\n- b\n", ["top level", "a mapping"]),
    "top level a string": ("just text\n", ["top level", "a mapping", "'just text'"]),
    "pool name int": ("pools: [{name: 123}]\n", ["pools[0].name", "123", "a string"]),
}


@pytest.mark.parametrize("case", sorted(TYPES))
def test_type_errors_name_key_value_and_expectation(error, case):
    text, fragments = TYPES[case]
    message = error(text)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


VALUES = {
    "negative replicas": ("pools: [{name: a, replicas: -1}]\n", ["pools[0]", "replicas", "-1", ">= 0"]),
    "zero tp": ("pools: [{name: a, tensor_parallel_size: 0}]\n", ["pools[0]", "tensor_parallel_size", "0", "> 0"]),
    "unknown router": ("pools: [{name: a, router: fastest}]\n",
                       ["pools[0]", "router", "'fastest'", "least-outstanding", "round-robin"]),
    "bad pool name": ("pools: [{name: 'a b'}]\n", ["pools[0]", "name", "'a b'", "letters, digits"]),
    "empty pool name": ("pools: [{name: ''}]\n", ["pools[0]", "name", "''"]),
    "block size": ("pools: [{name: a, engine: {block_size: 7}}]\n", ["block_size", "7", "power of 2"]),
    "memory utilization": ("pools: [{name: a, engine: {gpu_memory_utilization: 1.5}}]\n",
                           ["gpu_memory_utilization", "1.5", "(0, 1]"]),
    "max_num_seqs": ("pools: [{name: a, engine: {max_num_seqs: 0}}]\n", ["max_num_seqs", "0", "> 0"]),
    "pool price": ("pools: [{name: a, price_usd_per_gpu_hour: -2}]\n", ["price_usd_per_gpu_hour", "-2", ">= 0"]),
    "mfu": ("pools: [{name: a, step_model: {mfu: 1.5}}]\n", ["mfu", "1.5", "(0, 1]"]),
    "slo": ("slo: {ttft_ms: 0}\n", ["slo.ttft_ms", "got 0", "> 0"]),
    "tick_s": ("tick_s: 0\n", ["tick_s", "0", "> 0"]),
    "metrics window": ("metrics_window_s: -5\n", ["metrics_window_s", "-5", "> 0"]),
    "max drain": ("max_drain_s: -1\n", ["max_drain_s", "-1", ">= 0"]),
    "no pools": ("pools: []\n", ["pools", "at least one pool"]),
    "trace window": ("trace: {window: {start_s: 10, end_s: 5}}\n", ["trace.window", "end_s=5", "start_s"]),
    "trace sample": ("trace: {sample: {fraction: 0.5, n: 3}}\n", ["trace.sample", "exactly one of fraction and n"]),
    "trace format": ("trace: {format: xml}\n", ["trace", "'xml'", "known", "azure"]),
}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_value_errors_name_key_value_and_expectation(error, case):
    text, fragments = VALUES[case]
    message = error(text)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# --- YAML itself ------------------------------------------------------------------------------------


def test_duplicate_keys_are_errors_at_any_depth(error):
    assert "line 2" in error("model: llama-3.1-8b\nmodel: llama-3.1-70b\n")
    deep = error("pools:\n  - name: a\n    engine:\n      block_size: 16\n      block_size: 32\n")
    assert "line 5" in deep and "duplicate key 'block_size'" in deep
    assert "duplicate key 'name'" in error("pools:\n  - {name: a, name: b}\n")


def test_duplicate_key_message_does_not_blame_plain_values(error):
    assert "plain YAML" not in error("model: llama-3.1-8b\nmodel: llama-3.1-70b\n")


@pytest.mark.parametrize("text", ["", "   \n\n", "# only a comment\n", "---\n"])
def test_empty_file(error, text):
    message = error(text)
    assert "empty" in message and "expected a mapping" in message


@pytest.mark.parametrize("text", [
    'model: !!python/object/apply:os.system ["echo hi"]\n',
    "!!python/object/new:dict {}\n",
    "model: !!python/name:os.system\n",
])
def test_python_tags_are_refused(error, text):
    message = error(text)
    assert "line 1" in message and "python" in message


def test_invalid_yaml_names_the_line(error):
    message = error("model: llama-3.1-8b\npools: [unclosed\n")
    assert "not valid YAML" in message and "line 3" in message


def test_missing_unreadable_and_non_text_files(tmp_path):
    with pytest.raises(ConfigError, match="nosuch.yaml: config file not found"):
        load_config(tmp_path / "nosuch.yaml")
    with pytest.raises(ConfigError, match=r"is a directory \(expected a config file\)"):
        load_config(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(binary)


# --- pools as a whole -------------------------------------------------------------------------------


def test_duplicate_pool_names(error):
    assert "pool name 'a' appears twice" in error("pools: [{name: a}, {name: b}, {name: a}]\n")
    assert "'default' appears twice" in error("pools: [{}, {}]\n")


def test_workload_listed_by_two_pools(error):
    message = error("pools:\n  - {name: a, workloads: [conv, code]}\n  - {name: b, workloads: [code]}\n")
    assert "workload 'code' is listed by both 'a' and 'b'" in message


def test_every_pool_with_zero_replicas(error):
    assert "every pool has 0 replicas" in error("pools: [{name: a, replicas: 0}, {name: b, replicas: 0}]\n")


def test_some_pools_with_zero_replicas_are_fine(load):
    cfg = load("pools: [{name: a, replicas: 0, workloads: [x]}, {name: b, replicas: 1}]\n")
    assert [p.replicas for p in cfg.pools] == [0, 1]


def test_direct_construction_checks_too():
    with pytest.raises(ValueError, match="appears twice"):
        FleetConfig(pools=(PoolConfig(name="a"), PoolConfig(name="a")))
    with pytest.raises(ValueError, match="every pool has 0 replicas"):
        FleetConfig(pools=(PoolConfig(replicas=0),))
    with pytest.raises(ValueError, match="listed by both"):
        FleetConfig(pools=(PoolConfig(name="a", workloads=("x",)), PoolConfig(name="b", workloads=("x",))))
    with pytest.raises(ValueError, match="router"):
        PoolConfig(router="fastest")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineArgs(max_num_batched_tokens=0)


# --- bugs --------------------------------------------------------------------------------------------


def test_negative_fleet_price(error):
    assert "price_usd_per_gpu_hour" in error("price_usd_per_gpu_hour: -1\n")


def test_merge_entry_without_path(error):
    message = error("trace: {merge: [{workload: x}]}\n")
    assert "__init__" not in message and "positional argument" not in message
    assert "trace.merge[0]" in message and "path" in message


def test_value_errors_give_one_key_path(error):
    assert "pools[0].engine.gpu_memory_utilization" in error(
        "pools: [{name: a, engine: {gpu_memory_utilization: 1.5}}]\n")
    assert "slo: slo:" not in error("slo: {ttft_ms: 0}\n")


def test_unknown_keys_of_mixed_types(error):
    assert "unknown key" in error("modle: x\n1: 2\n")


def test_two_catch_all_pools_are_refused(load):
    with pytest.raises(ConfigError, match="more than one pool lists no workloads"):
        load("pools: [{name: a}, {name: b}]\n")


def test_prompt_length_split_needs_one_threshold_fewer_than_pools(load):
    cfg = load("split: {policy: by-prompt-length, prompt_thresholds: [2048]}\npools: [{name: a}, {name: b}]\n")
    assert cfg.split.prompt_thresholds == (2048,)
    with pytest.raises(ConfigError, match="one threshold fewer than pools"):
        load("split: {policy: by-prompt-length, prompt_thresholds: [1, 2]}\npools: [{name: a}, {name: b}]\n")
    with pytest.raises(ConfigError, match="split.prompt_thresholds"):
        load("split: {policy: by-prompt-length, prompt_thresholds: [9, 3]}\npools: [{name: a}, {name: b}, {name: c}]\n")
    with pytest.raises(ConfigError, match="unknown pool split 'random'"):
        load("split: {policy: random}\n")
