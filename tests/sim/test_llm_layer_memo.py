"""The per-layer compute memo of the LLM time model: an execution whose layer shape another evaluation already
priced gets the StageCosts and LlmStep it gets on a fresh memo, and every field the layer figures depend on
keys them."""

import dataclasses
import gc
import weakref

import pytest

from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

SPEC = preset("gpt3-175b")
BASE = Execution(gpus=512, tp=8, pp=8, dp=8, sequence_parallel=True, micro_batch=1, global_batch=512,
                 recompute="selective", zero=1)


def _fresh(fn, *args, **kwargs):
    """``fn`` on an emptied memo: the figures computed from scratch."""
    _forget(*args)
    return fn(*args, **kwargs)


def _forget(*args):
    """Empty the per-cluster memo of every cluster among ``args``."""
    for arg in args:
        if isinstance(arg, Cluster):
            arg.model_memo.clear()


@pytest.mark.parametrize("other", [
    dict(pp=16, dp=4), dict(zero=3), dict(dp_overlap=True), dict(recompute="full"), dict(recompute="none"),
    dict(virtual_stages=2, pp_comm_overlap=True)])
def test_shared_layer_shape_gives_fresh_answer(other):
    """After pricing BASE, an execution with the same layer shape but another pipeline, ZeRO stage, overlap or
    recompute gets what it gets on an empty memo (the memo only holds what it does not change)."""
    cluster = load_cluster("dgx-h100").for_gpus(512)
    e = dataclasses.replace(BASE, **other)
    expected_costs, expected_step = _fresh(stage_costs, SPEC, e, cluster), _fresh(llm_step, SPEC, e, cluster)
    _forget(cluster)
    llm_step(SPEC, BASE, cluster)
    assert stage_costs(SPEC, e, cluster) == expected_costs
    assert llm_step(SPEC, e, cluster) == expected_step


@pytest.mark.parametrize("other", [
    dict(micro_batch=2, global_batch=1024), dict(tp=4, dp=16), dict(attention="materialized"),
    dict(fused_kernels=False), dict(sequence_parallel=False)])
def test_each_layer_field_keys_the_memo(other):
    """A field the layer's compute depends on gives that execution's own figures, not the cached ones."""
    cluster = load_cluster("dgx-h100").for_gpus(512)
    e = dataclasses.replace(BASE, **other)
    expected = _fresh(stage_costs, SPEC, e, cluster)
    _forget(cluster)
    base = stage_costs(SPEC, BASE, cluster)
    got = stage_costs(SPEC, e, cluster)
    assert got == expected
    assert got.layer_fwd_s != base.layer_fwd_s


def test_precision_and_cluster_key_the_memo():
    """Another precision or another cluster (even one equal to it, built apart) is priced on its own."""
    h100, a100 = load_cluster("dgx-h100").for_gpus(512), load_cluster("dgx-a100").for_gpus(512)
    expected_fp8 = _fresh(stage_costs, SPEC, BASE, h100, precision="fp8")
    expected_a100 = _fresh(stage_costs, SPEC, BASE, a100)
    _forget(h100, a100)
    stage_costs(SPEC, BASE, h100)
    assert stage_costs(SPEC, BASE, h100, precision="fp8") == expected_fp8
    assert stage_costs(SPEC, BASE, a100) == expected_a100


def test_clusters_do_not_share_memo_entries():
    """Two equal clusters built apart each keep their own memo: pricing on one fills its memo only, and the
    other prices the same execution from scratch to the same record; a replaced cluster starts empty."""
    one, two = load_cluster("dgx-h100").for_gpus(512), load_cluster("dgx-h100").for_gpus(512)
    assert one == two and one.model_memo is not two.model_memo
    first = llm_step(SPEC, BASE, one)
    assert one.model_memo and not two.model_memo
    assert llm_step(SPEC, BASE, two) == first
    assert two.model_memo.keys() == one.model_memo.keys()
    assert not dataclasses.replace(one).model_memo


def test_memo_dies_with_its_cluster():
    """What a cluster's memo holds is released with the cluster (no module-level table keeps it)."""
    class Held:
        pass

    cluster = load_cluster("dgx-h100").for_gpus(512)
    llm_step(SPEC, BASE, cluster)
    held = Held()
    cluster.model_memo[("test-entry",)] = held
    alive = weakref.ref(held)
    del held, cluster
    gc.collect()
    assert alive() is None
