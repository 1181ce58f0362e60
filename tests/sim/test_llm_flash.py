"""FlashAttention, precision per GEMM and TP-communication overlap in the LLM time and memory model, against
closed forms counted here."""

import dataclasses
import math

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import load_cluster
from mcdla.hardware.gemm import GemmEfficiency
from mcdla.sim.llm import llm_step, precision_of
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

PEAK, EFF = 300e12, 0.5
GPT = TransformerSpec(name="g", layers=8, hidden=1024, heads=16, vocab=1000, seq_len=2048)


def _cluster(make, fp8=None, nvlink=math.inf, capacity=80e9):
    """A FLOPs-only cluster (infinite HBM and links unless given), with an fp8 peak when ``fp8`` is given."""
    c = make(peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, nvlink_bytes_per_s=nvlink, hbm_bytes=capacity)
    if fp8 is None:
        return c
    peaks = {**c.device.peak_flops_per_s, "fp8": fp8}
    return dataclasses.replace(c, device=dataclasses.replace(c.device, peak_flops_per_s=peaks))


def _gpt_times(b, rate_gemm, rate_core):
    """One GPT layer's GEMMs (24 b s h^2) and causal FlashAttention core (2 b s^2 h) forward, and the logits'
    forward (2 b s h V), seconds."""
    s, h = GPT.seq_len, GPT.hidden
    return 24 * b * s * h * h / rate_gemm, 2 * b * s * s * h / rate_core, 2 * b * s * h * GPT.vocab / rate_core


def test_flash_iteration_is_3x_gemms_plus_3_5x_causal_core(llm_cluster):
    """FLOPs-only, one GPU: iteration = m x l x (3 G + 3.5 A) + m x 3 logits, FA2's backward 2.5x its forward."""
    m, b = 3, 2
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m, attention="flash")
    g, a, logits = _gpt_times(b, PEAK * EFF, PEAK * EFF)
    step = llm_step(GPT, e, _cluster(llm_cluster))
    assert step.iteration_s == pytest.approx(m * (GPT.layers * (3 * g + 3.5 * a) + 3 * logits), rel=1e-12)


def test_fp8_runs_only_the_linear_gemms_at_the_fp8_peak(llm_cluster):
    """With a 2x fp8 peak reached at 0.6 of the bf16 efficiency the linear GEMMs run at 1.2x the bf16 rate; the
    attention core and the logits stay in bf16."""
    m, b = 2, 1
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m)
    g, a, logits = _gpt_times(b, 2 * PEAK * EFF * 0.6, PEAK * EFF)
    c = _cluster(llm_cluster, fp8=2 * PEAK)
    c = dataclasses.replace(c, gemm_efficiency=GemmEfficiency(peak_fraction=EFF, half_width=0, fp8_fraction=0.6))
    step = llm_step(GPT, e, c, precision="fp8")
    assert step.iteration_s == pytest.approx(m * (GPT.layers * (3 * g + 3.5 * a) + 3 * logits), rel=1e-12)



def test_bf16_gemms_run_at_the_fp8_rate_times_the_measured_ratio(llm_cluster):
    """NOTE [bf16 from fp8]: with a 2x fp8 peak reached at 0.6 of the bf16 efficiency and a bf16/fp8 matmul ratio
    of 0.45, a bf16 run's linear GEMMs run at 2 x 0.6 x 0.45 = 0.54 of the bf16 rate; the attention core and the
    logits stay at the bf16 rate; an fp8 run is unchanged by the ratio."""
    m, b = 2, 1
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m)
    c = _cluster(llm_cluster, fp8=2 * PEAK)
    plain = GemmEfficiency(peak_fraction=EFF, half_width=0, fp8_fraction=0.6)
    ratio = dataclasses.replace(plain, bf16_over_fp8=0.45)
    g, a, logits = _gpt_times(b, 2 * PEAK * 0.6 * 0.45 * EFF, PEAK * EFF)
    step = llm_step(GPT, e, dataclasses.replace(c, gemm_efficiency=ratio), precision="bf16")
    assert step.iteration_s == pytest.approx(m * (GPT.layers * (3 * g + 3.5 * a) + 3 * logits), rel=1e-12)
    with_ratio = llm_step(GPT, e, dataclasses.replace(c, gemm_efficiency=ratio), precision="fp8")
    without = llm_step(GPT, e, dataclasses.replace(c, gemm_efficiency=plain), precision="fp8")
    assert with_ratio.iteration_s == without.iteration_s


def test_bf16_over_fp8_needs_an_fp8_peak():
    """A curve with ``bf16_over_fp8`` on a GPU without an fp8 peak is refused in one line naming the field."""
    from mcdla.errors import HardwareError
    from mcdla.hardware.cluster import cluster_from_dict

    with pytest.raises(HardwareError, match=r"^test: node\.gemm_efficiency\.bf16_over_fp8: got 0\.5; needs an fp8 "
                                            r"peak in the GPU's peak_flops_per_s \(has bf16, fp16, fp32\)$"):
        cluster_from_dict({"format": "mcdla-system/1", "extends": "dgx-a100", "name": "a",
                           "node": {"gemm_efficiency": {"bf16_over_fp8": 0.5}}}, "test")


@pytest.mark.parametrize("system", ["dgx-h100", "gh200", "b200", "gb200-nvl72", "gb300-nvl72"])
def test_preset_bf16_over_fp8_is_the_quoted_matmul_ratio(system):
    """Each preset's ratio is the quotient of the two measured TFLOP/s figures its source quotes, to 4 places."""
    import re

    curve = load_cluster(system).gemm_efficiency
    quoted = re.search(r"bf16 over fp8 matmul throughput at its best shape, ([0-9.]+) / ([0-9.]+) TFLOP/s",
                       curve.source)
    assert quoted is not None
    assert curve.bf16_over_fp8 == round(float(quoted.group(1)) / float(quoted.group(2)), 4)


def test_measured_attention_kernel_scales_the_core_each_way(llm_cluster):
    """NOTE [attention kernel build]: a build measured at kf x the model's forward and kb x its backward makes the
    causal core cost kf A forward and kb 2.5 A backward; between two measured sequence lengths the factors are
    interpolated linearly, and the GEMMs and logits do not change."""
    from mcdla.hardware.attention_kernel import AttentionKernel

    m, b = 2, 1
    c = _cluster(llm_cluster)
    build = AttentionKernel(name="k", seq_lens=(1024, 4096), fwd=(0.5, 0.8), bwd=(1.0, 1.6))
    c = dataclasses.replace(c, attention_kernels=(build,))
    w = (GPT.seq_len - 1024) / (4096 - 1024)
    kf, kb = 0.5 + w * 0.3, 1.0 + w * 0.6
    g, a, logits = _gpt_times(b, PEAK * EFF, PEAK * EFF)
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m, attention="flash", attention_kernel="k")
    step = llm_step(GPT, e, c)
    assert step.iteration_s == pytest.approx(m * (GPT.layers * (3 * g + kf * a + kb * 2.5 * a) + 3 * logits),
                                             rel=1e-12)


@pytest.mark.parametrize("fields, message", [
    (dict(attention_kernel="nope"), r"^execution\.attention_kernel: got 'nope'; \S+ measures k \(node\.attention_kernels\)$"),
    (dict(attention_kernel="k", attention="materialized"),
     r"^execution\.attention_kernel: got 'k' with attention 'materialized'; a measured build prices the fused kernel"),
])
def test_attention_kernel_refusals_are_one_line(llm_cluster, fields, message):
    """An unknown build, or one with the materialized attention, is refused in one line naming the field."""
    from mcdla.hardware.attention_kernel import AttentionKernel

    c = dataclasses.replace(_cluster(llm_cluster), attention_kernels=(
        AttentionKernel(name="k", seq_lens=(2048,), fwd=(1.0,), bwd=(1.0,)),))
    with pytest.raises(ConfigError, match=message):
        llm_step(GPT, Execution(gpus=1, micro_batch=1, global_batch=1, **fields), c)


def test_attention_kernel_outside_its_measured_lengths_is_refused(llm_cluster):
    """A sequence outside the build's measured lengths has no figure: one line naming the lengths."""
    from mcdla.hardware.attention_kernel import AttentionKernel

    c = dataclasses.replace(_cluster(llm_cluster), attention_kernels=(
        AttentionKernel(name="k", seq_lens=(4096, 8192), fwd=(1.0, 1.0), bwd=(1.0, 1.0)),))
    with pytest.raises(ConfigError, match=r"^execution\.attention_kernel: got 'k' at sequence 2048; its times were "
                                          r"measured at sequence 4096 to 8192 only$"):
        llm_step(GPT, Execution(gpus=1, micro_batch=1, global_batch=1, attention_kernel="k"), c)


@pytest.mark.parametrize("figures, message", [
    (dict(seq_lens=[8192, 4096], fwd=[1, 1], bwd=[1, 1]), r"seq_lens: got \[8192, 4096\]; must be increasing"),
    (dict(seq_lens=[4096], fwd=[1, 2], bwd=[1]), r"got 1 seq_lens, 2 fwd, 1 bwd; must be as many of each"),
])
def test_bad_attention_kernel_figures_are_one_line(figures, message):
    """A system file's attention kernel build with unordered lengths or mismatched lists is refused in one line."""
    from mcdla.errors import HardwareError
    from mcdla.hardware.cluster import cluster_from_dict

    with pytest.raises(HardwareError, match=rf"^attention_kernels\.k(\.|: ){message}"):
        cluster_from_dict({"format": "mcdla-system/1", "extends": "b200", "name": "x",
                           "node": {"attention_kernels": {"k": {**figures, "source": "t"}}}}, "test")

def test_fp8_memory_adds_a_weight_copy_and_saves_fp8_inputs(llm_cluster):
    """One GPU, fp8: weights 2 + 1 (fp8 copy) + gradients 2 + Adam 12 bytes per parameter, and one micro-batch
    of activations per layer: s b h (4 norm + 2 fp8 QKV/fc1 inputs + 2 masks + 6 QKV + 1 projection + 8 GELU
    input + 4 fp8 fc2 input) + the fp32 logsumexp 4 a s b; with MXFP8 the fp8 inputs' scales besides."""
    b = 2
    s, h, a = GPT.seq_len, GPT.hidden, GPT.heads
    step = llm_step(GPT, Execution(gpus=1, micro_batch=b, global_batch=b), _cluster(llm_cluster, fp8=2 * PEAK),
                    precision="fp8")
    acts = GPT.layers * (s * b * h * 27 + 4 * a * s * b)
    assert step.device_bytes == pytest.approx(17 * GPT.params() + acts, rel=1e-12)
    mx = llm_step(GPT, Execution(gpus=1, micro_batch=b, global_batch=b, fp8_scaling="mxfp8"),
                  _cluster(llm_cluster, fp8=2 * PEAK), precision="fp8")
    # MXFP8: the seven s b h of fp8 inputs each with an E8M0 scale byte per 32 elements
    assert mx.device_bytes == pytest.approx(17 * GPT.params() + acts + GPT.layers * s * b * h * 7 / 32, rel=1e-12)


def test_fp8_on_a_device_without_an_fp8_peak_is_one_line(llm_cluster):
    """A cluster whose GPU has no fp8 figure refuses fp8, naming the cluster and the precisions it has."""
    with pytest.raises(ConfigError, match=r"^precision: got 'fp8'; figures gives no fp8 peak for its GPU "
                                          r"\(has bf16, fp16\)$"):
        llm_step(GPT, Execution(gpus=1), _cluster(llm_cluster), precision="fp8")


def test_unknown_precision_lists_the_choices():
    """An unknown precision is a one-line ConfigError with the four choices."""
    with pytest.raises(ConfigError, match=r"^precision: got 'int4'; must be one of bf16, fp16, fp8, fp32$"):
        precision_of("int4")


def test_fp32_doubles_activation_and_weight_bytes(llm_cluster):
    """fp32: 4-byte activations, weights and gradients and 8 bytes of Adam moments: the same 16 bytes per parameter,
    activations (a dropout-free model with materialised scores: no 1-byte masks, no fp32 logsumexp) exactly twice
    bf16's."""
    spec = dataclasses.replace(GPT, dropout=False)
    c = _cluster(llm_cluster)
    c = dataclasses.replace(c, device=dataclasses.replace(c.device, peak_flops_per_s={"bf16": PEAK, "fp32": PEAK}))
    e = Execution(gpus=1, micro_batch=1, global_batch=1, attention="materialized")
    bf16, fp32 = llm_step(spec, e, c), llm_step(spec, e, c, precision="fp32")
    states = 16 * spec.params()
    assert fp32.device_bytes - states == pytest.approx(2 * (bf16.device_bytes - states), rel=1e-12)


@pytest.mark.parametrize("bw", [20e9, 200e9, 5e12])
def test_tp_comm_overlap_hides_collectives_up_to_the_gemms(bw, llm_cluster):
    """Per layer: forward exposes max(0, 2 R - G), backward max(0, 2 R - 2 G), with R one ring all-reduce of
    b s h bf16 elements over t ranks (2 (t-1)/t n / B) and G the layer's forward GEMMs on one rank."""
    t, b, m = 4, 1, 2
    e = dict(gpus=t, tp=t, micro_batch=b, global_batch=b * m)
    c = _cluster(llm_cluster, nvlink=bw)
    r = 2 * (t - 1) / t * 2 * b * GPT.seq_len * GPT.hidden / bw
    g = _gpt_times(b, PEAK * EFF * t, PEAK * EFF * t)[0]
    plain = llm_step(GPT, Execution(**e), c)
    overlap = llm_step(GPT, Execution(**e, tp_comm_overlap=True), c)
    assert plain.tp_comm_s == pytest.approx(m * GPT.layers * 4 * r, rel=1e-12)
    exposed = m * GPT.layers * (max(0.0, 2 * r - g) + max(0.0, 2 * r - 2 * g))
    assert overlap.tp_comm_s == pytest.approx(exposed, rel=1e-9, abs=1e-15)
    assert overlap.iteration_s == pytest.approx(plain.iteration_s - (plain.tp_comm_s - exposed), rel=1e-12)


def test_llama3_70b_megatron_bridge_config_fits_80gb_only_with_flash_attention():
    """Llama 3 70B, TP4 PP8 VP5, micro-batch 1, sequence 8192, 64 GPUs, SP and the distributed optimizer
    (Megatron-Bridge's published 80 GB H100 configuration): fits with FlashAttention; the materialised scores
    do not: the difference is the first stage's 10 layers x 1 + 7/40 of 8 micro-batches in flight, each with
    2 a s^2 / t bytes of softmax output instead of FlashAttention's 4 a s / t of logsumexp."""
    spec, cluster = preset("llama3-70b"), load_cluster("dgx-h100").for_gpus(64)
    e = Execution(gpus=64, tp=4, pp=8, dp=2, virtual_stages=5, sequence_parallel=True, zero=1, micro_batch=1,
                  global_batch=128)
    flash = llm_step(spec, e, cluster)
    materialized = llm_step(spec, dataclasses.replace(e, attention="materialized"), cluster)
    assert flash.fits and flash.device_bytes <= 80e9
    a, s = spec.heads, spec.seq_len
    stored = 10 * 8 * (1 + 7 / 40) * (2 * a * s * s - 4 * a * s) / 4
    assert not materialized.fits
    assert materialized.device_bytes - flash.device_bytes == pytest.approx(stored, rel=1e-12)


def _with_curve(c, **kw):
    return dataclasses.replace(c, gemm_efficiency=GemmEfficiency(peak_fraction=EFF, half_width=0, **kw))


@pytest.mark.parametrize("b", [1, 4, 16])
def test_tokens_per_gemm_slow_every_gemm_by_t_over_t_plus_half(b, llm_cluster):
    """FLOPs-only: with half_tokens T every GEMM (and the attention core) runs at t / (t + T) of the saturated
    efficiency, t = micro-batch x seq; so the time per sample grows by (t + T) / t, more for small micro-batches."""
    half = 4096.0
    e = Execution(gpus=1, micro_batch=b, global_batch=16)
    c = _cluster(llm_cluster)
    saturated = llm_step(GPT, e, _with_curve(c)).iteration_s
    slowed = llm_step(GPT, e, _with_curve(c, half_tokens=half)).iteration_s
    t = b * GPT.seq_len
    assert slowed == pytest.approx(saturated * (t + half) / t, rel=1e-12)


@pytest.mark.parametrize("ratio", [1.6, 2.0, 2.4])
def test_gemm_backward_ratio_scales_only_the_gemm_backward(ratio, llm_cluster):
    """FLOPs-only, FlashAttention: iteration = m (l ((1 + r) G + 3.5 A) + (1 + r) logits): the linear layers' and
    the logits' backward take r x their forward, the attention core keeps FA2's 2.5x."""
    m, b = 2, 1
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m)
    g, a, logits = _gpt_times(b, PEAK * EFF, PEAK * EFF)
    step = llm_step(GPT, e, _with_curve(_cluster(llm_cluster), backward_ratio=ratio))
    expect = m * (GPT.layers * ((1 + ratio) * g + 3.5 * a) + (1 + ratio) * logits)
    assert step.iteration_s == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("field, value, allowed", [
    ("half_tokens", -1.0, "finite and >= 0"), ("backward_ratio", 0.0, "finite and > 0"),
    ("fp8_fraction", 1.5, "in (0, 1]"), ("bf16_over_fp8", 0.0, "in (0, 1]")])
def test_bad_curve_fields_are_one_line(field, value, allowed):
    """A bad kernel-time figure names the field, the value and what is allowed."""
    from mcdla.errors import HardwareError

    with pytest.raises(HardwareError, match=rf"^gemm_efficiency\.{field}: got {value!r}; must be {allowed}"
                                            .replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        GemmEfficiency(peak_fraction=0.5, half_width=0, **{field: value})


@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (2, 2)])
def test_flash_softmax_exponentials_add_after_the_products_at_the_devices_rate(tp, cp, llm_cluster):
    """FLOPs-only with a special-function rate X: each layer adds E = b a s^2 / 2 / (tp cp) exponentials (one per
    causal score, on this rank's heads and queries) in forward and again in backward, E / X seconds each, after
    the matrix products: iteration = m (l (3 G + 3.5 A + 2 E / X) + 3 logits), G, A and the logits split over
    tp cp as well."""
    m, b, rate = 2, 2, 4e12
    gpus = tp * cp
    e = Execution(gpus=gpus, tp=tp, cp=cp, micro_batch=b, global_batch=b * m, attention="flash")
    c = _cluster(llm_cluster)
    c = dataclasses.replace(c, device=dataclasses.replace(c.device, exp_per_s=rate))
    g, a, logits = _gpt_times(b, PEAK * EFF * gpus, PEAK * EFF * gpus)
    exps = b * GPT.heads * GPT.seq_len ** 2 / 2 / (tp * cp)
    step = llm_step(GPT, e, c)
    expected = m * (GPT.layers * (3 * g + 3.5 * a + 2 * exps / rate) + 3 * logits)
    assert step.iteration_s - step.cp_comm_s - step.tp_comm_s == pytest.approx(expected, rel=1e-12)
    plain = llm_step(GPT, e, _cluster(llm_cluster))
    assert step.iteration_s - plain.iteration_s == pytest.approx(m * GPT.layers * 2 * exps / rate, rel=1e-9)


def test_materialized_attention_charges_no_exponentials(llm_cluster):
    """The exponentials belong to the fused kernel: with the scores materialised (a memory-bound softmax kernel)
    a device's special-function rate changes nothing."""
    e = Execution(gpus=1, micro_batch=1, global_batch=2, attention="materialized")
    c = _cluster(llm_cluster)
    with_rate = dataclasses.replace(c, device=dataclasses.replace(c.device, exp_per_s=1e12))
    assert llm_step(GPT, e, with_rate).iteration_s == llm_step(GPT, e, c).iteration_s


@pytest.mark.parametrize("bw", [2e9, 5e9, 50e9])
def test_pp_comm_overlap_hides_each_send_up_to_one_chunks_forward(bw, llm_cluster):
    """PP 4 x 2 chunks of one layer each, FLOPs-only compute: every micro-batch sends 2 v activations or
    gradients of b s h bf16 elements (P = 2 b s h / B each); overlapped, each exposes max(0, P - (G + A)), one
    chunk's forward (its GEMMs and causal core)."""
    p, v, b, m = 4, 2, 1, 8
    e = dict(gpus=p, pp=p, virtual_stages=v, micro_batch=b, global_batch=b * m, attention="flash")
    c = _cluster(llm_cluster, nvlink=bw)
    send = 2 * b * GPT.seq_len * GPT.hidden / bw
    g, a, _ = _gpt_times(b, PEAK * EFF, PEAK * EFF)
    plain = llm_step(GPT, Execution(**e), c)
    overlap = llm_step(GPT, Execution(**e, pp_comm_overlap=True), c)
    assert plain.pp_comm_s == pytest.approx(m * 2 * v * send, rel=1e-12)
    assert overlap.pp_comm_s == pytest.approx(m * 2 * v * max(0.0, send - (g + a)), rel=1e-9, abs=1e-15)


def test_pp_comm_overlap_without_interleaving_is_one_line():
    """The overlap needs a next model chunk: with one chunk per rank it is a one-line ConfigError."""
    with pytest.raises(ConfigError, match=r"^execution\.pp_comm_overlap: got true with virtual_stages=1; "):
        Execution(gpus=4, pp=4, global_batch=8, pp_comm_overlap=True)


def test_pp_comm_overlap_fill_and_drain_wait_for_every_hidden_send(llm_cluster):
    """A send the next chunk hides still delays its receiver: with every send hidden (H = P <= one chunk's
    forward) the iteration is the no-transfer one plus 2 (v p - 1) H, the sends the fill and the drain wait for,
    by the closed form and by the per-rank schedule."""
    p, v, b, m = 4, 2, 1, 8
    e = dict(gpus=p, pp=p, virtual_stages=v, micro_batch=b, global_batch=b * m, attention="flash")
    bw = 50e9
    send = 2 * b * GPT.seq_len * GPT.hidden / bw
    g, a, _ = _gpt_times(b, PEAK * EFF, PEAK * EFF)
    assert send < g + a
    free = llm_step(GPT, Execution(**e), _cluster(llm_cluster))  # infinite links: no transfer time at all
    for mode in ("fast", "ranks"):
        got = llm_step(GPT, Execution(**e, pp_comm_overlap=True), _cluster(llm_cluster, nvlink=bw), mode=mode)
        assert got.iteration_s == pytest.approx(free.iteration_s + 2 * (v * p - 1) * send, rel=1e-9)


def _without_and_with_ring(spec, t, b, m, half, hbm, llm_cluster):
    """``spec`` on TP ``t`` with sequence parallelism, micro-batch ``b``, ``m`` micro-batches, on free links with
    the curve's ``half_tokens`` and an HBM of ``hbm`` at 0.5: the records without and with tp_comm_overlap."""
    e = dict(gpus=t, tp=t, micro_batch=b, global_batch=b * m, sequence_parallel=True)
    c = _with_curve(_cluster(llm_cluster), half_tokens=half)
    c = dataclasses.replace(c, device=dataclasses.replace(c.device, hbm_bytes_per_s=hbm, memory_efficiency=0.5))
    return llm_step(spec, Execution(**e), c), llm_step(spec, Execution(**e, tp_comm_overlap=True), c)


@pytest.mark.parametrize("half, hbm", [(0.0, 1e12), (512.0, math.inf), (256.0, 2e12)])
def test_userbuffers_ring_exchange_chunks_the_gemms_and_reduces_after_the_ring(half, hbm, llm_cluster):
    """tp_comm_overlap (TE userbuffers' ring exchange), links free: each forward GEMM and the projection's and fc2's
    dgrad (5 h^2 of the layer's 12 h^2 per token) run as t GEMMs of T / t tokens, T = b s, so at (T/t + H)/(T/t)
    instead of (T + H)/T of the flat efficiency; the projection's and fc2's reduce-scatter rings end in a kernel
    that reads t chunks of T/t x h bf16 elements and writes one: 2 x 2 (T h + T h / t) bytes a layer's forward."""
    t, b, m = 4, 2, 2
    plain, overlap = _without_and_with_ring(GPT, t, b, m, half, hbm, llm_cluster)
    tokens, h = b * GPT.seq_len, GPT.hidden
    flat = 24 * tokens * h * h / (PEAK * EFF * t)
    chunked = flat * (tokens / t + half) / (tokens / t) - flat * (tokens + half) / tokens
    reduce = 2 * 2 * (tokens * h + tokens * h / t) / (hbm * 0.5)
    extra = m * GPT.layers * (chunked * (1 + 5 / 12) + reduce)
    assert overlap.iteration_s - plain.iteration_s == pytest.approx(extra, rel=1e-9)


def test_fp8_tn_only_must_be_a_bool():
    """A non-boolean fp8_tn_only is one line naming the field and the value."""
    from mcdla.errors import HardwareError

    with pytest.raises(HardwareError, match=r"^gemm_efficiency\.fp8_tn_only: got 'yes'; must be true or false$"):
        GemmEfficiency(peak_fraction=0.5, half_width=0, fp8_tn_only="yes")


def _moe(shared: int) -> TransformerSpec:
    """8 layers, 2 of them dense (FFN 4096), 6 of 8 experts top-2 (FFN 512) with ``shared`` shared experts."""
    return TransformerSpec(name="moe", layers=8, hidden=1024, heads=16, vocab=1000, seq_len=2048, experts=8,
                           top_k=2, ffn_hidden=512, shared_experts=shared, dense_layers=2, dense_ffn_hidden=4096)


@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("half, hbm", [(512.0, 1e12), (256.0, math.inf)])
def test_userbuffers_ring_exchange_leaves_the_router_and_routed_experts_whole(shared, half, hbm, llm_cluster):
    """An MoE model under TP 4 with tp_comm_overlap, links free: the ring exchange chunks only the GEMMs Megatron-Core
    gives userbuffers (QKV 3 h^2 and projection h^2 per token; fc1 and fc2 h F each, F the dense and shared FFN
    width, 4096 in 2 of the 8 layers, 512 per shared expert in the other 6), not the router's nor the routed
    experts' grouped GEMMs; backward the projection's and fc2's dgrad (h^2 + h F); each of the projection's and the
    dense or shared fc2's reduce-scatter rings (1 + 2/8 + 6/8 per layer with a shared expert, 1 + 2/8 without)
    ends in a reduce of 2 (T h + T h / t) bytes."""
    spec, t, b, m = _moe(shared), 4, 2, 2
    plain, overlap = _without_and_with_ring(spec, t, b, m, half, hbm, llm_cluster)
    tokens, h = b * spec.seq_len, spec.hidden
    width = (2 * 4096 + 6 * shared * 512) / 8
    slower = (tokens / t + half) / (tokens / t) - (tokens + half) / tokens  # a chunk's time over the whole's, less 1
    per_weight = 2 * tokens / (PEAK * EFF * t)  # seconds per weight (multiply-add per token) at the flat rate
    forward = (4 * h * h + 2 * h * width) * per_weight * slower
    backward = (h * h + h * width) * per_weight * slower
    rings = 1 + (2 + 6 * shared) / 8
    reduce = rings * 2 * (tokens * h + tokens * h / t) / (hbm * 0.5)
    extra = m * spec.layers * (forward + backward + reduce)
    assert overlap.iteration_s - plain.iteration_s == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("bw", [20e9, 200e9])
def test_tp_collectives_of_an_moe_layer_hide_only_behind_the_userbuffers_gemms(bw, llm_cluster):
    """An MoE model (a shared expert) under TP 4 with tp_comm_overlap: each layer's direction exposes what its
    collectives exceed the GEMMs Transformer Engine's userbuffers run in that layer, forward max(0, 2 R - G),
    backward max(0, 2 R - 2 G), G the QKV, projection and FFN GEMMs' forward on the rank (the dense FFN of 4096
    in the 2 dense layers, the shared expert's 512 in the 6 MoE layers; not the router, not the routed experts),
    R one ring all-reduce of b s h bf16 elements."""
    spec, t, b, m = _moe(1), 4, 1, 2
    e = dict(gpus=t, tp=t, micro_batch=b, global_batch=b * m)
    c = _cluster(llm_cluster, nvlink=bw)
    r = 2 * (t - 1) / t * 2 * b * spec.seq_len * spec.hidden / bw
    h = spec.hidden
    overlap = llm_step(spec, Execution(**e, tp_comm_overlap=True), c)
    exposed = 0.0
    for layers, width in ((2, 4096), (6, 512)):
        g = 2 * b * spec.seq_len * (4 * h * h + 2 * h * width) / (PEAK * EFF * t)
        exposed += m * layers * (max(0.0, 2 * r - g) + max(0.0, 2 * r - 2 * g))
    assert exposed > 0
    assert overlap.tp_comm_s == pytest.approx(exposed, rel=1e-9)
