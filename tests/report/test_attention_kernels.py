"""``benchmarks/bench_attention_kernels.py``: the model's attention-core charge for a published kernel shape
against the pricing worked out by hand, and the presets' measured cuDNN 9.13.1 build against the published
times."""

import pytest

from benchmarks.bench_attention_kernels import MEASURED, Kernel, model_ms
from mcdla.hardware import load_cluster


def test_deepseek_heads_priced_as_documented():
    """DeepSeek-V3's expanded heads (128 of 192/128) at batch 1 and sequence 4096 on GB200: the causal core's
    FLOPs at the bf16 peak times the curve, the fused kernel's bytes at the HBM rate, one exponential per score
    each way at 5 T/s; backward 2.5x the FLOPs."""
    k = Kernel("", "deepseek-v3-671b", "gb200-nvl72", "", "", "", 1, 4096, 1.0, 1.0)
    curve = load_cluster("gb200-nvl72").gemm_efficiency
    s, a, dqk, dv, h = 4096, 128, 192, 128, 7168
    eff = curve.peak_fraction * h / (h + curve.half_width) * s / (s + curve.half_tokens)
    flops = s * s * a * (dqk + dv)  # 2 s^2 a (dqk + dv), halved by the causal mask
    rate = 2.5e15 * eff
    hbm = 8e12 * 0.8
    qkv, out, lse = 2 * s * a * (2 * dqk + dv), 2 * s * a * dv, 4 * s * a
    exps = a * s * s / 2 / 5e12
    fwd = flops / rate + (qkv + out + lse) / hbm + exps
    bwd = 2.5 * flops / rate + (2 * qkv + 2 * out + lse) / hbm + exps
    got = model_ms(k)
    assert got[0] == pytest.approx(fwd * 1e3, rel=1e-9)
    assert got[1] == pytest.approx(bwd * 1e3, rel=1e-9)


def test_cudnn_913_build_costs_the_published_times_on_the_measuring_presets():
    """With ``attention_kernel: cudnn-9.13.1`` every published cuDNN 9.13.1 shape costs, on the preset it was
    measured on, its published forward and backward times (the presets' factors are kept to four places), and
    ``gb200-nvl72`` carries the B200 chip's factors, ``b200``'s."""
    rows = [k for k in MEASURED if k.cudnn == "9.13.1"]
    assert {k.system for k in rows} == {"b200", "gb300-nvl72"}
    for k in rows:
        assert model_ms(k, "cudnn-9.13.1") == pytest.approx((k.fwd_ms, k.bwd_ms), rel=2e-4)
    figures = [[(k.name, k.seq_lens, k.fwd, k.bwd) for k in load_cluster(system).attention_kernels]
               for system in ("gb200-nvl72", "b200")]
    assert figures[0] == figures[1]
