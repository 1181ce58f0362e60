"""FlashAttention and fp8 accounting of a layer against closed forms written here from the papers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcdla.errors import WorkloadError
from mcdla.workload.transformer import (TransformerSpec, activation_bytes_per_layer, flash_attention_bytes,
                                        fp8_cast_bytes_per_layer, hardware_flops_per_iteration, layer_fwd_flops)


def _gpt(a=16, h=1024, layers=4, s=512, v=1000, causal=True):
    return TransformerSpec(name="t", layers=layers, hidden=h, heads=a, vocab=v, seq_len=s, causal=causal)


def _llama(a=32, kv=8, d=128, s=2048):
    return TransformerSpec(name="l", layers=2, hidden=a * d, heads=a, kv_heads=kv, ffn_hidden=3 * a * d,
                           mlp="swiglu", vocab=1000, seq_len=s, dropout=False, bias=False, position="rope",
                           tied_embeddings=False)


@given(a=st.sampled_from([8, 16, 32]), d=st.sampled_from([64, 128]), s=st.integers(1, 8192), b=st.integers(1, 4),
       causal=st.booleans())
def test_flash_forward_core_flops_are_fa2_benchmark_count(a, d, s, b, causal):
    """FA2 (Dao 2023, sec. 4.1): forward attention FLOPs = 4 seqlen^2 head_dim heads per sample, halved with a
    causal mask; the materialised accounting never halves."""
    spec = _gpt(a=a, h=a * d, s=s, causal=causal)
    fa2 = 4.0 * s * s * d * a * b / (2.0 if causal else 1.0)
    assert layer_fwd_flops(spec, b, attention="flash")["attention"] == pytest.approx(fa2, rel=1e-12)
    assert layer_fwd_flops(spec, b, attention="materialized")["attention"] == pytest.approx(4.0 * s * s * d * a * b)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_flash_hardware_flops_have_a_2_5x_core_backward(recompute):
    """Hardware FLOPs of a GPT with FlashAttention-2: 3 x the GEMMs (24 B s l h^2) plus the causal core 2 B s^2 h
    per layer forward and 2.5x that backward (FA2 sec. 3.2), 3 x logits 2 B s h V, plus the recompute."""
    l, h, s, v, B = 4, 1024, 512, 1000, 8
    spec = _gpt(h=h, layers=l, s=s, v=v)
    gemm, core = 24.0 * B * s * h * h, 2.0 * B * s * s * h
    extra = {"none": 0.0, "selective": core, "full": gemm + core}[recompute]
    expect = l * (3 * gemm + 3.5 * core + extra) + 3 * 2.0 * B * s * h * v
    assert hardware_flops_per_iteration(spec, B, recompute, attention="flash") == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("tp, sp", [(1, False), (4, False), (4, True)])
def test_flash_activations_drop_the_score_terms_and_keep_the_logsumexp(tp, sp):
    """Korthikanti et al. 2022 Table 2 without the 5 a s / h score terms, plus the fp32 logsumexp (4 a s b):
    ``s b h (10/t + 24/t) + 4 a s b / t`` with SP, ``s b h (10 + 24/t) + 4 a s b / t`` without."""
    a, h, s, b = 16, 1024, 2048, 2
    spec = _gpt(a=a, h=h, s=s)
    outside = 10.0 / tp if sp else 10.0
    expect = s * b * h * (outside + 24.0 / tp) + 4.0 * a * s * b / tp
    assert activation_bytes_per_layer(spec, b, tp=tp, sp=sp, attention="flash") == pytest.approx(expect, rel=1e-12)


def test_fp8_saved_gemm_inputs_shrink_korthikanti_34_to_27():
    """TE saves the QKV, projection and fc1 inputs (2 s b h each at bf16) and the fc2 input (8 s b h) in fp8:
    34 s b h becomes 34 - 1 - 1 - 1 - 4 = 27 s b h, the 5 a s^2 b score terms unchanged."""
    a, h, s, b = 16, 1024, 2048, 1
    spec = _gpt(a=a, h=h, s=s)
    got = activation_bytes_per_layer(spec, b, attention="materialized", fp8_gemm_inputs=True)
    assert got == pytest.approx(s * b * h * (27 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("tp, sp", [(1, False), (4, False), (4, True)])
def test_mxfp8_saved_gemm_inputs_carry_one_e8m0_scale_byte_per_32_elements(tp, sp):
    """MXFP8: each saved GEMM input is one fp8 copy (1 byte an element) with its E8M0 block scales (1 byte per 32
    elements): the QKV and fc1 inputs (s b h each, split over tp only with sp), the projection input (s b h) and
    the fc2 input (4 s b h, both split over tp) cost 1 + 1/32 bytes an element instead of 1."""
    a, h, s, b = 16, 1024, 2048, 2
    spec = _gpt(a=a, h=h, s=s)
    kw = dict(tp=tp, sp=sp, attention="materialized", fp8_gemm_inputs=True)
    per_tensor = activation_bytes_per_layer(spec, b, fp8_scaling="current", **kw)
    mx = activation_bytes_per_layer(spec, b, fp8_scaling="mxfp8", **kw)
    elements = s * b * h * (2 / (tp if sp else 1) + 5 / tp)
    assert per_tensor == pytest.approx(activation_bytes_per_layer(spec, b, fp8_scaling="delayed", **kw), rel=1e-15)
    assert mx - per_tensor == pytest.approx(elements / 32, rel=1e-12)
    assert activation_bytes_per_layer(spec, b, tp=tp, sp=sp, fp8_scaling="mxfp8") == pytest.approx(
        activation_bytes_per_layer(spec, b, tp=tp, sp=sp), rel=1e-15)  # bf16 inputs: no scales


@pytest.mark.parametrize("tp, cp", [(1, 1), (2, 1), (4, 2)])
def test_flash_kernel_traffic_per_head_is_fa2_compulsory_io(tp, cp):
    """Per (sample, head) the FA2 forward reads Q, K, V (N x d each) and writes O (N x d) and the fp32
    logsumexp (N); the backward reads Q, K, V, O, dO and the logsumexp and writes dQ, dK, dV. With GQA, K and V
    (and dK, dV) exist once per kv-head. Heads split over tp, the N tokens over cp."""
    a, kv, d, s, b = 32, 8, 128, 2048, 2
    spec = _llama(a=a, kv=kv, d=d, s=s)
    n = s / cp
    q_heads, kv_heads = a / tp, kv / tp
    tile = 2 * n * d  # one bf16 N x d tensor of one head
    fwd = b * (q_heads * (tile + tile + 4 * n) + kv_heads * 2 * tile)  # Q, O, lse | K, V
    bwd = b * (q_heads * (3 * tile + 4 * n + tile) + kv_heads * 4 * tile)  # Q, O, dO, lse, dQ | K, V, dK, dV
    got = flash_attention_bytes(spec, b, tp=tp, cp=cp)
    assert got["fwd"] == pytest.approx(fwd, rel=1e-12) and got["bwd"] == pytest.approx(bwd, rel=1e-12)


# Bytes an element of each GPT fp8 GEMM input by hand (bf16 in, 1-byte fp8 out; current scaling's amax pass reads
# 2 more): per token, forward QKV h, projection h/t, fc1 h, fc2 4h/t; backward output gradients QKV 3h/t,
# projection h, fc1 4h/t, fc2 h. Transformer Engine 2.9: the QKV and fc1 inputs leave a norm, which takes current
# scaling's amax (3 bytes: read 2, write 1) or writes delayed scaling's fp8 itself (0); with SP they and the
# projection and fc2 output gradients are cast on the 1/t shard; TN-only (Hopper) writes a transposed byte in each
# whole cast and transposes a gathered tensor (read 1, write 1) for the wgrad. MXFP8 writes a rowwise and a
# columnwise fp8 copy (2 bytes) and one E8M0 scale byte per 32 elements of each (2/32), on a GPU of any layout.
_MX = 2 + 2 / 32
_GPT_CASTS = {  # (scaling, sp, tn_only): (QKV/fc1 input, proj/fc2 input, proj/fc2 grad, QKV/fc1 grad, gathered)
    ("current", False, False): (3, 5, 5, 5, 0),
    ("current", True, False): (3 / 4, 5, 5 / 4, 5, 0),
    ("current", True, True): (3 / 4, 6, 5 / 4, 6, 2),
    ("current", False, True): (4, 6, 6, 6, 0),
    ("delayed", False, False): (0, 3, 3, 3, 0),
    ("mxfp8", True, False): ((2 + _MX) / 4, 2 + _MX, (2 + _MX) / 4, 2 + _MX, 0),
    ("mxfp8", False, False): (2 + _MX, 2 + _MX, 2 + _MX, 2 + _MX, 0),
    ("mxfp8", True, True): ((2 + _MX) / 4, 2 + _MX, (2 + _MX) / 4, 2 + _MX, 0),
}


@pytest.mark.parametrize("scaling, sp, tn_only", list(_GPT_CASTS))
def test_fp8_cast_traffic_sums_each_gemm_input(scaling, sp, tn_only):
    """Each fp8 GEMM input's cast as Transformer Engine 2.9 runs it, summed by hand over the four GEMMs each way
    (``_GPT_CASTS``, tp 4)."""
    h, s, b, t = 1024, 512, 2, 4
    spec = _gpt(h=h, s=s)
    tokens = b * s
    normed, row_in, row_grad, col_grad, gathered = _GPT_CASTS[(scaling, sp, tn_only)]
    fwd = tokens * (2 * h * normed + (h / t + 4 * h / t) * row_in)
    bwd = tokens * (2 * h * row_grad + (3 * h / t + 4 * h / t) * col_grad + 4 * h * gathered)
    got = fp8_cast_bytes_per_layer(spec, b, tp=t, scaling=scaling, sp=sp, tn_only=tn_only)
    assert got["fwd"] == pytest.approx(fwd, rel=1e-12) and got["bwd"] == pytest.approx(bwd, rel=1e-12)


def test_mxfp8_cast_bytes_of_a_small_layer_by_hand():
    """One GPT layer, h 64, s 32, b 1, tp 2, no SP, MXFP8: 32 tokens; each cast reads bf16 (2 bytes) and writes a
    rowwise and a columnwise copy (1 byte each) with one scale byte per 32 elements of each copy. Forward casts
    the QKV and fc1 inputs (32 x 64 each), the projection input (32 x 32) and the fc2 input (32 x 128); backward
    the projection and fc2 output gradients (32 x 64 each), the QKV output gradient (32 x 96) and fc1's
    (32 x 128)."""
    spec = _gpt(h=64, s=32)
    per_element = 2 + 1 + 1 + 1 / 32 + 1 / 32
    fwd_elements = 32 * 64 * 2 + 32 * 32 + 32 * 128  # 8192
    bwd_elements = 32 * 64 * 2 + 32 * 96 + 32 * 128  # 11264
    got = fp8_cast_bytes_per_layer(spec, 1, tp=2, scaling="mxfp8")
    assert got["fwd"] == pytest.approx(fwd_elements * per_element, rel=1e-12)
    assert got["bwd"] == pytest.approx(bwd_elements * per_element, rel=1e-12)


def test_bad_attention_and_scaling_are_one_line_errors():
    """An unknown attention kind or fp8 recipe names the value and the choices."""
    with pytest.raises(WorkloadError, match=r"attention: got 'sparse'; must be one of flash, materialized"):
        layer_fwd_flops(_gpt(), 1, attention="sparse")
    with pytest.raises(WorkloadError, match=r"fp8_scaling: got 'nvfp4'; must be one of delayed, current, mxfp8"):
        fp8_cast_bytes_per_layer(_gpt(), 1, scaling="nvfp4")

