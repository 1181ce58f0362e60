"""Hugging Face config.json files: parameter counts against each family's published counts, and the errors."""

import json

import pytest

from mcdla.errors import WorkloadError
from mcdla.workload.hf_config import SUPPORTED_MODEL_TYPES, load_hf_config, spec_from_hf_config
from mcdla.workload.model_file import resolve_model
from mcdla.workload.transformer import layer_fwd_flops, preset

# The shape fields of the published config.json files (Hugging Face hub, the model's own repository); the
# fields that do not change the shape (token ids, RoPE theta, dtype) are left out here and ignored by the loader.
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
             "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192,
             "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
              "tie_word_embeddings": False, "vocab_size": 32000}
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960, "model_type": "qwen3",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rope_scaling": None,
            "tie_word_embeddings": False, "vocab_size": 151936}
QWEN3_32B = {**QWEN3_8B, "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
             "num_hidden_layers": 64}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1,
                 "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
                 "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe",
                 "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128,
                 "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
                 "tie_word_embeddings": False, "vocab_size": 151936}
DEEPSEEK_V2 = {"architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 1,
               "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 12288, "kv_lora_rank": 512,
               "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1536,
               "moe_layer_freq": 1, "n_routed_experts": 160, "n_shared_experts": 2, "num_attention_heads": 128,
               "num_experts_per_tok": 6, "num_hidden_layers": 60, "num_key_value_heads": 128, "q_lora_rank": 1536,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "v_head_dim": 128,
               "vocab_size": 102400,
               "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"}}


LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
             "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "rope_scaling": None,
             "tie_word_embeddings": False, "vocab_size": 32000}
DEEPSEEK_V2_LITE = {**DEEPSEEK_V2, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                    "n_routed_experts": 64, "num_attention_heads": 16, "num_hidden_layers": 27,
                    "num_key_value_heads": 16, "q_lora_rank": None}


def _example(name):
    return resolve_model(f"examples/{name}.json")


def test_llama3_8b_has_its_published_count():
    """Meta-Llama-3-8B: 8,030,261,248 parameters (the count its safetensors index gives), and it is the
    llama3-8b preset's shape."""
    spec = spec_from_hf_config(LLAMA3_8B, name="llama3-8b")
    assert spec.params() == 8_030_261_248
    assert spec.params() == preset("llama3-8b").params()


def test_llama2_7b_has_its_published_count():
    """Llama-2-7b (multi-head attention, no GQA): 6,738,415,616 parameters."""
    assert spec_from_hf_config(LLAMA2_7B, name="l").params() == 6_738_415_616


def test_mistral_7b_has_its_published_count():
    """Mistral-7B-v0.1: 7,241,732,096 parameters."""
    assert spec_from_hf_config(MISTRAL_7B, name="m").params() == 7_241_732_096


def test_mixtral_8x7b_total_and_active():
    """Mixtral-8x7B (the shipped example): 46,702,792,704 parameters, ~12.9B active with 2 of 8 experts
    (Mixtral paper, Jiang et al. 2024: "13B active"; 12.9B in Mistral's announcement)."""
    spec = _example("hf-mixtral-8x7b")
    assert spec.params() == 46_702_792_704
    assert spec.active_params() == pytest.approx(12.9e9, abs=0.05e9)


def test_qwen2_7b_counts_its_qkv_biases():
    """Qwen2-7B (the shipped example): 7,615,616,512 parameters, Q/K/V biases included."""
    assert _example("hf-qwen2-7b").params() == 7_615_616_512


@pytest.mark.parametrize("config, total_b, non_embedding_b", [(QWEN3_8B, 8.2, 6.95), (QWEN3_32B, 32.8, 31.2)])
def test_qwen3_dense_counts(config, total_b, non_embedding_b):
    """Qwen3-8B and Qwen3-32B (head size 128 != hidden / heads for 32B, QK norms): the total and
    non-embedding counts of their model cards, to the cards' rounding."""
    spec = spec_from_hf_config(config, name="q")
    non_embedding = spec.params() - spec.embedding_params()
    assert spec.params() == pytest.approx(total_b * 1e9, abs=0.05e9)
    assert non_embedding == pytest.approx(non_embedding_b * 1e9, abs=0.005e9 if non_embedding_b == 6.95 else 0.05e9)


def test_qwen3_moe_counts():
    """Qwen3-30B-A3B: 30.5B total and 29.9B non-embedding (its model card, to its rounding), 3.3B activated
    within 2% (the card's figure is cut, not rounded: 3.35B counted here)."""
    spec = spec_from_hf_config(QWEN3_30B_A3B, name="q")
    assert spec.params() == pytest.approx(30.5e9, abs=0.05e9)
    assert spec.active_params() == pytest.approx(3.3e9, rel=0.02)
    assert spec.params() - spec.embedding_params() == pytest.approx(29.9e9, abs=0.05e9)


def test_deepseek_v3_total_and_active():
    """DeepSeek-V3 (the shipped example): 671B total and 37B activated (DeepSeek-V3 report, abstract). MLA's
    parameters are counted exactly; left out are V3's router score biases (256 a layer) and the MTP module,
    so the total is within 0.1%; the active count within 2% of the report's rounded 37B."""
    spec = _example("hf-deepseek-v3")
    assert spec.params() == pytest.approx(671e9, rel=1e-3)
    assert spec.active_params() == pytest.approx(37e9, rel=0.02)


def test_deepseek_v2_total_and_active():
    """DeepSeek-V2: 236B total, 21B activated (DeepSeek-V2 paper, abstract), within 1% and 2%."""
    spec = spec_from_hf_config(DEEPSEEK_V2, name="d")
    assert spec.params() == pytest.approx(236e9, rel=0.01)
    assert spec.active_params() == pytest.approx(21e9, rel=0.02)


def test_deepseek_v2_lite_queries_without_a_latent():
    """DeepSeek-V2-Lite (``q_lora_rank: null``, a direct Q projection): 15.7B total (its model card)."""
    spec = spec_from_hf_config(DEEPSEEK_V2_LITE, name="d")
    assert spec.mla is not None and spec.mla.q_lora_rank is None
    assert spec.params() == pytest.approx(15.7e9, abs=0.05e9)


def test_deepseek_v3_layer_flops_from_its_matrices():
    """One DeepSeek-V3 token's forward FLOPs, mean layer: twice the MLA matrices (q down 7168x1536, q up
    1536x128x192, kv down 7168x576, kv up 512x128x256, out 128x128x7168), the attention core over 128 heads
    of 192 (QK) and 128 (V), and 3 dense layers of 18432 plus 58 of 9 experts of 2048 with a 256-way router."""
    spec = _example("hf-deepseek-v3")
    s = spec.seq_len
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    ffn = (3 * 3 * 7168 * 18432 + 58 * (9 * 3 * 7168 * 2048 + 7168 * 256)) / 61
    flops = layer_fwd_flops(spec, 1)
    assert flops["gemm"] == pytest.approx(2 * s * (mla + ffn), rel=1e-12)
    assert flops["attention"] == pytest.approx(2 * s * s * 128 * (192 + 128), rel=1e-12)


def test_seq_len_is_the_pretraining_context_unless_given():
    """DeepSeek-V3 extends RoPE (YaRN) from a 4096 context: that is its default sequence; seq_len overrides."""
    assert _example("hf-deepseek-v3").seq_len == 4096
    assert resolve_model("examples/hf-deepseek-v3.json", seq_len=2048).seq_len == 2048
    assert spec_from_hf_config(MISTRAL_7B, name="m").seq_len == 32768


def test_unknown_model_type_lists_the_supported():
    """A GPT-2 config is refused in one line naming model_type and every supported family."""
    with pytest.raises(WorkloadError) as err:
        spec_from_hf_config({**LLAMA3_8B, "model_type": "gpt2"}, name="g")
    message = str(err.value)
    assert "model_type: got 'gpt2'" in message and all(t in message for t in SUPPORTED_MODEL_TYPES)
    assert "\n" not in message


@pytest.mark.parametrize("change, needle", [
    ({"hidden_act": "gelu"}, "hidden_act: got 'gelu'"),
    ({"attention_bias": True}, "attention_bias: got True"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: got '32'"),
    ({"model_type": "mixtral"}, "num_local_experts: missing"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "mlp_only_layers": [0]}, "mlp_only_layers: got a list"),
])
def test_bad_config_is_one_line_naming_the_field(change, needle):
    """A field the mapping cannot express, a wrong type or a missing MoE field: one line naming it."""
    with pytest.raises(WorkloadError) as err:
        spec_from_hf_config({**LLAMA3_8B, **change}, name="x")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_config_json_is_named_after_its_folder(tmp_path):
    """``Meta-Llama-3-8B/config.json`` loads as a model named Meta-Llama-3-8B."""
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert load_hf_config(folder / "config.json").name == "Meta-Llama-3-8B"
    assert resolve_model(str(folder / "config.json")).params() == 8_030_261_248
