"""Transformer specs: parameters, FLOPs and activation bytes against the closed forms of the papers."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import WorkloadError
from mcdla.workload.transformer import (TransformerSpec, activation_bytes_per_layer, hardware_flops_per_iteration,
                                        layer_fwd_flops, layer_gemms, logits_fwd_flops, model_flops_per_iteration,
                                        preset, preset_names)

GPT_PRESETS = [n for n in preset_names() if preset(n).mlp == "gelu"]  # the GPT family (GELU, MHA, dense)

# Narayanan et al. SC21, Table 1, "Number of parameters (billion)".
SC21_PARAMS_B = {"megatron-1.7b": 1.7, "megatron-3.6b": 3.6, "megatron-7.5b": 7.5, "megatron-18.4b": 18.4,
                 "megatron-39.1b": 39.1, "megatron-76.1b": 76.1, "megatron-145.6b": 145.6,
                 "megatron-310.1b": 310.1, "megatron-530b": 529.6, "megatron-1t": 1008.0}
# Korthikanti et al. 2022, Table 5: model FLOPs utilisation with selective recompute + sequence parallelism,
# and the measured iteration time it comes from (A100, 312 TFLOP/s peak).
KORTHIKANTI_MFU = {"megatron-22b": (8, 4, 1.10, 0.415), "gpt3-175b": (64, 64, 13.75, 0.514),
                   "megatron-530b": (280, 280, 37.83, 0.560), "megatron-1t": (512, 512, 71.49, 0.563)}


def _gpt(a=16, h=1024, layers=4, s=512, v=1000):
    return TransformerSpec(name="t", layers=layers, hidden=h, heads=a, vocab=v, seq_len=s)


@pytest.mark.parametrize("name", sorted(SC21_PARAMS_B))
def test_parameter_counts_match_sc21_table1(name):
    """The Megatron presets have the parameter counts SC21 Table 1 lists (to its rounding)."""
    assert preset(name).params() / 1e9 == pytest.approx(SC21_PARAMS_B[name], abs=0.051)


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_gpt_params_match_sc21_closed_form(name):
    """GPT parameters equal 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) (SC21, sec. 5.1) plus the final
    LayerNorm's 2h, which that formula leaves out."""
    m = preset(name)
    l, h, v, s = m.layers, m.hidden, m.vocab, m.seq_len
    assert m.params() - 2 * h == pytest.approx(12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h)), rel=1e-12)


def test_llama3_8b_params_by_hand():
    """Llama-3 8B: untied 128256 x 4096 embeddings, GQA attention, SwiGLU 14336, RMSNorm gains = 8.03e9."""
    h, kv, f, v, l = 4096, 1024, 14336, 128256, 32
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h
    assert preset("llama3-8b").params() == l * per_layer + 2 * v * h + h == 8_030_261_248


@pytest.mark.parametrize("name", ["llama3-70b", "llama3-405b"])
def test_llama3_params_near_published(name):
    """Llama-3 70B and 405B presets land within 1% of their names' sizes (Dubey et al. 2024)."""
    assert preset(name).params() / 1e9 == pytest.approx(float(name.split("-")[1][:-1]), rel=0.01)


@given(a=st.sampled_from([8, 16, 32]), hd=st.sampled_from([32, 64, 128]), s=st.integers(1, 4096), b=st.integers(1, 8))
def test_gpt_layer_forward_flops_closed_form(a, hd, s, b):
    """Forward FLOPs of a GPT layer are 24 b s h^2 + 4 b s^2 h (Korthikanti et al. 2022, sec. 6)."""
    h = a * hd
    f = layer_fwd_flops(_gpt(a=a, h=h, s=s), b)
    assert f["gemm"] + f["attention"] == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-12)


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_model_flops_closed_form(name):
    """Model FLOPs per iteration are 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) (no recompute)."""
    m, B = preset(name), 512
    l, h, s, v = m.layers, m.hidden, m.seq_len, m.vocab
    expected = 72 * B * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_iteration(m, B) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_full_recompute_flops_sc21_eq3(name):
    """With full recomputation the FLOPs are 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (SC21, eq. 3)."""
    m, B = preset(name), 1536
    l, h, s, v = m.layers, m.hidden, m.seq_len, m.vocab
    expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert hardware_flops_per_iteration(m, B, "full") == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_adds_only_attention_core():
    """Selective recomputation adds l x 4 B s^2 h: Q K^T and attention x V once more."""
    m, B = preset("gpt3-175b"), 64
    extra = hardware_flops_per_iteration(m, B, "selective") - model_flops_per_iteration(m, B)
    assert extra == pytest.approx(m.layers * 4 * B * m.seq_len**2 * m.hidden, rel=1e-12)


@pytest.mark.parametrize("name", sorted(KORTHIKANTI_MFU))
def test_model_flops_reproduce_korthikanti_mfu(name):
    """Model FLOPs / (GPUs x 312 TFLOP/s x measured time) reproduce Korthikanti Table 5's MFU (+-0.5 points)."""
    gpus, batch, seconds, mfu = KORTHIKANTI_MFU[name]
    assert model_flops_per_iteration(preset(name), batch) / (gpus * 312e12 * seconds) == pytest.approx(mfu, abs=0.005)


def test_logits_flops():
    """The vocabulary projection costs 2 b s h V forward."""
    m = preset("gpt3-175b")
    assert logits_fwd_flops(m, 3) == 2 * 3 * m.seq_len * m.hidden * m.vocab


shapes = dict(a=st.sampled_from([8, 16, 64]), hd=st.sampled_from([64, 128]), s=st.sampled_from([256, 2048]),
              b=st.integers(1, 4), t=st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=40)
@given(**shapes)
def test_activation_bytes_korthikanti_table2(a, hd, s, b, t):
    """Activation bytes per layer match Korthikanti Table 2 for every parallel/recompute variant."""
    h = a * hd
    m = _gpt(a=a, h=h, s=s)
    sbh = s * b * h
    if a % t:
        return
    assert activation_bytes_per_layer(m, b) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(m, b, tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert activation_bytes_per_layer(m, b, tp=t, sp=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(m, b, tp=t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert activation_bytes_per_layer(m, b, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert activation_bytes_per_layer(m, b, tp=t, recompute="full") == pytest.approx(2 * sbh)


def test_gqa_shrinks_qkv_flops():
    """With kv-heads g < a the QKV projection costs 2 b s h (h + 2 g h/a)."""
    dense = _gpt(a=32, h=4096)
    gqa = TransformerSpec(name="g", layers=4, hidden=4096, heads=32, kv_heads=8, vocab=1000, seq_len=512)
    b, s, h = 2, 512, 4096
    saved = layer_fwd_flops(dense, b)["gemm"] - layer_fwd_flops(gqa, b)["gemm"]
    assert saved == pytest.approx(2 * b * s * h * (2 * h - 2 * 8 * 128))


def test_moe_top2_doubles_ffn_flops_and_keeps_active_params():
    """Top-2 of 8 experts: FFN FLOPs twice a dense FFN (plus the router); 6 idle experts per layer."""
    dense = _gpt(h=1024)
    moe = TransformerSpec(name="m", layers=4, hidden=1024, heads=16, vocab=1000, seq_len=512, experts=8, top_k=2)
    b, s, h = 1, 512, 1024
    ffn = 16 * b * s * h * h
    assert layer_fwd_flops(moe, b)["gemm"] - layer_fwd_flops(dense, b)["gemm"] == pytest.approx(ffn + 2 * b * s * h * 8)
    assert moe.params() - moe.active_params() == 4 * 6 * 2 * h * 4 * h


@pytest.mark.parametrize("kw, field", [
    (dict(heads=24), "heads"), (dict(kv_heads=5), "kv_heads"), (dict(layers=0), "layers"),
    (dict(top_k=3, experts=2), "top_k"), (dict(mlp="relu"), "mlp")])
def test_invalid_spec_one_line_error(kw, field):
    """A bad shape raises one line naming the field."""
    base = dict(name="x", layers=2, hidden=1024, heads=16, vocab=100, seq_len=64)
    with pytest.raises(WorkloadError, match=rf"\.{field}: got ") as info:
        TransformerSpec(**{**base, **kw})
    assert "\n" not in str(info.value)


def test_unknown_preset_lists_names():
    """An unknown preset name lists the presets."""
    with pytest.raises(WorkloadError, match="llama3-8b"):
        preset("gpt-5")


def _gemms_by_hand(name):
    """The mean layer's linear layers of a preset, ``{name: (multiply-adds per token, share of the layers)}``, by
    hand from the published shapes (the presets' sources): GPT-3 MHA + GELU 4h; Llama-3 70B GQA + SwiGLU;
    Mixtral and Qwen3 MoE (top-k routed SwiGLU experts and a gating GEMM of h x experts in every layer; Qwen3's
    32 heads of 128 = 4096 != hidden); DeepSeek-V3 MLA (q down/up through q_lora_rank, a joint kv down projection
    with the shared rope key, kv up to every head's nope key and value) with 3 dense leading layers of 18432 and
    58 MoE layers of 8 routed + 1 shared expert of 2048."""
    if name == "gpt3-175b":
        h = 12288
        return {"qkv": (3 * h * h, 1), "proj": (h * h, 1), "fc1": (4 * h * h, 1), "fc2": (4 * h * h, 1)}
    if name == "llama3-70b":
        h, kv, f = 8192, 8 * 128, 28672
        return {"qkv": (h * (h + 2 * kv), 1), "proj": (h * h, 1), "fc1": (2 * h * f, 1), "fc2": (h * f, 1)}
    if name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        h, q, kv, f, experts, k = ((4096, 4096, 8 * 128, 14336, 8, 2) if name == "mixtral-8x7b"
                                   else (2048, 32 * 128, 4 * 128, 768, 128, 8))
        return {"qkv": (h * (q + 2 * kv), 1), "proj": (q * h, 1), "router": (h * experts, 1),
                "expert_fc1": (k * 2 * h * f, 1), "expert_fc2": (k * h * f, 1)}
    assert name == "deepseek-v3-671b"
    h, a, q_rank, kv_rank, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    down = h * q_rank + h * (kv_rank + rope)  # the query and key/value latents (and the shared rope key)
    up = q_rank * a * (nope + rope) + kv_rank * a * (nope + v)  # the heads from the latents
    moe, dense_f, f = 58 / 61, 18432, 2048
    fc = (3 * dense_f + 58 * f) / 61  # the dense layers' FFN and the MoE layers' shared expert
    return {"mla_down": (down, 1), "mla_up": (up, 1), "proj": (a * v * h, 1), "router": (moe * h * 256, moe),
            "fc1": (2 * h * fc, 1), "fc2": (h * fc, 1), "expert_fc1": (moe * 8 * 2 * h * f, moe), "expert_fc2": (moe * 8 * h * f, moe)}


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-671b"])
def test_layer_gemms_and_gemm_flops_by_hand(name):
    """NOTE [layer GEMMs]: the linear layers, their weights per token and shares are the published shapes' (by
    hand), the layer's forward GEMM FLOPs 2 b s times their sum, and the userbuffers run QKV (not MLA's
    projections), the projection and the dense or shared FFN, not the router nor the routed experts."""
    spec, b = preset(name), 3
    expected = _gemms_by_hand(name)
    gemms = layer_gemms(spec)
    assert [g.name for g in gemms] == list(expected)
    for g in gemms:
        assert (g.weights, g.share) == pytest.approx(expected[g.name], rel=1e-12), g.name
    per_token = sum(w for w, _ in expected.values())
    assert layer_fwd_flops(spec, b)["gemm"] == pytest.approx(2 * b * spec.seq_len * per_token, rel=1e-12)
    assert {g.name for g in gemms if g.ring} == {"qkv", "proj", "fc1", "fc2"} & set(expected)
