"""torchtitan's op-level selective recompute (``recompute: selective-op``) and eager PyTorch's unfused kernels
(``fused_kernels: false``): saved bytes, recompute FLOPs and kernel bytes against hand counts of a small Llama
layer (the products and kernels of torchtitan's code, listed here one by one)."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import ConfigError
from mcdla.sim.llm import llm_step
from mcdla.workload.execution import Execution, check_execution, execution_from_dict
from mcdla.workload.transformer import TransformerSpec, hardware_flops_per_iteration, layer_fwd_flops, preset

PEAK, EFF, HBM = 300e12, 0.5, 1e12
# a Llama layer: GQA 8 heads over 2 kv-heads (head 64), SwiGLU FFN 1536, RMSNorm, RoPE, no biases, no dropout
SPEC = TransformerSpec(name="t", layers=4, hidden=512, heads=8, kv_heads=2, ffn_hidden=1536, mlp="swiglu",
                       dropout=False, bias=False, position="rope", tied_embeddings=False, vocab=1, seq_len=256)
H, KV, F, A, S, L = 512, 128, 1536, 8, 256, 4
E = 2  # bf16
# forward order wq, wk, wv, wo, w1, w3, w2: the 2nd, 4th and 6th (wk, wo, w3) are recomputed
RECOMPUTED_FLOPS_PER_TOKEN = 2 * (H * KV + H * H + H * F)
# kept: the layer input, wq, wv, the attention output, w1, w2; and the fp32 logsumexp per head
SAVED_PER_TOKEN = E * (H + H + KV + H + F + H) + 4 * A
# eager kernels per token: 2 RMSNorms (cast 6, pow 8, mean 4, scale 8, cast back 6, gain 4 = 36 B an element),
# 2 residual adds (6), RoPE on Q and K (cast 6, complex product 8, cast back 6 = 20), repeat_kv to 4 query heads
# (K and V read once, written 4x, read 3x more by SDPA: 16 B an element), SiLU (4) and the gate product (6)
EAGER_PER_TOKEN = 2 * 36 * H + 2 * 6 * H + 20 * (H + KV) + 16 * (KV + KV) + 10 * F
FUSED_PER_TOKEN = 2 * 4 * H + 2 * 6 * H + 6 * F  # the fused count: norms 2e, adds 3e, SwiGLU 3e an element
LAST_ADD_PER_TOKEN = 6 * H
ONE = dict(gpus=1, micro_batch=1, global_batch=2)  # 2 micro-batches on one GPU


def _cluster(make, hbm: float = math.inf):
    return make(nodes=1, gpus_per_node=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, hbm_bytes=80e9,
                hbm_bytes_per_s=hbm)


def test_recomputed_flops_are_every_second_product_by_hand(llm_cluster):
    """The devices run wk, wo and w3 once more per layer and sample; at infinite HBM bandwidth that is the whole
    recompute time, at the GEMM rate."""
    step = llm_step(SPEC, Execution(**ONE, recompute="selective-op"), _cluster(llm_cluster))
    extra = step.hardware_flops - hardware_flops_per_iteration(SPEC, 2, "none", attention="flash")
    assert extra == pytest.approx(L * 2 * S * RECOMPUTED_FLOPS_PER_TOKEN, rel=1e-12)
    assert step.recompute_s == pytest.approx(2 * L * S * RECOMPUTED_FLOPS_PER_TOKEN / (PEAK * EFF), rel=1e-9)


def test_llama3_8b_recomputes_37_percent_of_the_gemm_flops():
    """Llama 3 8B (4096, kv 1024, FFN 14336): (1024 + 4096 + 14336) / (3 x 4096 + ... ) of its forward GEMMs,
    the share the doc states; the forward GEMM total is layer_fwd_flops's, a second count of the same products."""
    spec = preset("llama3-8b")
    step_flops = hardware_flops_per_iteration(spec, 1, "selective-op") - hardware_flops_per_iteration(spec, 1, "none")
    gemm = layer_fwd_flops(spec, 1)["gemm"] * spec.layers
    assert gemm == pytest.approx(2 * 8192 * 32 * (4096 * (4096 + 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 14336))
    assert step_flops / gemm == pytest.approx(19456 / 53248, rel=1e-12)


def test_saved_bytes_are_the_kept_outputs_by_hand(llm_cluster):
    """One micro-batch in flight on one GPU: every layer keeps its input, the kept products' outputs, the
    attention output and its logsumexp; less than without recompute, more than full recompute's input."""
    cluster = _cluster(llm_cluster)
    got = llm_step(SPEC, Execution(**ONE, recompute="selective-op"), cluster).activation_bytes
    assert got == pytest.approx(L * S * SAVED_PER_TOKEN, rel=1e-12)
    none = llm_step(SPEC, Execution(**ONE), cluster).activation_bytes
    full = llm_step(SPEC, Execution(**ONE, recompute="full"), cluster).activation_bytes
    assert full == pytest.approx(L * S * E * H) and full < got < none


def test_recompute_reruns_the_memory_bound_kernels_but_the_last_add(llm_cluster):
    """At a finite HBM bandwidth the op policy also re-runs the layer's eager kernels up to the last product
    (everything but the second residual add), at the device's effective bandwidth."""
    cluster = _cluster(llm_cluster, hbm=HBM)
    rate = HBM * cluster.device.memory_efficiency
    step = llm_step(SPEC, Execution(**ONE, recompute="selective-op", fused_kernels=False), cluster)
    want = 2 * L * S * (RECOMPUTED_FLOPS_PER_TOKEN / (PEAK * EFF) + (EAGER_PER_TOKEN - LAST_ADD_PER_TOKEN) / rate)
    assert step.recompute_s == pytest.approx(want, rel=1e-9)


def test_eager_kernels_add_their_bytes_forward_and_twice_backward(llm_cluster):
    """fused_kernels false moves the eager count's extra bytes over the fused count once in forward and twice in
    backward, per layer and micro-batch; nothing else changes."""
    cluster = _cluster(llm_cluster, hbm=HBM)
    rate = HBM * cluster.device.memory_efficiency
    fused = llm_step(SPEC, Execution(**ONE), cluster)
    eager = llm_step(SPEC, Execution(**ONE, fused_kernels=False), cluster)
    want = 3 * 2 * L * S * (EAGER_PER_TOKEN - FUSED_PER_TOKEN) / rate
    assert eager.compute_s - fused.compute_s == pytest.approx(want, rel=1e-9)
    assert eager.activation_bytes == fused.activation_bytes and eager.hardware_flops == fused.hardware_flops


def test_a_gelu_ffn_keeps_its_first_product():
    """Without a gate the products are wq, wk, wv, wo, w1, w2: wk, wo and w2 are recomputed."""
    gelu = TransformerSpec(name="g", layers=2, hidden=H, heads=A, kv_heads=2, ffn_hidden=F, mlp="gelu",
                           dropout=False, bias=False, position="rope", vocab=1, seq_len=S)
    extra = hardware_flops_per_iteration(gelu, 1, "selective-op") - hardware_flops_per_iteration(gelu, 1, "none")
    assert extra == pytest.approx(2 * S * 2 * (H * KV + H * H + F * H), rel=1e-12)


@pytest.mark.parametrize("spec, execution, field", [
    (preset("gpt3-175b"), Execution(gpus=1, recompute="selective-op"), "biased projections"),
    (preset("qwen3-30b-a3b"), Execution(gpus=1, recompute="selective-op"), "MoE layers"),
    (SPEC, Execution(gpus=2, tp=2, recompute="selective-op"), "tp=2"),
    (SPEC, Execution(gpus=1, recompute="selective-op", attention="materialized"), "attention=materialized"),
])
def test_what_the_op_policy_is_not_modelled_for_is_refused_in_one_line(spec, execution, field):
    with pytest.raises(ConfigError) as err:
        check_execution(execution, spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith("execution.recompute: got selective-op") and field in message


def test_the_execution_file_takes_both_fields_and_refuses_a_wrong_type():
    e = execution_from_dict({"gpus": 1, "recompute": "selective-op", "fused_kernels": False})
    assert e.recompute == "selective-op" and e.fused_kernels is False
    with pytest.raises(ConfigError, match="fused_kernels"):
        execution_from_dict({"gpus": 1, "fused_kernels": "no"})
    with pytest.raises(ConfigError, match="recompute_num_layers"):
        Execution(gpus=1, recompute="selective-op", recompute_num_layers=1)


def test_the_op_policy_keeps_the_attention_so_cp_does_not_exchange_again(llm_cluster):
    """SDPA's output is kept: the CP ring runs in forward and backward only, as without recompute, where the
    attention-core ``selective`` runs it a third time (4 exchanges' worth instead of 3)."""
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=1e9, network_latency_s=5e-6)
    kw = dict(gpus=4, cp=4, micro_batch=1, global_batch=2)
    none = llm_step(SPEC, Execution(**kw), cluster).cp_comm_s
    assert none > 0
    assert llm_step(SPEC, Execution(**kw, recompute="selective-op"), cluster).cp_comm_s == pytest.approx(none)
    assert llm_step(SPEC, Execution(**kw, recompute="selective"), cluster).cp_comm_s == pytest.approx(4 / 3 * none)
