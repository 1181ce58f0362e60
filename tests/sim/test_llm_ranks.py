"""The per-rank LLM engine against closed forms of the 1F1B schedule, and the fast path against the engine.

Closed forms used (derived in ``docs/llm.md``, "Per-rank engine"): with every chunk costing ``F_c`` forward and
``B_c`` backward, Megatron's 1F1B and interleaved schedules take ``(m v + p - 1)(F_c + B_c)``; when the last
stage is the slowest (it alone carries the logits and loss, or a straggler, or more layers) it never waits once
fed, so the schedule takes ``m T_last + (p - 1)/v T_middle`` (1F1B with uneven stages: ``m T_last + sum of the
other stages' T``).
"""

import itertools
import math
import time

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.sim.llm_ranks import pipeline_order, schedule_pipeline, simulate_ranks
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

PEAK, EFF = 300e12, 0.5
SPEC = TransformerSpec(name="s", layers=16, hidden=1024, heads=16, vocab=51200, seq_len=1024)


def _flops_cluster(make) -> Cluster:
    """Only FLOPs cost time: links and HBM never bind, no latency (two nodes of 8 GPUs)."""
    return make(nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)


def _dgx(e: Execution) -> Cluster:
    """The shipped DGX A100 preset, sized for the execution."""
    return load_cluster("dgx-a100").for_gpus(e.gpus)


def _flops_times(spec: TransformerSpec, tp: int, b: int = 1) -> tuple[float, float]:
    """Independent of the model code: one GPT layer's forward (``24 b s h^2 + 4 b s^2 h`` FLOPs) and the
    logits' forward (``2 b s h V``) on one of ``tp`` ranks at PEAK x EFF, seconds."""
    s, h = spec.seq_len, spec.hidden
    rate = PEAK * EFF * tp
    return (24 * b * s * h * h + 4 * b * s * s * h) / rate, 2 * b * s * h * spec.vocab / rate


@pytest.mark.parametrize("p, v, m", [(2, 1, 1), (2, 1, 3), (4, 1, 8), (8, 1, 3), (4, 2, 8), (4, 2, 4), (2, 4, 6),
                                     (8, 3, 64), (3, 2, 9)])
def test_uniform_schedule_is_m_v_plus_p_minus_1_chunks(p, v, m):
    """Balanced chunks: the schedule takes ``(m v + p - 1)(F_c + B_c)`` and every stage is busy ``m v (F_c +
    B_c)`` (the bubble ``(p - 1)/(m v)`` of SC21 sec. 2.2, here a property of the simulated order)."""
    f, b = 0.3, 0.7
    sched = schedule_pipeline([[f] * v] * p, [[b] * v] * p, m)
    assert sched.makespan_s == pytest.approx((m * v + p - 1) * (f + b), rel=1e-12)
    assert all(x == pytest.approx(m * v * (f + b), rel=1e-12) for x in sched.busy_s)


@pytest.mark.parametrize("p, v, m", [(4, 1, 8), (4, 2, 8), (2, 3, 4), (6, 1, 2)])
@pytest.mark.parametrize("extra", [0.0, 0.2, 3.0])
def test_heavier_last_chunk_closed_form(p, v, m, extra):
    """The last chunk of the last stage costs ``extra`` more (logits, loss): ``m T_last + (p-1)/v T_mid``."""
    f, b = 0.25, 0.5
    fwd = [[f] * v for _ in range(p)]
    bwd = [[b] * v for _ in range(p)]
    fwd[-1][-1] += extra / 3
    bwd[-1][-1] += 2 * extra / 3
    t_mid = v * (f + b)
    sched = schedule_pipeline(fwd, bwd, m)
    assert sched.makespan_s == pytest.approx(m * (t_mid + extra) + (p - 1) / v * t_mid, rel=1e-12)


def test_order_is_megatrons():
    """1F1B on 2 stages, 3 micro-batches, and the interleaved warm-up depth ``2 (p - s - 1) + (v - 1) p``."""
    assert pipeline_order(2, 3, 1, 0) == [(True, 0, 0), (True, 1, 0), (False, 0, 0), (True, 2, 0), (False, 1, 0),
                                          (False, 2, 0)]
    assert pipeline_order(2, 3, 1, 1) == [(True, 0, 0), (False, 0, 0), (True, 1, 0), (False, 1, 0), (True, 2, 0),
                                          (False, 2, 0)]
    p, v, m = 4, 2, 8
    for s in range(p):
        order = pipeline_order(p, m, v, s)
        assert sorted(order) == sorted((fw, mb, c) for fw in (True, False) for mb in range(m) for c in range(v))
        warm = next(i for i, op in enumerate(order) if not op[0])
        assert warm == 2 * (p - s - 1) + (v - 1) * p + 1  # the warm-up, then the first steady forward
        assert order[:4] == [(True, 0, 0), (True, 1, 0), (True, 2, 0), (True, 3, 0)]  # micro-batch groups of p


CASES = [dict(tp=2, pp=4, dp=2, virtual_stages=v, recompute=rc, sequence_parallel=sp, dp_overlap=ov, zero=z)
         for v, rc, sp, ov, z in itertools.product([1, 2], ["none", "selective", "full"], [False, True],
                                                   [False, True], [0, 3])]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_fast_path_equals_per_rank_engine_on_symmetric_systems(kw):
    """TP2 PP4 DP2, 8 micro-batches, 1F1B and interleaved v=2, on DGX A100 figures (every cost non-zero):
    the closed form and the 16-rank schedule agree to rounding, but for the per-link floor (sim/llm_floor.py):
    with ZeRO-3 and the reduction overlapped, the last backward's gathers and reduce-scatters share the NVLink
    with the reduction's, which the schedule prices as idle; the floor's part is then all of the difference,
    in the reduction's time."""
    e = Execution(gpus=16, micro_batch=1, global_batch=16, **kw)
    fast = llm_step(SPEC, e, _dgx(e))
    ranks = llm_step(SPEC, e, _dgx(e), mode="ranks")
    shared = fast.contention_s
    assert (shared > 0) == (kw["zero"] == 3 and kw["dp_overlap"])
    assert ranks.iteration_s + shared == pytest.approx(fast.iteration_s, rel=1e-12)
    assert ranks.dp_comm_s + shared == pytest.approx(fast.dp_comm_s, rel=1e-12)
    if not shared:
        assert ranks.to_dict() == pytest.approx(fast.to_dict(), rel=1e-9, abs=1e-15)
    result = simulate_ranks(SPEC, e, _dgx(e))
    assert len(set(result.pipeline_s)) == 1  # symmetric replicas schedule alike


@pytest.mark.parametrize("v", [1, 2])
def test_per_rank_engine_against_independent_flop_count(v, llm_cluster):
    """FLOPs-only cluster: T_mid = (layers/p) x 3 x layer forward, T_last = T_mid + 3 x logits forward, counted
    here from the GPT FLOP formulas; iteration = m T_last + (p-1)/v T_mid."""
    e = Execution(gpus=16, tp=2, pp=4, dp=2, virtual_stages=v, micro_batch=1, global_batch=16,
                  attention="materialized")
    layer, logits = _flops_times(SPEC, tp=2)
    t_mid = SPEC.layers // 4 * 3 * layer
    t_last = t_mid + 3 * logits
    expect = 8 * t_last + 3 / v * t_mid
    assert simulate_ranks(SPEC, e, _flops_cluster(llm_cluster)).iteration_s == pytest.approx(expect, rel=1e-12)
    assert llm_step(SPEC, e, _flops_cluster(llm_cluster)).iteration_s == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("v", [1, 2])
def test_per_rank_engine_with_flash_attention_against_independent_flop_count(v, llm_cluster):
    """FlashAttention on a FLOPs-only cluster: a layer's forward + backward is 3 x 24 s h^2 of GEMMs plus
    (1 + 2.5) x the causal core 2 s^2 h, per TP rank; both modes give m T_last + (p-1)/v T_mid."""
    e = Execution(gpus=16, tp=2, pp=4, dp=2, virtual_stages=v, micro_batch=1, global_batch=16, attention="flash")
    s, h = SPEC.seq_len, SPEC.hidden
    rate = PEAK * EFF * 2
    layer_fb = (3 * 24 * s * h * h + 3.5 * 2 * s * s * h) / rate
    t_mid = SPEC.layers // 4 * layer_fb
    t_last = t_mid + 3 * 2 * s * h * SPEC.vocab / rate
    expect = 8 * t_last + 3 / v * t_mid
    assert simulate_ranks(SPEC, e, _flops_cluster(llm_cluster)).iteration_s == pytest.approx(expect, rel=1e-12)
    assert llm_step(SPEC, e, _flops_cluster(llm_cluster)).iteration_s == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("v", [1, 2])
def test_straggler_on_the_last_stage_costs_m_times_its_extra_compute(v):
    """One rank of the last stage 2x slower: its TP peer waits for it at every layer and the DP reduction waits
    for its replica, so the iteration grows by exactly ``m x`` the last stage's compute per micro-batch; the
    fast path, which assumes symmetric ranks, does not see it. Every stage boundary crosses nodes (TP4 DP2
    stages fill a DGX A100), so every send takes the same time."""
    e = Execution(gpus=32, tp=4, pp=4, dp=2, virtual_stages=v, micro_batch=1, global_batch=16)
    cl = _dgx(e)
    c = stage_costs(SPEC, e, cl)
    slow_rank = 1 + 4 * (1 + 2 * 3)  # t=1, d=1, s=3 (Megatron order: tp fastest, then dp, then pp)
    base = simulate_ranks(SPEC, e, cl)
    slow = simulate_ranks(SPEC, e, cl, slowdown={slow_rank: 2.0})
    n = SPEC.layers // 4
    compute_last = n * (c.layer_fwd_s + c.layer_bwd_s + c.layer_recompute_s) + c.last_fwd_s + c.last_bwd_s
    assert slow.iteration_s - base.iteration_s == pytest.approx(8 * compute_last, rel=1e-9)
    assert slow.rank_end_s[slow_rank - 1] == slow.rank_end_s[slow_rank]  # the TP peer is held back alike
    assert slow.pipeline_s[1] > slow.pipeline_s[0] == base.pipeline_s[0]  # the other replica is not slowed
    assert llm_step(SPEC, e, cl).iteration_s == pytest.approx(base.iteration_s, rel=1e-12)


def test_straggler_in_a_middle_stage_makes_it_the_bottleneck(llm_cluster):
    """A 2x slower rank in stage 1 of a FLOPs-only system with a tiny vocabulary: its stage now costs 2 T_mid
    per micro-batch, so the iteration is at least ``m x 2 T_mid`` plus one middle stage's fill, and more than
    the fast path's."""
    spec = TransformerSpec(name="s", layers=16, hidden=1024, heads=16, vocab=8, seq_len=1024)
    e = Execution(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=16)
    layer, _ = _flops_times(spec, tp=2)
    t_mid = 4 * 3 * layer
    slow = simulate_ranks(spec, e, _flops_cluster(llm_cluster), slowdown={2 * 2 * 1: 2.0}).iteration_s  # t0 d0 s1
    assert slow >= 8 * 2 * t_mid + t_mid / 3 * (1 - 1e-12)
    assert slow > llm_step(spec, e, _flops_cluster(llm_cluster)).iteration_s * 1.5


def test_uneven_layer_split_closed_form(llm_cluster):
    """1F1B with layers 3/3/3/7 on a FLOPs-only system, tiny vocabulary: the last stage is the slowest, so the
    schedule takes ``m T_last + sum of the other stages' T`` = ``(7 m + 9) x 3 x layer`` (+ the tiny logits)."""
    spec = TransformerSpec(name="s", layers=16, hidden=1024, heads=16, vocab=8, seq_len=1024)
    e = Execution(gpus=4, pp=4, micro_batch=1, global_batch=8, attention="materialized")
    layer, logits = _flops_times(spec, tp=1)
    got = simulate_ranks(spec, e, _flops_cluster(llm_cluster), layers_per_stage=[3, 3, 3, 7]).iteration_s
    assert got == pytest.approx(8 * (7 * 3 * layer + 3 * logits) + 9 * 3 * layer, rel=1e-12)
    even = simulate_ranks(spec, e, _flops_cluster(llm_cluster)).iteration_s
    assert even == pytest.approx(8 * (4 * 3 * layer + 3 * logits) + 12 * 3 * layer, rel=1e-12)


@pytest.mark.parametrize("kwargs, field", [
    (dict(slowdown={16: 2.0}), "slowdown"), (dict(slowdown={0: 0.0}), "slowdown[0]"),
    (dict(slowdown={0: math.inf}), "slowdown[0]"), (dict(layers_per_stage=[4, 4, 4]), "layers_per_stage"),
    (dict(layers_per_stage=[4, 4, 4, 5]), "layers_per_stage"), (dict(layers_per_stage=[0, 8, 4, 4]), "layers_per_stage"),
])
def test_bad_per_rank_options_are_one_line_errors(kwargs, field):
    """Out-of-range ranks, non-positive or infinite factors, splits that do not cover the layers."""
    e = Execution(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=16)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[")):
        simulate_ranks(SPEC, e, _dgx(e), **kwargs)


def test_mode_switch_errors():
    """An unknown mode, or per-rank options on the fast path, are refused."""
    e = Execution(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=16)
    with pytest.raises(ConfigError, match="mode"):
        llm_step(SPEC, e, _dgx(e), mode="exact")
    with pytest.raises(ConfigError, match="mode=ranks"):
        llm_step(SPEC, e, _dgx(e), slowdown={0: 2.0})


def _gpt3(gpus: int, dp: int, global_batch: int) -> Execution:
    return Execution(gpus=gpus, tp=8, pp=16, dp=dp, sequence_parallel=True, micro_batch=1,
                     global_batch=global_batch, recompute="selective")


def test_fast_path_is_fast_at_1024_and_16384_gpus():
    """GPT-3 175B on 1,024 GPUs (TP8 PP16 DP8, batch 1536) and 16,384 (DP128, batch 12288): the fast path is a
    closed form, well under the issue's 1 s and 5 s (loose bound: the box is shared; benchmarks/RESULTS.md
    holds the measured figures)."""
    spec = preset("gpt3-175b")
    for e, limit in ((_gpt3(1024, 8, 1536), 1.0), (_gpt3(16384, 128, 12288), 5.0)):
        cl = _dgx(e)
        t0 = time.perf_counter()
        step = llm_step(spec, e, cl)
        assert time.perf_counter() - t0 < limit and step.iteration_s > 0


@pytest.mark.slow
def test_per_rank_engine_matches_fast_path_at_1024_gpus():
    """The full per-rank schedule of the 1,024-GPU case (8 replicas x 16 stages x 192 micro-batches) equals
    the fast path and finishes within 10 s on the shared box."""
    spec, e = preset("gpt3-175b"), _gpt3(1024, 8, 1536)
    cl = _dgx(e)
    t0 = time.perf_counter()
    ranks = llm_step(spec, e, cl, mode="ranks")
    assert time.perf_counter() - t0 < 10.0
    assert ranks.iteration_s == pytest.approx(llm_step(spec, e, cl).iteration_s, rel=1e-12)


@pytest.mark.parametrize("model, tp, dp, mb, batch, recompute", [
    ("gpt3-175b", 1, 1, 2, 8, "full"), ("gpt3-175b", 1, 2, 1, 8, "full"), ("gpt3-175b", 2, 1, 1, 8, "selective")])
def test_no_negative_bubble_without_a_pipeline(model, tp, dp, mb, batch, recompute):
    """Without pipeline parallelism the schedule has no idle time: --ranks reports bubble_s 0, not the float sum's
    negative remainder (-1.4e-14 s on these cases before the clamp), and the parts still add up."""
    e = Execution(gpus=tp * dp, tp=tp, dp=dp, micro_batch=mb, global_batch=batch, recompute=recompute)
    step = llm_step(preset(model), e, _dgx(e), mode="ranks")
    assert step.bubble_s == 0.0
    parts = (step.compute_s + step.recompute_s + step.tp_comm_s + step.pp_comm_s + step.dp_comm_s
             + step.optimizer_s + step.offload_s)
    assert parts == pytest.approx(step.iteration_s, rel=1e-12)
