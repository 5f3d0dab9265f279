"""Model architectures: the numbers memory and step-time arithmetic need, from each HF config.json.

Counts are plain numbers (parameters, not billions); sizes are in elements; dtypes use the names of
`replay.model.specs.WEIGHT_DTYPE_BITS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from replay.model.hf.arch_moe import fields_from_config
from replay.model.hf.quant import unquantized_params, weight_formats


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer as vLLM loads it.

    `total_params` counts every weight (embeddings and lm_head included); `active_params` is the
    count one token's forward pass touches (routed experts at `experts_per_token / num_experts`).
    MLA models (DeepSeek) cache one compressed latent of `kv_lora_rank + qk_rope_head_dim` elements
    per token per layer instead of K and V heads; `num_kv_heads` and `head_dim` then only describe
    the attention compute. `expert_params` are the weights that live in routed experts; they use
    `expert_weight_dtype` when set (gpt-oss ships MXFP4 experts and BF16 everything else).
    """

    id: str
    name: str
    hf_repo: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    total_params: float
    active_params: float
    max_model_len: int
    default_weight_dtype: str = "bf16"
    # Activation dtype; `kv_cache_dtype="auto"` stores KV in it, as vLLM does.
    dtype: str = "bf16"
    tie_word_embeddings: bool = False
    # MLA (DeepSeek-V2/V3): 0 means ordinary multi-head / grouped-query attention.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    # MoE: 0 experts means dense. `moe_intermediate_size` is one expert's FFN width.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    expert_params: float = 0.0
    expert_weight_dtype: str | None = None
    # Layers with a dense FFN in an MoE model (DeepSeek-V3's first `first_k_dense_replace`, Llama 4's
    # non-MoE interleaved layers): only their count matters.
    num_dense_layers: int = 0
    # Always-on experts per MoE layer (DeepSeek, Llama 4); their weights are dense, not expert_params.
    num_shared_experts: int = 0
    # Weights of a vision tower vLLM loads beside the text model (Llama 4): in total_params, never active.
    vision_params: float = 0.0
    # The Hugging Face class (config.json `architectures[0]`) the counts follow; "" if not recorded.
    architecture: str = ""
    # Dense parameters (not embeddings) that a quantized checkpoint keeps in `dtype` because its
    # quantization_config's ignore list names them (Llama-4-Scout FP8: attention and routers).
    unquantized_params: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {self.id!r}: {name} must be a positive integer, got {value!r}")
        if not 0 < self.active_params <= self.total_params:
            raise ConfigError(
                f"model {self.id!r}: need 0 < active_params <= total_params, got "
                f"{self.active_params:.4g} and {self.total_params:.4g}"
            )
        if not 0 <= self.expert_params < self.total_params:
            raise ConfigError(f"model {self.id!r}: expert_params {self.expert_params:.4g} not in [0, total_params)")
        if (self.num_experts > 0) != (self.expert_params > 0) or self.experts_per_token > self.num_experts:
            raise ConfigError(
                f"model {self.id!r}: num_experts {self.num_experts}, experts_per_token "
                f"{self.experts_per_token} and expert_params {self.expert_params:.4g} disagree"
            )
        if (self.kv_lora_rank > 0) != (self.qk_rope_head_dim > 0):
            raise ConfigError(f"model {self.id!r}: MLA needs both kv_lora_rank and qk_rope_head_dim")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention(self) -> str:
        """'MLA', 'MHA' (one KV head per query head) or 'GQA'."""
        if self.is_mla:
            return "MLA"
        return "MHA" if self.num_kv_heads == self.num_attention_heads else "GQA"

    @property
    def dense_params(self) -> float:
        """Parameters outside routed experts (attention, shared experts, embeddings, norms)."""
        return self.total_params - self.expert_params

    @property
    def embedding_params(self) -> int:
        """Input embedding plus lm_head (one table when tied); quantized checkpoints keep them 16-bit."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def kv_elements_per_token(self) -> int:
        """KV-cache elements one token holds over all layers: 2 x kv_heads x head_dim, or the MLA latent once."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is routed experts (0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def expert_active_params(self) -> float:
        """Routed-expert parameters one token touches: top-k of the experts."""
        return self.expert_params * self.experts_per_token / self.num_experts if self.is_moe else 0.0


def spec_from_config(model_id: str, name: str, hf_repo: str, data: Mapping[str, Any], where: str) -> ModelSpec:
    """The ModelSpec a Hugging Face config.json (parsed: `data`) describes; `where` names it in errors."""
    fields = fields_from_config(data, where)
    weights, experts = weight_formats(data, where, fields["dtype"], fields["num_experts"] > 0)
    kept = unquantized_params(data, where, fields)
    try:
        return ModelSpec(model_id, name, hf_repo, default_weight_dtype=weights, expert_weight_dtype=experts,
                         unquantized_params=kept, **fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _m(spec: ModelSpec) -> tuple[str, ModelSpec]:
    return spec.id, spec


def _hf(model_id: str, name: str, hf_repo: str, architecture: str, **config: Any) -> tuple[str, ModelSpec]:
    """A catalog entry counted from its published config.json's fields, by the code that reads files."""
    data = {"architectures": [architecture], **config}
    return _m(spec_from_config(model_id, name, hf_repo, data, f"catalog entry {model_id}"))


# Parameter counts are the exact sums over each architecture's tensors (they match the safetensors
# totals on the HF hub); tests/unit/test_specs.py recomputes them from the dimensions.
MODELS: dict[str, ModelSpec] = dict([
    # meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096, 32 heads / 8 KV heads, FFN 14336,
    # vocab 128256, max_position_embeddings 131072, untied embeddings.
    _m(ModelSpec("llama-3.1-8b", "Llama 3.1 8B", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128,
                 14336, 128256, 8_030_261_248, 8_030_261_248, 131072)),
    # meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192, 64 / 8 heads, FFN 28672.
    _m(ModelSpec("llama-3.1-70b", "Llama 3.1 70B", "meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128,
                 28672, 128256, 70_553_706_496, 70_553_706_496, 131072)),
    # meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, 128 / 8 heads, FFN 53248.
    _m(ModelSpec("llama-3.1-405b", "Llama 3.1 405B", "meta-llama/Llama-3.1-405B", 126, 16384, 128, 8,
                 128, 53248, 128256, 405_853_388_800, 405_853_388_800, 131072)),
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads, no GQA, FFN 11008,
    # vocab 32000, 4096-token context.
    _m(ModelSpec("llama-2-7b", "Llama 2 7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008,
                 32000, 6_738_415_616, 6_738_415_616, 4096)),
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, 64 / 8 heads, FFN 28672.
    _m(ModelSpec("llama-2-70b", "Llama 2 70B", "meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 128, 28672,
                 32000, 68_976_648_192, 68_976_648_192, 4096)),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 / 8 heads, 8 experts of
    # FFN 14336, top-2, 32768-token context. Experts: 32 x 8 x 3 x 4096 x 14336 weights.
    _m(ModelSpec("mixtral-8x7b", "Mixtral 8x7B", "mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 128,
                 14336, 32000, 46_702_792_704, 12_879_925_248, 32768, num_experts=8,
                 experts_per_token=2, moe_intermediate_size=14336, expert_params=45_097_156_608)),
    # Qwen/Qwen2.5-72B-Instruct config.json: 80 layers, hidden 8192, 64 / 8 heads, FFN 29568,
    # vocab 152064, QKV bias; max_position_embeddings 32768 (131072 only with YaRN enabled).
    _m(ModelSpec("qwen2.5-72b", "Qwen2.5 72B", "Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 8, 128,
                 29568, 152064, 72_706_203_648, 72_706_203_648, 32768)),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers (first 3 dense, FFN 18432), hidden 7168,
    # 128 heads (v_head_dim 128), MLA kv_lora_rank 512 + qk_rope_head_dim 64, 256 routed experts of
    # FFN 2048 plus 1 shared, top-8, vocab 129280, 163840-token context, FP8 (128x128 block) checkpoint.
    # 671B total / 37B active as in the DeepSeek-V3 report (arXiv:2412.19437); the 14B MTP module
    # is not loaded for plain decoding and not counted.
    _m(ModelSpec("deepseek-v3", "DeepSeek-V3", "deepseek-ai/DeepSeek-V3", 61, 7168, 128, 128, 128, 18432,
                 129280, 671_026_419_200, 37_552_297_472, 163840, default_weight_dtype="fp8",
                 kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8,
                 moe_intermediate_size=2048, expert_params=653_908_770_816, num_dense_layers=3)),
    # openai/gpt-oss-120b config.json: 36 layers, hidden 2880, 64 heads / 8 KV heads of dim 64,
    # 128 experts of FFN 2880, top-4, vocab 201088, 131072-token context; every other layer uses a
    # 128-token sliding window, counted here as full attention (an upper bound on KV per token).
    # Model card: 116.8B total, 5.1B active (the card leaves the input embedding out of "active"),
    # "MXFP4 quantization of the MoE weights"; attention, router and embeddings stay BF16.
    _m(ModelSpec("gpt-oss-120b", "gpt-oss-120b", "openai/gpt-oss-120b", 36, 2880, 64, 8, 64, 2880,
                 201088, 116_829_156_672, 5_132_849_472, 131072, num_experts=128, experts_per_token=4,
                 moe_intermediate_size=2880, expert_params=114_701_598_720, expert_weight_dtype="mxfp4")),

    # --- Counted from each published config.json by replay/model/hf/arch*.py (the code that reads files);
    # tests/unit/test_hf_config.py checks every figure. Numbers quoted are the config's fields. ---
    # codellama/CodeLlama-34b-Instruct-hf: Llama, 48 layers, hidden 8192, 64 / 8 heads, FFN 22016,
    # vocab 32000, 16384-token context (../shared/models/codellama-34b-instruct-hf).
    _hf("codellama-34b", "CodeLlama 34B Instruct", "codellama/CodeLlama-34b-Instruct-hf", "LlamaForCausalLM",
        num_hidden_layers=48, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=22016, vocab_size=32000, max_position_embeddings=16384),
    # 01-ai/Yi-34B: Llama, 60 layers, hidden 7168, 56 / 8 heads, FFN 20480, vocab 64000, 4096 tokens.
    _hf("yi-34b", "Yi 34B", "01-ai/Yi-34B", "LlamaForCausalLM", num_hidden_layers=60, hidden_size=7168,
        num_attention_heads=56, num_key_value_heads=8, intermediate_size=20480, vocab_size=64000,
        max_position_embeddings=4096),
    # meta-llama/Llama-3.3-70B-Instruct: the Llama 3.1 70B architecture (80 layers, hidden 8192, 64 / 8
    # heads, FFN 28672, vocab 128256, 131072 tokens).
    _hf("llama-3.3-70b", "Llama 3.3 70B Instruct", "meta-llama/Llama-3.3-70B-Instruct", "LlamaForCausalLM",
        num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072),
    # mistralai/Mistral-Nemo-Instruct-2407: 40 layers, hidden 5120, 32 / 8 heads of head_dim 128 (not
    # 5120 / 32), FFN 14336, vocab 131072, max_position_embeddings 131072.
    _hf("mistral-nemo-12b", "Mistral NeMo 12B Instruct", "mistralai/Mistral-Nemo-Instruct-2407",
        "MistralForCausalLM", num_hidden_layers=40, hidden_size=5120, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=131072,
        max_position_embeddings=131072),
    # Qwen/Qwen2.5-7B-Instruct: 28 layers, hidden 3584, 28 / 4 heads, QKV bias, FFN 18944, vocab 152064,
    # 32768 tokens.
    _hf("qwen2.5-7b", "Qwen2.5 7B Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen2ForCausalLM",
        num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768),
    # Qwen/Qwen3-14B: 40 layers, hidden 5120, 40 / 8 heads of 128, q/k norms, FFN 17408, vocab 151936,
    # 40960 tokens.
    _hf("qwen3-14b", "Qwen3 14B", "Qwen/Qwen3-14B", "Qwen3ForCausalLM", num_hidden_layers=40, hidden_size=5120,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=17408,
        vocab_size=151936, max_position_embeddings=40960),
    # Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 / 4 heads of 128, 128 experts of FFN 768, top-8.
    _hf("qwen3-30b-a3b", "Qwen3 30B-A3B", "Qwen/Qwen3-30B-A3B", "Qwen3MoeForCausalLM", num_hidden_layers=48,
        hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, vocab_size=151936,
        max_position_embeddings=40960),
    # Qwen/Qwen3-235B-A22B: 94 layers, hidden 4096, 64 / 4 heads of 128, 128 experts of FFN 1536, top-8.
    _hf("qwen3-235b-a22b", "Qwen3 235B-A22B", "Qwen/Qwen3-235B-A22B", "Qwen3MoeForCausalLM",
        num_hidden_layers=94, hidden_size=4096, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        intermediate_size=12288, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536,
        vocab_size=151936, max_position_embeddings=40960),
    # mistral-community/Mixtral-8x22B-v0.1 config.json: 56 layers, hidden 6144, 48 / 8 heads, 8 experts
    # of FFN 16384, top-2, vocab 32000, 65536 tokens.
    _hf("mixtral-8x22b", "Mixtral 8x22B", "mistralai/Mixtral-8x22B-v0.1", "MixtralForCausalLM",
        num_hidden_layers=56, hidden_size=6144, num_attention_heads=48, num_key_value_heads=8,
        intermediate_size=16384, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
        max_position_embeddings=65536),
    # RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic: text model 48 layers, hidden 5120, 40 / 8 heads
    # of 128, every layer MoE (16 experts of FFN 8192, top-1, plus a shared expert), vocab 202048,
    # 10485760 tokens; the vision tower (34 layers, hidden 1408, FFN 5632) is loaded too. FP8 weights
    # and dynamic per-token FP8 activations (compressed-tensors float-quantized), except what its
    # ignore list names one by one: every text layer's q/k/v/o projections and router stay BF16
    # (and the vision tower, projector and lm_head), written here as two patterns.
    _hf("llama-4-scout-fp8", "Llama 4 Scout 17B-16E Instruct FP8",
        "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "Llama4ForConditionalGeneration",
        text_config=dict(num_hidden_layers=48, hidden_size=5120, num_attention_heads=40, num_key_value_heads=8,
                         head_dim=128, intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
                         num_experts_per_tok=1, interleave_moe_layer_step=1, vocab_size=202048,
                         max_position_embeddings=10485760),
        vision_config=dict(num_hidden_layers=34, hidden_size=1408, intermediate_size=5632, image_size=336,
                           patch_size=14, num_channels=3, projector_input_dim=4096, projector_output_dim=4096,
                           vision_output_dim=4096),
        quantization_config=dict(quant_method="compressed-tensors", config_groups={"group_0": dict(
            targets=["Linear"], weights=dict(num_bits=8, type="float", strategy="channel"),
            input_activations=dict(num_bits=8, type="float", strategy="token", dynamic=True))},
            ignore=[r"re:language_model\.model\.layers\.\d+\.self_attn\.[qkvo]_proj$",
                    r"re:language_model\.model\.layers\.\d+\.feed_forward\.router$", r"re:vision_model\..*",
                    "multi_modal_projector.linear_1", "language_model.lm_head"])),
    # deepseek-ai/DeepSeek-V2-Lite: 27 layers (the first dense, FFN 10944), hidden 2048, 16 heads, MLA
    # without a q latent (kv_lora_rank 512, rope 64, nope 128, v 128), 64 routed experts of FFN 1408
    # plus 2 shared, top-6, vocab 102400, 163840 tokens (YaRN x40 over 4096).
    _hf("deepseek-v2-lite", "DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite", "DeepseekV2ForCausalLM",
        num_hidden_layers=27, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=10944, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, moe_intermediate_size=1408,
        first_k_dense_replace=1, vocab_size=102400, max_position_embeddings=163840),
    # deepseek-ai/DeepSeek-R1: the DeepSeek-V3 architecture and FP8 checkpoint (see deepseek-v3 above).
    _hf("deepseek-r1", "DeepSeek-R1", "deepseek-ai/DeepSeek-R1", "DeepseekV3ForCausalLM", num_hidden_layers=61,
        hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048,
        first_k_dense_replace=3, topk_method="noaux_tc", vocab_size=129280, max_position_embeddings=163840,
        quantization_config=dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[128, 128])),
    # ../shared/models/glm-5.2-fp8 (GlmMoeDsaForCausalLM): 78 layers (first 3 dense, FFN 12288), hidden
    # 6144, 64 heads, MLA (q_lora_rank 2048, kv_lora_rank 512, rope 64, nope 192, v 256) with a DSA
    # indexer (32 heads of 128), 256 routed experts of FFN 2048 plus 1 shared, top-8, vocab 154880,
    # 1048576 tokens, FP8 (128x128 blocks). The indexer's key cache is not in the KV bytes per token.
    _hf("glm-5.2-fp8", "GLM-5.2 FP8", "zai-org/GLM-5.2-FP8", "GlmMoeDsaForCausalLM", num_hidden_layers=78,
        hidden_size=6144, num_attention_heads=64, num_key_value_heads=64, intermediate_size=12288,
        q_lora_rank=2048, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=192, v_head_dim=256,
        index_n_heads=32, index_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
        moe_intermediate_size=2048, first_k_dense_replace=3, topk_method="noaux_tc", vocab_size=154880,
        max_position_embeddings=1048576,
        quantization_config=dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[128, 128])),
    # openai/gpt-oss-20b: the gpt-oss-120b layout with 24 layers and 32 experts (top-4), MXFP4 experts.
    _hf("gpt-oss-20b", "gpt-oss-20b", "openai/gpt-oss-20b", "GptOssForCausalLM", num_hidden_layers=24,
        hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64, intermediate_size=2880,
        num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, max_position_embeddings=131072,
        quantization_config=dict(quant_method="mxfp4")),
])
