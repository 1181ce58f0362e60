"""The configuration search (mcdla.sim.llm_search) against a brute force written here from the divisibility rules."""

from __future__ import annotations

import itertools
import sys

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.model import Device
from mcdla.sim.llm import GemmEfficiency, GpuCluster, llm_step
from mcdla.sim.llm_search import enumerate_executions, evaluate_executions, search
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec

# 6 layers (divisors 1, 2, 3, 6), 6 heads, sequence 12: rules on layers, heads and sequence all bite.
SPEC = TransformerSpec(name="tiny", layers=6, hidden=96, heads=6, vocab=128, seq_len=12)
GPUS, BATCH, PER_NODE = 8, 8, 4


def cluster(offload: float = 10e9, hbm: float = 2e6) -> GpuCluster:
    dev = Device(name="g", peak_flops_per_s={"fp16": 1e12}, hbm_bytes=hbm, hbm_bytes_per_s=1e11)
    return GpuCluster(device=dev, gpus_per_node=PER_NODE, nvlink_bytes_per_s=1e10, network_bytes_per_s=1e9,
                      offload_bytes_per_s=offload, gemm_efficiency=GemmEfficiency(peak_fraction=0.5, half_width=10.0))


def brute(*, offload: bool, cps=(1,), max_v=None) -> set[tuple]:
    """Every tuple of small integers and switches, kept when the plain rules hold."""
    keep = set()
    r = range(1, GPUS + 1)
    for tp, cp, pp, dp in itertools.product(r, r, r, r):
        if tp * cp * pp * dp != GPUS or cp not in cps or tp * cp > PER_NODE:
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
def test_enumeration_equals_brute_force(offload, cps, max_v):
    c = cluster(offload=10e9 if offload else 0.0)
    en = enumerate_executions(SPEC, c, gpus=GPUS, global_batch=BATCH, cp=cps, max_virtual_stages=max_v)
    got = [key(e) for e in en.executions]
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == brute(offload=offload, cps=cps, max_v=max_v)
    assert en.candidates == len(got) + en.n_rejected
    assert en.n_rejected > 0 and all(n > 0 for n in en.rejected.values())
    for e in en.executions:  # every kept one actually runs
        llm_step(SPEC, e, c)


def test_rejections_are_counted_by_reason():
    en = enumerate_executions(SPEC, cluster(), gpus=GPUS, global_batch=BATCH)
    reasons = " | ".join(en.rejected)
    assert "must divide the N layers of tiny" in reasons  # pp = 4 or 8
    assert "ZeRO shards over data-parallel ranks" in reasons
    assert "got" not in reasons  # values stripped: one entry per rule


def test_offload_forced_without_tier_is_rejected():
    en = enumerate_executions(SPEC, cluster(offload=0.0), gpus=GPUS, global_batch=BATCH, offload=True)
    assert not any(e.offload_activations or e.offload_weights or e.offload_optimizer for e in en.executions)
    assert any("no second tier" in r for r in en.rejected)


def _brute_best(limit: float, capacity: float | None):
    best = None
    for t in sorted(brute(offload=True), key=str):
        tp, cp, pp, dp, v, sp, zero, mb, rec, a, w, o = t
        e = Execution(gpus=GPUS, tp=tp, cp=cp, pp=pp, dp=dp, virtual_stages=v, sequence_parallel=sp, zero=zero,
                      micro_batch=mb, global_batch=BATCH, recompute=rec, offload_activations=a, offload_weights=w,
                      offload_optimizer=o)
        s = llm_step(SPEC, e, cluster())
        if s.device_bytes <= limit and (capacity is None or s.offloaded_bytes <= capacity):
            if best is None or s.iteration_s < best[0]:
                best = (s.iteration_s, s.device_bytes)
    return best


@pytest.mark.parametrize("limit, capacity", [(2e6, None), (6e5, None), (1.2e6, 2e5), (6e5, 1e5), (1.0, None)])
def test_best_is_the_brute_force_minimum_under_the_memory_limit(limit, capacity):
    result = search(SPEC, cluster(), gpus=GPUS, global_batch=BATCH, memory_limit_bytes=limit,
                    offload_capacity_bytes=capacity)
    expected = _brute_best(limit, capacity)
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


def test_memory_limit_changes_the_answer():
    loose = search(SPEC, cluster(), gpus=GPUS, global_batch=BATCH)
    tight_limit = loose.best.step.device_bytes * 0.9
    tight = search(SPEC, cluster(), gpus=GPUS, global_batch=BATCH, memory_limit_bytes=tight_limit)
    assert tight.best.step.device_bytes <= tight_limit < loose.best.step.device_bytes
    assert tight.best.step.iteration_s >= loose.best.step.iteration_s


def test_process_pool_equals_serial():
    execs = enumerate_executions(SPEC, cluster(), gpus=GPUS, global_batch=BATCH).executions
    serial = evaluate_executions(SPEC, cluster(), execs, backend="serial", memory_limit_bytes=6e5)
    seen = []
    pooled = evaluate_executions(SPEC, cluster(), execs, backend="process", workers=2, chunk_size=37,
                                 memory_limit_bytes=6e5, progress=seen.append)
    assert pooled == serial
    assert sum(seen) == len(execs) and len(seen) == -(-len(execs) // 37)


@pytest.mark.slow
def test_ray_local_equals_serial():
    ray = pytest.importorskip("ray")
    execs = enumerate_executions(SPEC, cluster(), gpus=GPUS, global_batch=BATCH).executions
    serial = evaluate_executions(SPEC, cluster(), execs, backend="serial", memory_limit_bytes=6e5)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = evaluate_executions(SPEC, cluster(), execs, backend="ray", chunk_size=50, memory_limit_bytes=6e5)
    finally:
        ray.shutdown()
    assert on_ray == serial


def test_missing_ray_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    execs = enumerate_executions(SPEC, cluster(), gpus=GPUS, global_batch=BATCH).executions[:3]
    with pytest.raises(ConfigError, match=r"ray package is not installed; install it with pip install 'mcdla\[ray\]'"):
        evaluate_executions(SPEC, cluster(), execs, backend="ray")


@pytest.mark.parametrize("kwargs, field", [
    (dict(gpus=0, global_batch=8), "search.gpus"),
    (dict(gpus=8, global_batch=True), "search.global_batch"),
    (dict(gpus=8, global_batch=8, cp=(0,)), "search.cp"),
    (dict(gpus=8, global_batch=8, recompute=("some",)), "search.recompute"),
    (dict(gpus=8, global_batch=8, zero=(4,)), "search.zero"),
])
def test_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=field) as info:
        enumerate_executions(SPEC, cluster(), **kwargs)
    assert "\n" not in str(info.value)


def test_bad_backend_and_workers():
    with pytest.raises(ConfigError, match="search.backend: got 'dask'; must be one of serial, process, ray"):
        evaluate_executions(SPEC, cluster(), [], backend="dask")
    with pytest.raises(ConfigError, match="search.workers"):
        evaluate_executions(SPEC, cluster(), [], backend="process", workers=0)
