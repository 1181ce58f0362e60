"""The configuration search (mcdla.plan.llm_search) against a brute force written here from the divisibility rules."""

from __future__ import annotations

import itertools
import sys

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import Cluster
from mcdla.plan.llm_search import count_candidates, enumerate_executions, evaluate_executions, search
from mcdla.sim import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec

# 6 layers (divisors 1, 2, 3, 6), 6 heads, sequence 12: rules on layers, heads and sequence all bite.
SPEC = TransformerSpec(name="tiny", layers=6, hidden=96, heads=6, vocab=128, seq_len=12)
GPUS, BATCH, PER_NODE = 8, 8, 4


def cluster(make, offload: float = 10e9, hbm: float = 2e6, pool: float = 1e15) -> Cluster:
    """Two nodes of PER_NODE GPUs; ``pool`` bytes of offload tier per GPU when ``offload`` > 0."""
    return make(gpus_per_node=PER_NODE, nodes=GPUS // PER_NODE, peak_flops_per_s=1e12, gemm_peak_fraction=0.5,
                gemm_half_width=10.0, hbm_bytes=hbm, hbm_bytes_per_s=1e11, nvlink_bytes_per_s=1e10,
                network_bytes_per_s=1e9, nvlink_latency_s=5e-6, network_latency_s=10e-6, offload_bytes_per_s=offload,
                pool_bytes_per_gpu=pool)


def brute(*, offload: bool, cps=(1,), max_v=None) -> set[tuple]:
    """Every tuple of small integers and switches, kept when the plain rules hold."""
    keep = set()
    r = range(1, GPUS + 1)
    for tp, cp, pp, dp in itertools.product(r, r, r, r):
        if tp * cp * pp * dp != GPUS or cp not in cps or tp > PER_NODE:
            continue
        if SPEC.heads % tp or SPEC.ffn_hidden % tp:
            continue
        for v, sp, zero, mb, rec in itertools.product(range(1, SPEC.layers + 1), (False, True), (0, 1, 2, 3),
                                                       range(1, BATCH + 1), ("none", "selective", "full")):
            if SPEC.layers % (pp * v) or (v > 1 and pp == 1) or (max_v is not None and v > max_v):
                continue
            if (sp and tp == 1) or SPEC.seq_len % (cp * (tp if sp else 1)):
                continue
            if zero and dp == 1:
                continue
            if BATCH % (mb * dp) or (v > 1 and (BATCH // (mb * dp)) % pp):
                continue
            for off in itertools.product((False, True), repeat=3) if offload else [(False, False, False)]:
                keep.add((tp, cp, pp, dp, v, sp, zero, mb, rec) + off)
    return keep


def key(e: Execution) -> tuple:
    return (e.tp, e.cp, e.pp, e.dp, e.virtual_stages, e.sequence_parallel, e.zero, e.micro_batch, e.recompute,
            e.offload_activations, e.offload_weights, e.offload_optimizer)


@pytest.mark.parametrize("offload, cps, max_v", [(True, (1,), None), (False, (1, 2, 4), None), (False, (1, 2), 2)])
def test_enumeration_equals_brute_force(offload, cps, max_v, llm_cluster):
    c = cluster(llm_cluster, offload=10e9 if offload else 0.0)
    en = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH, cp=cps, max_virtual_stages=max_v)
    got = [key(e) for e in en.executions]
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == brute(offload=offload, cps=cps, max_v=max_v)
    assert en.candidates == len(got) + en.n_rejected
    assert en.n_rejected > 0 and all(n > 0 for n in en.rejected.values())
    for e in en.executions:  # every kept one actually runs
        llm_step(SPEC, e, c)


def test_rejections_are_counted_by_reason(llm_cluster):
    en = enumerate_executions(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH)
    reasons = " | ".join(en.rejected)
    assert "must divide the N layers of tiny" in reasons  # pp = 4 or 8
    assert "ZeRO shards over data-parallel ranks" in reasons
    assert "got" not in reasons  # values stripped: one entry per rule


def test_offload_forced_without_tier_is_rejected(llm_cluster):
    en = enumerate_executions(SPEC, cluster(llm_cluster, offload=0.0), gpus=GPUS, global_batch=BATCH, offload=True)
    assert not any(e.offload_activations or e.offload_weights or e.offload_optimizer for e in en.executions)
    assert any("no second tier" in r for r in en.rejected)


def _brute_best(c: Cluster, limit: float, capacity: float | None):
    best = None
    for t in sorted(brute(offload=True), key=str):
        tp, cp, pp, dp, v, sp, zero, mb, rec, a, w, o = t
        e = Execution(gpus=GPUS, tp=tp, cp=cp, pp=pp, dp=dp, virtual_stages=v, sequence_parallel=sp, zero=zero,
                      micro_batch=mb, global_batch=BATCH, recompute=rec, offload_activations=a, offload_weights=w,
                      offload_optimizer=o)
        s = llm_step(SPEC, e, c)
        if s.device_bytes <= limit and (capacity is None or s.offloaded_bytes <= capacity):
            if best is None or s.iteration_s < best[0]:
                best = (s.iteration_s, s.device_bytes)
    return best


@pytest.mark.parametrize("limit, capacity", [(2e6, None), (6e5, None), (1.2e6, 2e5), (6e5, 1e5), (1.0, None)])
def test_best_is_the_brute_force_minimum_under_the_memory_limit(limit, capacity, llm_cluster):
    """The best fitting row is the brute-force minimum: device bytes within the limit, offloaded bytes within
    the cluster's pool share per GPU."""
    c = cluster(llm_cluster, pool=1e15 if capacity is None else capacity)
    result = search(SPEC, c, gpus=GPUS, global_batch=BATCH, memory_limit_bytes=limit)
    expected = _brute_best(c, limit, capacity)
    if expected is None:
        assert result.best is None and result.fitting == 0
        return
    assert result.best is not None
    assert result.best.step.iteration_s == expected[0]
    for r in result.rows:
        within = r.step.device_bytes <= limit and (capacity is None or r.step.offloaded_bytes <= capacity)
        assert r.fits == within
    assert all(r.fits for r in result.ranked)
    times = [r.step.iteration_s for r in result.ranked]
    assert times == sorted(times)


def test_memory_limit_changes_the_answer(llm_cluster):
    loose = search(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH)
    tight_limit = loose.best.step.device_bytes * 0.9
    tight = search(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH, memory_limit_bytes=tight_limit)
    assert tight.best.step.device_bytes <= tight_limit < loose.best.step.device_bytes
    assert tight.best.step.iteration_s >= loose.best.step.iteration_s


def test_process_pool_equals_serial(llm_cluster):
    execs = enumerate_executions(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH).executions
    serial = evaluate_executions(SPEC, cluster(llm_cluster), execs, backend="serial", memory_limit_bytes=6e5)
    seen = []
    pooled = evaluate_executions(SPEC, cluster(llm_cluster), execs, backend="process", workers=2, chunk_size=37,
                                 memory_limit_bytes=6e5, progress=seen.append)
    assert pooled == serial
    assert sum(seen) == len(execs) and len(seen) == -(-len(execs) // 37)


@pytest.mark.slow
def test_ray_local_equals_serial(llm_cluster):
    ray = pytest.importorskip("ray")
    execs = enumerate_executions(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH).executions
    serial = evaluate_executions(SPEC, cluster(llm_cluster), execs, backend="serial", memory_limit_bytes=6e5)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = evaluate_executions(SPEC, cluster(llm_cluster), execs, backend="ray", chunk_size=50, memory_limit_bytes=6e5)
    finally:
        ray.shutdown()
    assert on_ray == serial


def test_missing_ray_is_one_line(monkeypatch, llm_cluster):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    execs = enumerate_executions(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH).executions[:3]
    with pytest.raises(ConfigError, match=r"ray package is not installed; install it with pip install 'mcdla\[ray\]'"):
        evaluate_executions(SPEC, cluster(llm_cluster), execs, backend="ray")


@pytest.mark.parametrize("kwargs, field", [
    (dict(gpus=0, global_batch=8), "search.gpus"),
    (dict(gpus=8, global_batch=True), "search.global_batch"),
    (dict(gpus=8, global_batch=8, cp=(0,)), "search.cp"),
    (dict(gpus=8, global_batch=8, recompute=("some",)), "search.recompute"),
    (dict(gpus=8, global_batch=8, zero=(4,)), "search.zero"),
])
def test_bad_arguments(kwargs, field, llm_cluster):
    with pytest.raises(ConfigError, match=field) as info:
        enumerate_executions(SPEC, cluster(llm_cluster), **kwargs)
    assert "\n" not in str(info.value)


def test_bad_backend_and_workers(llm_cluster):
    with pytest.raises(ConfigError, match="search.backend: got 'dask'; must be one of serial, process, ray"):
        evaluate_executions(SPEC, cluster(llm_cluster), [], backend="dask")
    with pytest.raises(ConfigError, match="search.workers"):
        evaluate_executions(SPEC, cluster(llm_cluster), [], backend="process", workers=0)


MOE = TransformerSpec(name="tiny-moe", layers=6, hidden=96, heads=6, vocab=128, seq_len=12, experts=4, top_k=2)


def test_enumeration_covers_expert_parallelism(llm_cluster):
    """With ep=(1, 2, 4) the enumeration holds exactly the brute-force tuples where ep divides dp*cp and the 4
    experts and, with TP, SP is on (Megatron-Core); EP adds no GPUs; the closed-form count counts every EP
    candidate."""
    c = cluster(llm_cluster, offload=0.0)
    space = dict(cp=(1, 2), ep=(1, 2, 4), recompute=("none",), zero=(0,), micro_batch=(1,), virtual_stages=(1,))
    en = enumerate_executions(MOE, c, gpus=GPUS, global_batch=BATCH, **space)
    assert count_candidates(MOE, c, gpus=GPUS, global_batch=BATCH, **space) == en.candidates
    got = {(e.tp, e.cp, e.pp, e.dp, e.ep, e.sequence_parallel) for e in en.executions}
    expected = set()
    r = range(1, GPUS + 1)
    for tp, cp, pp, dp, ep, sp in itertools.product(r, (1, 2), r, r, (1, 2, 4), (False, True)):
        if tp * cp * pp * dp != GPUS or tp > PER_NODE or MOE.heads % tp or MOE.ffn_hidden % tp or MOE.layers % pp:
            continue
        if (sp and tp == 1) or MOE.seq_len % (cp * (tp if sp else 1)) or BATCH % dp:
            continue
        if (dp * cp) % ep or MOE.experts % ep or (ep > 1 and tp > 1 and not sp):
            continue
        expected.add((tp, cp, pp, dp, ep, sp))
    assert any(t[4] == 4 and t[1] == 2 for t in expected)  # an EP group spanning CP and DP ranks
    assert got == expected
    for e in en.executions:
        llm_step(MOE, e, c)


def test_narrowed_space_is_the_brute_force_subset_and_counted_exactly(llm_cluster):
    """``pp``/``tp``/``micro_batch``/``zero``/``recompute`` keep exactly the brute-force tuples with those values,
    and ``count_candidates`` (closed form) equals the enumeration's candidates."""
    c = cluster(llm_cluster, offload=0.0)
    space = dict(pp=(1, 2), tp=(2, 4), micro_batch=(1,), zero=(0, 1), recompute=("none", "selective"))
    en = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH, **space)
    expected = {k for k in brute(offload=False) if k[2] in (1, 2) and k[0] in (2, 4) and k[7] == 1
                and k[6] in (0, 1) and k[8] in ("none", "selective")}
    assert expected and {key(e) for e in en.executions} == expected
    assert count_candidates(SPEC, c, gpus=GPUS, global_batch=BATCH, **space) == en.candidates
    with pytest.raises(ConfigError, match=r"^search\.pp: got 0; must be an integer >= 1$"):
        count_candidates(SPEC, c, gpus=GPUS, global_batch=BATCH, pp=(0,))


def _with_tier(e: Execution) -> tuple:
    return key(e) + (e.offload_tier, e.cpu_optimizer)


def test_tier_and_cpu_optimizer_dimensions_multiply_the_offloading_candidates(llm_cluster):
    """Each default candidate that offloads weights or optimizer state is tried on both tiers, and each that
    offloads optimizer state with Adam on the GPU and on the CPU; without drives the NVMe ones are rejected
    with the reason."""
    from mcdla.hardware.cluster import load_cluster

    for c, tiers_ok in ((load_cluster("dgx-h100"), ("host", "nvme")), (cluster(llm_cluster), ("host",))):
        default = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH)
        en = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH, tiers=("host", "nvme"),
                                  cpu_optimizer=(False, True))
        expect = {key(e) + (tier, cpu) for e in default.executions
                  for tier in (tiers_ok if e.offload_weights or e.offload_optimizer else ("host",))
                  for cpu in ((False, True) if e.offload_optimizer else (False,))}
        got = [_with_tier(e) for e in en.executions]
        assert len(got) == len(set(got)) and set(got) == expect
        assert en.candidates == len(got) + en.n_rejected == count_candidates(
            SPEC, c, gpus=GPUS, global_batch=BATCH, tiers=("host", "nvme"), cpu_optimizer=(False, True))
        assert ("nvme" in tiers_ok) != any("has no node.nvme drives" in r for r in en.rejected)
    with pytest.raises(ConfigError, match="search.tiers: got 'disk'"):
        enumerate_executions(SPEC, cluster(llm_cluster), gpus=GPUS, global_batch=BATCH, tiers=("disk",))


def test_layer_count_dimensions_multiply_the_recomputing_and_offloading_candidates(llm_cluster):
    """Each default candidate with full recompute is tried with every recompute count, each that offloads
    activations or weights with every offload count; a count past a model chunk's layers (6 / (pp v)) or both
    counts at once is rejected, and ``count_candidates`` still equals the enumeration's candidates."""
    c = cluster(llm_cluster)
    space = dict(recompute_layers=(None, 0, 1, 3), offload_layers=(None, 2))
    default = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH)
    en = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH, **space)
    expect = set()
    for e in default.executions:
        chunk = SPEC.layers // (e.pp * e.virtual_stages)
        for rn in (None, 0, 1, 3) if e.recompute == "full" else (None,):
            for on in (None, 2) if e.offload_activations or e.offload_weights else (None,):
                if (rn is None or rn <= chunk) and (on is None or on <= chunk) and (rn is None or on is None):
                    expect.add(key(e) + (rn, on))
    got = [key(e) + (e.recompute_num_layers, e.offload_num_layers) for e in en.executions]
    assert len(got) == len(set(got)) and set(got) == expect
    assert en.candidates == len(got) + en.n_rejected == count_candidates(SPEC, c, gpus=GPUS, global_batch=BATCH,
                                                                         **space)
    assert any("must be at most the N layers of each model chunk" in r for r in en.rejected)
    with pytest.raises(ConfigError, match=r"^search\.recompute_layers: got -1; must be an integer >= 0"):
        count_candidates(SPEC, c, gpus=GPUS, global_batch=BATCH, recompute_layers=(-1,))


def test_op_level_recompute_is_searched_only_where_it_is_modelled(llm_cluster):
    """``selective-op`` is not among the default choices; asked for, it is kept exactly at TP 1 on a bias-free
    dense model (the brute force with tp = 1 and the one choice) and every TP > 1 candidate is rejected for it."""
    llama = TransformerSpec(name="tinyllama", layers=6, hidden=96, heads=6, vocab=128, seq_len=12, bias=False,
                            dropout=False, mlp="swiglu", position="rope")
    c = cluster(llm_cluster, offload=0.0)
    default = enumerate_executions(llama, c, gpus=GPUS, global_batch=BATCH)
    assert {e.recompute for e in default.executions} == {"none", "selective", "full"}
    en = enumerate_executions(llama, c, gpus=GPUS, global_batch=BATCH, recompute=("selective-op",))
    want = {k[:8] for k in brute(offload=False) if k[0] == 1 and k[8] == "none"}
    assert {key(e)[:8] for e in en.executions} == want and {e.recompute for e in en.executions} == {"selective-op"}
    assert any("op policy is modelled for dense layers without biases at tp=N" in r for r in en.rejected)
    assert en.candidates == len(en.executions) + en.n_rejected == count_candidates(
        llama, c, gpus=GPUS, global_batch=BATCH, recompute=("selective-op",))
