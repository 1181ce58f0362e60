"""The per-link floor's per-cluster figures (sim/llm_floor.py): a group's bytes per byte of buffer by traffic
class (``_group_levels``) and a TP call's (``_tp_call``) are kept in the cluster's ``model_memo``; the bytes they
give must equal, bit for bit, the sums over the group's fabric dimensions (``_dims_bytes``) computed afresh, on
every preset's groups, with the memo filled by other groups first."""

from __future__ import annotations

import itertools

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.sim import llm_floor
from mcdla.sim.llm_floor import _dims_bytes, _level_bytes_per_byte, reduction_bytes
from mcdla.workload.parallel_dims import group_strides

_PRESETS = ("dgx-a100", "dgx-h100", "dgx-h100-cxl", "gh200", "gb200-nvl72", "gb200-nvl72-memnode")
_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")


def _fresh_sum(cluster, calls):  # type: ignore[no-untyped-def]
    """reduction_bytes' sum written out over _dims_bytes, no memo."""
    moved: dict[str, float] = {}
    for kind, nbytes, size, stride in calls:
        for cls, got in _dims_bytes(cluster, kind, nbytes, cluster.group_dims(size, stride)).items():
            moved[cls] = moved.get(cls, 0.0) + got
    return moved


@pytest.mark.parametrize("system", _PRESETS)
def test_group_levels_give_the_dimension_sums_bit_for_bit(system: str) -> None:
    cluster = load_cluster(system).for_gpus(1024)
    groups = [(size, stride) for size, stride in itertools.product((1, 2, 4, 8, 16, 64, 128), (1, 2, 8, 64))
              if size * stride <= 1024]
    nbytes = (1.0, 3.3e8, 7.123456789e9, 2.0**40 / 3)
    for kind, (size, stride), b in itertools.product(_KINDS, groups, nbytes):
        want = _dims_bytes(cluster, kind, b, cluster.group_dims(size, stride))
        got: dict[str, float] = {}
        for cls, per_bytes in llm_floor._group_levels(cluster, kind, size, stride):
            total = 0.0
            for per_byte in per_bytes:
                total += b * per_byte
            got[cls] = total
        assert list(got.items()) == list(want.items())
    # several groups one after another, as a reduction runs them (the dense and the expert gradients)
    traffic = type("T", (), {"gradient_groups": ((7.5e9, 64, 8), (1.25e9, 8, 64), (3.0e9, 128, 8))})()
    execution = type("E", (), {})()
    assert list(reduction_bytes(execution, cluster, traffic).items()) == list(
        _fresh_sum(cluster, [("all-reduce", *g) for g in traffic.gradient_groups]).items())


@pytest.mark.parametrize("system", _PRESETS)
@pytest.mark.parametrize("sp", [False, True])
def test_tp_call_bytes_equal_the_closed_forms_bit_for_bit(system: str, sp: bool) -> None:
    cluster = load_cluster(system).for_gpus(1024)
    for tp, nbytes in itertools.product((1, 2, 4, 8), (1.0, 2.5e7, 4.0e8 / 3)):
        if tp > cluster.gpus_per_node:
            continue
        e = type("E", (), dict(tp=tp, cp=1, dp=1024 // (16 * tp), pp=16, ep=1, sequence_parallel=sp))()
        traffic = type("T", (), {"activation_bytes": nbytes})()
        dims = cluster.group_dims(tp, group_strides(tp, 1, e.dp, 16, 1)[0])
        kinds = ("all-gather", "reduce-scatter") if sp else ("all-reduce",)
        want = nbytes * sum(_level_bytes_per_byte(k, dims)[0] for k in kinds) if dims else 0.0
        for _ in range(2):  # computed, then from the memo
            assert llm_floor._tp_call(e, cluster, traffic)[0] == want
