"""Megatron-Core's selective recompute modules (``recompute_modules``): the FLOPs, kernel bytes and stored bytes
each re-runs or drops, against hand counts of a small MLA + MoE model and of the DeepSeek-V3 preset's shapes."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import ConfigError
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.workload.execution import Execution, check_execution, execution_from_dict, execution_to_dict
from mcdla.workload.transformer import (MlaAttention, TransformerSpec, activation_bytes_per_layer,
                                        hardware_flops_per_iteration, layer_fwd_flops, preset, preset_names)

PEAK, EFF, HBM = 300e12, 0.5, 1e12
# 4 layers, the first dense (FFN 512), the others 8 experts top-2 of FFN 128 with one shared expert; MLA of
# q latent 96, kv latent 64, 4 heads of nope 32 + rope 16 (values 32)
SPEC = TransformerSpec(name="t", layers=4, hidden=256, heads=4, ffn_hidden=128, mlp="swiglu", experts=8, top_k=2,
                       shared_experts=1, dense_layers=1, dense_ffn_hidden=512, dropout=False, bias=False,
                       position="rope", tied_embeddings=False, vocab=1, seq_len=128,
                       mla=MlaAttention(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                                        q_lora_rank=96))
H, S, L, E = 256, 128, 4, 2
UP_PER_TOKEN = 96 * 4 * (32 + 16) + 64 * 4 * (32 + 32)  # q up to 4 x (nope + rope), kv up to 4 x (nope + v)
QKV_PER_TOKEN = 4 * 48 + 4 * 48 + 4 * 32  # the expanded Q, K, V the attention kernel keeps
ROUTED_PER_TOKEN = 3 / 4 * 2 * 128  # the mean layer's routed width: 3 of 4 layers, top-2 of 128
NORMS = 1 + 3 / 4  # the input norm (MLA: its own module) and the pre-MLP norm of the 3 MoE layers
ONE = dict(gpus=1, micro_batch=1, global_batch=2)


def _cluster(make, hbm: float = math.inf):
    return make(nodes=1, gpus_per_node=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, hbm_bytes=80e9,
                hbm_bytes_per_s=hbm)


def _selective(*modules: str, **kw: object) -> Execution:
    return Execution(**ONE, recompute="selective", recompute_modules=modules, **kw)  # type: ignore[arg-type]


def test_mla_up_proj_reruns_the_up_projections_by_hand(llm_cluster):
    """Two samples, four layers: the up projections' forward once more, at the GEMM rate (infinite HBM), and Q, K,
    V (bf16) not stored; the attention core is not recomputed."""
    plain = llm_step(SPEC, Execution(**ONE), _cluster(llm_cluster))
    step = llm_step(SPEC, _selective("mla_up_proj"), _cluster(llm_cluster))
    assert step.hardware_flops - plain.hardware_flops == pytest.approx(L * 2 * 2 * S * UP_PER_TOKEN, rel=1e-12)
    assert step.recompute_s == pytest.approx(2 * L * 2 * S * UP_PER_TOKEN / (PEAK * EFF), rel=1e-9)
    assert plain.activation_bytes - step.activation_bytes == pytest.approx(L * E * S * QKV_PER_TOKEN, rel=1e-12)


def test_memory_bound_modules_rerun_their_kernels_by_hand(llm_cluster):
    """``moe_act`` re-runs the routed SwiGLU (reads 2 f, writes f) and drops its output, the fc2 input;
    ``layernorm`` re-runs the separate norms (read and write h) and drops their outputs; both at the HBM rate."""
    cluster = _cluster(llm_cluster, HBM)
    rate = HBM * cluster.device.memory_efficiency
    plain = llm_step(SPEC, Execution(**ONE), cluster)
    for module, moved, dropped in (("moe_act", 3 * E * ROUTED_PER_TOKEN, E * ROUTED_PER_TOKEN),
                                   ("layernorm", NORMS * 2 * E * H, NORMS * E * H)):
        step = llm_step(SPEC, _selective(module), cluster)
        assert step.recompute_s == pytest.approx(2 * L * S * moved / rate, rel=1e-9), module
        assert step.hardware_flops == plain.hardware_flops, module
        assert plain.activation_bytes - step.activation_bytes == pytest.approx(L * S * dropped, rel=1e-12), module


def test_modules_add_up(llm_cluster):
    """Modules together cost the sum of each one's recompute and drop the sum of their stored bytes."""
    cluster = _cluster(llm_cluster, HBM)
    plain = llm_step(SPEC, Execution(**ONE), cluster)
    alone = [llm_step(SPEC, _selective(m), cluster) for m in ("core_attn", "mla_up_proj", "moe_act", "layernorm")]
    both = llm_step(SPEC, _selective("core_attn", "mla_up_proj", "moe_act", "layernorm"), cluster)
    assert both.recompute_s == pytest.approx(sum(s.recompute_s for s in alone), rel=1e-12)
    assert plain.activation_bytes - both.activation_bytes == pytest.approx(
        sum(plain.activation_bytes - s.activation_bytes for s in alone), rel=1e-12)


def test_deepseek_v3_up_projection_flops_by_hand():
    """DeepSeek-V3: q latent 1536 to 128 heads x (128 + 64), kv latent 512 to 128 x (128 + 128), per token and
    layer; one sample of 4096 tokens over 61 layers."""
    spec = preset("deepseek-v3-671b")
    extra = (hardware_flops_per_iteration(spec, 1, "selective", attention="flash", recompute_modules=("mla_up_proj",))
             - hardware_flops_per_iteration(spec, 1, "none", attention="flash"))
    assert extra == pytest.approx(61 * 2 * 4096 * (1536 * 128 * 192 + 512 * 128 * 256), rel=1e-12)


def test_without_core_attn_the_scores_stay_stored():
    """Materialised attention: ``mla_up_proj`` alone keeps the softmax's ``s x s`` terms (no ``core_attn``),
    storing what ``none`` does but Q, K and V."""
    kw = dict(attention="materialized", tp=1)
    none = activation_bytes_per_layer(SPEC, 1, recompute="none", **kw)
    up = activation_bytes_per_layer(SPEC, 1, recompute="selective", recompute_modules=("mla_up_proj",), **kw)
    assert none - up == pytest.approx(E * S * QKV_PER_TOKEN, rel=1e-12)
    assert not _selective("mla_up_proj").recomputes_attention
    assert _selective("mla_up_proj", "core_attn").recomputes_attention


@pytest.mark.parametrize("name", preset_names())
def test_core_attn_is_the_attention_core_recompute(name, llm_cluster):
    """The default modules recompute the attention core's forward and nothing else, for every preset."""
    spec = preset(name)
    costs = stage_costs(spec, Execution(gpus=1, recompute="selective"), _cluster(llm_cluster, HBM))
    assert costs.layer_recompute_s == costs.layer_attention_fwd_s
    for attention in ("flash", "materialized"):
        extra = (hardware_flops_per_iteration(spec, 1, "selective", attention=attention)
                 - hardware_flops_per_iteration(spec, 1, "none", attention=attention))
        assert extra == pytest.approx(spec.layers * layer_fwd_flops(spec, 1, attention=attention)["attention"],
                                      rel=1e-12)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(recompute="selective", recompute_modules=("mlp",)),
     "execution.recompute_modules: got 'mlp'; must be among core_attn, mla_up_proj, moe_act, layernorm "
     "(Megatron-Core's mlp, moe and shared_experts are not modelled)"),
    (dict(recompute="full", recompute_modules=("moe_act",)),
     "execution.recompute_modules: got moe_act with recompute=full; it names what selective recompute re-runs, "
     "needs recompute=selective"),
    (dict(recompute="selective", recompute_modules=()),
     "execution.recompute_modules: got a tuple of 0 items; must be a non-empty list of distinct names among core_attn, "
     "mla_up_proj, moe_act, layernorm"),
])
def test_bad_modules_are_one_line_errors(fields, message):
    with pytest.raises(ConfigError) as err:
        Execution(gpus=1, **fields)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_modules_the_model_lacks_are_refused():
    llama = preset("llama3-8b")
    with pytest.raises(ConfigError, match=r"^execution.recompute_modules: got mla_up_proj for llama3-8b; it needs "
                                          r"multi-head latent attention"):
        check_execution(_selective("mla_up_proj"), llama)
    with pytest.raises(ConfigError, match=r"^execution.recompute_modules: got moe_act for llama3-8b; it needs experts"):
        check_execution(_selective("moe_act"), llama)


def test_file_round_trip_and_bad_name():
    e = execution_from_dict({"gpus": 1, "recompute": "selective", "recompute_modules": ["mla_up_proj", "moe_act"]})
    assert e.recompute_modules == ("mla_up_proj", "moe_act")
    assert execution_from_dict(execution_to_dict(e)) == e
    assert Execution(**execution_to_dict(e)) == e  # a list, as JSON gives it, is kept as a tuple
    with pytest.raises(ConfigError) as err:
        execution_from_dict({"gpus": 1, "recompute": "selective", "recompute_modules": ["attn"]})
    assert "recompute_modules" in str(err.value) and "'attn'" in str(err.value) and "\n" not in str(err.value)
