"""Models from Hugging Face config.json files: parameter counts against published sizes, the catalog
entries counted from their published configs, quantization formats, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import ConfigError
from replay.config import load_config
from replay.model.hf.config import MAX_BYTES, load_model
from replay.model.memory import weights_bytes
from replay.model.specs import MODELS, get_model, weight_bits
from replay.model.models import spec_from_config

SHARED_MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"

# Published sizes, folder of ../shared/models -> (total, active or None, source). "safetensors" is
# the parameter total the Hugging Face hub shows for the checkpoint. A figure is checked within 1%, or
# within half a unit of its last digit where that is looser ("17B": 16.5B to 17.5B). Vendors count
# "active" differently: DeepSeek's leaves out the input embedding, GLM's both embedding tables
# (the `without` column says which), and round them to two digits: "active" is checked within 2.5%
# (counted: DeepSeek-V2-Lite 2.45B, Qwen3-30B-A3B 3.35B, Llama 4 Scout 17.17B, GLM 39.9B).
PUBLISHED = {
    "codellama-34b-instruct-hf": ("33.7B", None, "", "hub safetensors: codellama/CodeLlama-34b-Instruct-hf 33.7B"),
    "deepseek-v2-lite": ("15.7B", "2.4B", "input", "model card: 15.7B total, 2.4B activated"),
    "glm-5.2-fp8": ("744B", "40B", "both", "GLM-5 report (arXiv:2602.15763) table: 744B total, 40B activated"),
    "llama-2-7b-hf": ("6.74B", None, "", "hub safetensors: meta-llama/Llama-2-7b-hf 6.74B"),
    "llama-3.1-70b-instruct": ("70.6B", None, "", "hub safetensors: meta-llama/Llama-3.1-70B-Instruct 70.6B"),
    "llama-3.1-8b-instruct": ("8.03B", None, "", "hub safetensors: meta-llama/Llama-3.1-8B-Instruct 8.03B"),
    "llama-4-scout-17b-16e-instruct-fp8-dynamic": ("109B", "17B", "", "model card: 17B active, 109B total"),
    "mistral-nemo-instruct-2407": ("12.2B", None, "", "hub safetensors: mistralai/Mistral-Nemo-Instruct-2407 12.2B"),
    "mixtral-8x7b-v0.1": ("46.7B", "12.9B", "", "Mistral's Mixtral announcement: 46.7B total, 12.9B per token"),
    "qwen2.5-7b-instruct": ("7.61B", None, "", "model card: Number of Parameters 7.61B"),
    "qwen3-14b": ("14.8B", None, "", "model card: Number of Parameters 14.8B"),
    "qwen3-30b-a3b": ("30.5B", "3.3B", "", "model card: 30.5B total, 3.3B activated"),
    "yi-34b": ("34.4B", None, "", "hub safetensors: 01-ai/Yi-34B 34.4B"),
}
# Which catalog entry each shared file is (counted from the same fields, it must agree exactly).
ACTIVE_REL = 0.025
CATALOG_ID = {
    "codellama-34b-instruct-hf": "codellama-34b", "deepseek-v2-lite": "deepseek-v2-lite",
    "glm-5.2-fp8": "glm-5.2-fp8", "llama-2-7b-hf": "llama-2-7b", "llama-3.1-70b-instruct": "llama-3.1-70b",
    "llama-3.1-8b-instruct": "llama-3.1-8b", "llama-4-scout-17b-16e-instruct-fp8-dynamic": "llama-4-scout-fp8",
    "mistral-nemo-instruct-2407": "mistral-nemo-12b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b", "qwen3-14b": "qwen3-14b", "qwen3-30b-a3b": "qwen3-30b-a3b",
    "yi-34b": "yi-34b",
}


def _published(figure: str) -> tuple[float, float]:
    """("2.4B") -> (2.4e9, relative tolerance): 1%, or half a unit of the last digit if looser."""
    digits = figure.removesuffix("B")
    decimals = len(digits.partition(".")[2])
    value = float(digits) * 1e9
    return value, max(0.01, 0.5 * 10 ** -decimals * 1e9 / value)


def _shared(folder: str) -> Path:
    if not SHARED_MODELS.is_dir():
        pytest.skip("no ../shared/models here")
    return SHARED_MODELS / folder


def test_every_shared_model_has_a_published_size():
    folders = {p.name for p in _shared(".").iterdir() if p.is_dir()}
    assert folders == set(PUBLISHED) == set(CATALOG_ID)


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(folder):
    total, active, without, source = PUBLISHED[folder]
    m = load_model(_shared(folder))
    value, rel = _published(total)
    assert m.total_params == pytest.approx(value, rel=rel), source
    if active is None:
        assert m.active_params == m.total_params and not m.is_moe
        return
    table = m.vocab_size * m.hidden_size
    counted = m.active_params - {"": 0, "input": table, "both": 2 * table}[without]
    assert counted == pytest.approx(_published(active)[0], rel=ACTIVE_REL), source


@pytest.mark.parametrize("folder", sorted(CATALOG_ID))
def test_each_shared_file_is_its_catalog_entry(folder):
    m, entry = load_model(_shared(folder)), MODELS[CATALOG_ID[folder]]
    for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
                "total_params", "active_params", "expert_params", "num_experts", "experts_per_token",
                "kv_elements_per_token", "moe_layers", "expert_weight_dtype", "unquantized_params"):
        assert getattr(m, key) == getattr(entry, key), key
    # Llama-2-7b-hf ships FP16 where the catalog says bf16: the same 16 bits per weight.
    assert weight_bits(m.default_weight_dtype) == weight_bits(entry.default_weight_dtype)


def test_the_shared_files_read_what_vllm_would_load():
    scout = load_model(_shared("llama-4-scout-17b-16e-instruct-fp8-dynamic"))
    assert scout.default_weight_dtype == "fp8" and scout.num_shared_experts == 1 and scout.vision_params > 8e8
    assert (scout.num_experts, scout.experts_per_token, scout.moe_layers) == (16, 1, 48)
    glm = load_model(_shared("glm-5.2-fp8"))
    assert glm.is_mla and glm.kv_elements_per_token == 78 * (512 + 64) and glm.num_dense_layers == 3
    lite = load_model(_shared("deepseek-v2-lite"))
    assert (lite.num_shared_experts, lite.num_dense_layers, lite.moe_layers) == (2, 1, 26)
    nemo = load_model(_shared("mistral-nemo-instruct-2407"))
    assert nemo.head_dim == 128 != nemo.hidden_size // nemo.num_attention_heads
    assert load_model(_shared("llama-2-7b-hf")).dtype == "fp16"


def test_layers_a_quantization_ignore_list_names_stay_16_bit():
    # RedHatAI's Scout FP8 lists every text layer's attention projections and router by name (242
    # of its 449 entries; the rest are the vision tower, projector and lm_head, 16-bit anyway).
    scout = load_model(_shared("llama-4-scout-17b-16e-instruct-fp8-dynamic"))
    h, q, kv = 5120, 40 * 128, 8 * 128
    assert scout.unquantized_params == 48 * (2 * h * q + 2 * h * kv + h * 16)
    # The checkpoint's own format reads them at 16 bits; an explicit fp8 quantizes them too.
    assert weights_bytes(scout) - weights_bytes(scout, "fp8") == scout.unquantized_params


def _ignoring(ignore, **quant):
    text = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    return spec_from_config("m", "m", "m", {"architectures": ["LlamaForCausalLM"], **text, "quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ignore, "config_groups": {"g": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}, **quant}}, "x/config.json")


def test_ignore_entries_by_name_pattern_and_fused_projection():
    q, kv, o = 64 * 64, 64 * 32, 64 * 64
    assert _ignoring([]).unquantized_params == 0
    assert _ignoring(["model.layers.0.self_attn.q_proj", "lm_head"]).unquantized_params == q
    assert _ignoring(["re:.*self_attn.*"]).unquantized_params == 2 * (q + 2 * kv + o)
    assert _ignoring(["model.layers.1.self_attn.qkv_proj"]).unquantized_params == q + 2 * kv
    assert _ignoring(["re:.*vision.*", "model.layers.7.self_attn.q_proj"]).unquantized_params == 0


@pytest.mark.parametrize("ignore, expected", [
    ("lm_head", "expected a list of module names"),
    (["re:(unclosed"], "is not a regular expression"),
])
def test_a_bad_ignore_list_names_the_key(ignore, expected):
    with pytest.raises(ConfigError, match=r"x/config\.json: quantization_config\.ignore: .*" + expected):
        _ignoring(ignore)


# Exact figures of the entries counted from their configs (replay/model/models.py `_hf`), with each
# published size: a change to the counting code that moves them fails here.
CATALOG_COUNTS = {
    "codellama-34b": (33_743_970_304, 33_743_970_304),
    "yi-34b": (34_388_917_248, 34_388_917_248),
    "llama-3.3-70b": (70_553_706_496, 70_553_706_496),          # hub: 70.6B
    "mistral-nemo-12b": (12_247_782_400, 12_247_782_400),
    "qwen2.5-7b": (7_615_616_512, 7_615_616_512),
    "qwen3-14b": (14_768_307_200, 14_768_307_200),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),       # model card: 235B total, 22B activated
    "mixtral-8x22b": (140_620_634_112, 39_152_031_744),         # Mistral's announcement: 141B, 39B active
    "llama-4-scout-fp8": (108_641_793_536, 17_172_894_720),
    "deepseek-v2-lite": (15_706_484_224, 2_661_150_208),
    "deepseek-r1": (671_026_419_200, 37_552_297_472),           # = DeepSeek-V3: 671B, 37B activated
    "glm-5.2-fp8": (743_911_218_432, 41_784_728_832),
    "gpt-oss-20b": (20_914_757_184, 3_608_307_264),             # model card: 20.9B total, 3.6B active
}


@pytest.mark.parametrize("model_id", sorted(CATALOG_COUNTS))
def test_catalog_entries_counted_from_their_configs(model_id):
    m = get_model(model_id)
    assert (m.total_params, m.active_params) == CATALOG_COUNTS[model_id]
    assert m.architecture


# The hand-written entries, as their published config.json files give them: the counting code
# must reproduce every figure (so neither can drift from the other).
LLAMA = dict(architectures=["LlamaForCausalLM"], max_position_embeddings=131072, vocab_size=128256)
HAND_CONFIGS = {
    "llama-3.1-8b": dict(LLAMA, num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336),
    "llama-3.1-70b": dict(LLAMA, num_hidden_layers=80, hidden_size=8192, num_attention_heads=64,
                          num_key_value_heads=8, intermediate_size=28672),
    "llama-3.1-405b": dict(LLAMA, num_hidden_layers=126, hidden_size=16384, num_attention_heads=128,
                           num_key_value_heads=8, intermediate_size=53248),
    "llama-2-70b": dict(LLAMA, num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                        intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096),
    "qwen2.5-72b": dict(architectures=["Qwen2ForCausalLM"], num_hidden_layers=80, hidden_size=8192,
                        num_attention_heads=64, num_key_value_heads=8, intermediate_size=29568, vocab_size=152064,
                        max_position_embeddings=32768),
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], num_hidden_layers=32, hidden_size=4096,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
                         num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768),
    "deepseek-v3": dict(architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=61, hidden_size=7168,
                        num_attention_heads=128, intermediate_size=18432, q_lora_rank=1536, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256,
                        n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048,
                        first_k_dense_replace=3, topk_method="noaux_tc", vocab_size=129280,
                        max_position_embeddings=163840, quantization_config={"quant_method": "fp8"}),
    "gpt-oss-120b": dict(architectures=["GptOssForCausalLM"], num_hidden_layers=36, hidden_size=2880,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=64, intermediate_size=2880,
                         num_local_experts=128, num_experts_per_tok=4, vocab_size=201088,
                         max_position_embeddings=131072, quantization_config={"quant_method": "mxfp4"}),
}


@pytest.mark.parametrize("model_id", sorted(HAND_CONFIGS))
def test_the_counting_code_reproduces_the_hand_written_entries(model_id):
    counted, entry = spec_from_config(model_id, "", "", HAND_CONFIGS[model_id], model_id), MODELS[model_id]
    for key in ("total_params", "active_params", "expert_params", "num_dense_layers", "intermediate_size",
                "head_dim", "kv_elements_per_token", "max_model_len", "default_weight_dtype", "expert_weight_dtype"):
        assert getattr(counted, key) == getattr(entry, key), key


# Architectures with no shared file: published configs (hub pages) and the totals their publishers give.
@pytest.mark.parametrize("config, total, active", [
    # microsoft/Phi-3-mini-4k-instruct config.json; hub safetensors 3.82B params.
    (dict(architectures=["Phi3ForCausalLM"], hidden_size=3072, intermediate_size=8192, num_attention_heads=32,
          num_hidden_layers=32, num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096), "3.82B", None),
    # ibm-granite/granite-3.1-8b-instruct (40 layers, hidden 4096, FFN 12800, 32 / 8 heads, vocab 49155,
    # tied embeddings); hub: 8.17B params.
    (dict(architectures=["GraniteForCausalLM"], hidden_size=4096, intermediate_size=12800, num_attention_heads=32,
          num_hidden_layers=40, num_key_value_heads=8, vocab_size=49155, tie_word_embeddings=True,
          max_position_embeddings=131072), "8.17B", None),
    # Qwen/Qwen1.5-MoE-A2.7B config.json (Qwen2MoeForCausalLM); model card: "14.3B parameters in total
    # and 2.7B activated parameters".
    (dict(architectures=["Qwen2MoeForCausalLM"], hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
          shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4, num_attention_heads=16,
          num_key_value_heads=16, num_hidden_layers=24, vocab_size=151936, max_position_embeddings=8192), "14.3B", "2.7B"),
])
def test_counts_of_architectures_without_a_shared_file(config, total, active):
    m = spec_from_config("x", "x", "", config, "config.json")
    assert m.total_params == pytest.approx(*_published(total))
    assert m.active_params == (m.total_params if active is None else pytest.approx(*_published(active)))


def test_a_fleet_config_names_a_config_json_relative_to_itself(tmp_path):
    model_dir = tmp_path / "models" / "tiny"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(HAND_CONFIGS["llama-3.1-8b"]))
    (tmp_path / "fleet.yaml").write_text("model: models/tiny\npools:\n  - {name: a, model: models/tiny/config.json}\n")
    cfg = load_config(tmp_path / "fleet.yaml")
    assert Path(cfg.model) == model_dir.resolve() and Path(cfg.pools[0].model) == (model_dir / "config.json").resolve()
    assert get_model(cfg.model).total_params == MODELS["llama-3.1-8b"].total_params
    assert load_config(tmp_path / "fleet.yaml").model == cfg.model  # a catalog id is left alone below
    (tmp_path / "ids.yaml").write_text("model: llama-3.1-8b\n")
    assert load_config(tmp_path / "ids.yaml").model == "llama-3.1-8b"


def test_file_bounds(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match=r"big.json: .* bytes, expected a config.json of at most"):
        load_model(big)
    deep = tmp_path / "deep.json"
    deep.write_text('{"architectures": ["LlamaForCausalLM"], "x": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(ConfigError, match="deep.json: JSON nested too deep"):
        load_model(deep)
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "dir.json" / "config.json").mkdir()
    with pytest.raises(ConfigError, match="expected a regular file"):
        load_model(tmp_path / "dir.json")
