"""`model:` / `--model` as a Hugging Face config.json: what `catalog --model` prints, a run on one,
and every bad file as one line and exit 2."""

from __future__ import annotations

import json

import pytest

from replay.model.specs import MODELS
from tests.e2e.conftest import read_run, small_fleet

# Qwen/Qwen2.5-7B-Instruct's config.json fields (../shared/models/qwen2.5-7b-instruct).
QWEN = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def _config(write, name="m/config.json", **changes):
    data = {**QWEN, **changes}
    return write(name, json.dumps({k: v for k, v in data.items() if v is not ...}))


def test_catalog_model_prints_what_was_read(cli, write):
    _config(write, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})
    res = cli("catalog", "--model", "m")
    assert res.code == 0, res.err
    for text in ("Qwen2ForCausalLM", "28", "3,584", "7,615,616,512", "awq", "57,344 B"):
        assert text in res.out, text
    info = json.loads(cli("catalog", "--model", "m/config.json", "--json").out)
    assert info["layers"] == 28 and info["hidden_size"] == 3584 and info["heads"] == 28
    assert info["kv_heads"] == 4 and info["head_dim"] == 128
    assert (info["experts_total"], info["experts_active"], info["experts_shared"]) == (0, 0, 0)
    assert info["params_total"] == info["params_active"] == MODELS["qwen2.5-7b"].total_params
    assert info["weight_format"] == "awq" and info["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2
    assert json.loads(cli("catalog", "--model", "deepseek-r1", "--json").out)["experts_shared"] == 1


@pytest.mark.parametrize("quant, expected", [
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "int", "strategy": "channel"}, "input_activations": {"num_bits": 8}}}}, "int8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}, "gptq"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}, "fp8"),
    # 8-bit weights without activation quantization run weight-only (Marlin) on every GPU
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "w8a16"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "int", "strategy": "channel"}}}}, "w8a16"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "float", "group_size": 16}}}}, "nvfp4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq"),
    ({"quant_method": "gptq", "bits": 8}, "w8a16"),
    ({"quant_method": "awq", "bits": 4}, "awq"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
])
def test_quantization_config_gives_the_weight_format(cli, write, quant, expected):
    _config(write, quantization_config=quant)
    assert json.loads(cli("catalog", "--model", "m", "--json").out)["weight_format"] == expected


def test_a_run_on_a_config_json_relative_to_the_fleet_config(cli, write, tmp_path):
    _config(write, "models/qwen/config.json")
    cfg = write("fleets/f.yaml", small_fleet("{path: azure-conv-2023, window: {end_s: 30}}",
                                             model="../models/qwen"))
    res = cli("run", "--config", cfg, "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    assert run.summary["pools"]["default"]["finished"] > 0
    assert str((tmp_path / "models" / "qwen").resolve()) in run.config_text


BAD = [
    # (file text or fields, fragments the one error line must hold)
    ("{not json", ["config.json: line 1: not valid JSON"]),
    ('{"a": 1, "a": 2}', ["config.json: not valid JSON: duplicate key 'a'"]),
    ('{"hidden_size": NaN}', ["NaN is not a number JSON allows"]),
    ("[1, 2]", ["expected a JSON object"]),
    ({"num_hidden_layers": ...}, ["config.json: num_hidden_layers: missing; Qwen2ForCausalLM needs it"]),
    ({"hidden_size": "4096"}, ["hidden_size: got '4096', expected a positive integer"]),
    ({"hidden_size": 10**12}, ["hidden_size: got 1000000000000, expected a positive integer up to 16,777,216"]),
    ({"architectures": ["BertModel"]}, ["architectures: 'BertModel' is not supported; expected one of",
                                        "LlamaForCausalLM"]),
    ({"architectures": ...}, ["architectures: got None, expected a list naming the model class"]),
    ({"quantization_config": {"quant_method": "bitsandbytes"}},
     ["quantization_config.quant_method: got 'bitsandbytes', expected one of fp8"]),
    ({"quantization_config": {"quant_method": "awq", "bits": 3}}, ["quantization_config.bits: got 3, expected 4"]),
    ({"num_attention_heads": 30}, ["num_attention_heads: got 30, expected a divisor of hidden_size (3584)"]),
    ({"num_key_value_heads": 5}, ["num_key_value_heads: got 5, expected a divisor of num_attention_heads (28)"]),
    ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 9},
     ["num_experts_per_tok: got 9, expected at most the 8 experts"]),
    ({"torch_dtype": "float128"}, ["torch_dtype: got 'float128', expected one of float16, bfloat16, float32"]),
    ({"torch_dtype": 5}, ["torch_dtype: got 5, expected one of"]),
]


@pytest.mark.parametrize("content, fragments", BAD)
def test_a_bad_config_json_is_one_line_and_exit_2(cli, write, tmp_path, content, fragments):
    if isinstance(content, str):
        write("m/config.json", content)
    else:
        _config(write, **content)
    for argv in (("catalog", "--model", "m"), ("capacity", "--model", "m", "--gpu", "h100-sxm-80gb")):
        res = cli(*argv)
        assert res.code == 2, res
        assert res.err.startswith("llm-replay: error: ") and res.err.count("\n") == 1, res.err
        assert "m/config.json" in res.err and all(f in res.err for f in fragments), res.err
    cfg = write("f.yaml", small_fleet("{path: azure-conv-2023, window: {end_s: 10}}", model="m"))
    res = cli("run", "--config", cfg, "--out", "o", "-q")
    assert res.code == 2 and "f.yaml: model: " in res.err and all(f in res.err for f in fragments), res.err
    assert res.err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_tensor_parallel_follows_vllms_kv_head_rule(cli, write):
    """vLLM (vllm/config/model.py verify_with_parallel_config) needs TP to divide the attention
    heads; QKVParallelLinear (vllm/model_executor/layers/linear.py) splits the KV heads when
    TP <= KV heads (TP must divide them) and replicates them when TP > KV heads (KV heads must
    divide TP)."""
    _config(write, num_attention_heads=48, hidden_size=6144, num_key_value_heads=8)
    ok = cli("capacity", "--model", "m", "--gpu", "h100-sxm-80gb", "--tp", "16")  # 8 KV heads, each on 2 GPUs
    assert ok.code == 0, ok.err
    bad = cli("capacity", "--model", "m", "--gpu", "h100-sxm-80gb", "--tp", "3")
    assert bad.code == 2 and "--tp: got 3" in bad.err and "8 KV heads" in bad.err, bad.err
    assert "m/config.json" in bad.err and bad.err.count("\n") == 1
    heads = cli("capacity", "--model", "m", "--gpu", "h100-sxm-80gb", "--tp", "32")
    assert heads.code == 2 and "divisor of m/config.json's 48 attention heads" in heads.err, heads.err


def test_a_missing_model_file_names_the_path(cli):
    res = cli("catalog", "--model", "nowhere/config.json")
    assert res.code == 2 and "nowhere/config.json: model config not found" in res.err, res.err
