"""A job that takes part of every node (``Cluster.with_gpus_per_node``): the parallel groups' mapping onto the
scale-up domains, the node's share of sockets, and the bad counts."""

import pytest

from mcdla.errors import HardwareError
from mcdla.hardware.cluster import cluster_from_dict, load_cluster


def _nodes_of(group: range, per_node: int) -> set[int]:
    """The nodes a group of ranks lies on when ranks fill ``per_node`` GPUs of each node in order."""
    return {r // per_node for r in group}


def test_ep_groups_of_64_gpus_per_rack_stay_in_one_nvlink_domain() -> None:
    """256 ranks in racks of 72: packed, EP groups of 32 consecutive ranks straddle racks (3 of the 8, by brute
    force) and are priced with gcd(32, 72) = 8 per rack over 4; with 64 GPUs per rack every group lies in one
    rack (brute force again) and is priced on NVLink alone."""
    rack = load_cluster("gb200-nvl72")
    groups = [range(32 * g, 32 * g + 32) for g in range(8)]
    assert sum(len(_nodes_of(g, 72)) > 1 for g in groups) == 3
    assert all(len(_nodes_of(g, 64)) == 1 for g in groups)
    shape = lambda dims: [(d.name, d.size) for d in dims]
    packed, placed = rack.for_gpus(256), rack.with_gpus_per_node(64).for_gpus(256)
    assert shape(packed.group_dims(32)) == [("nvlink", 8), ("ib-ndr", 4)]
    assert shape(placed.group_dims(32)) == [("nvlink", 32)]
    assert (placed.nodes, placed.gpus_per_node, placed.n_devices) == (4, 64, 256)
    assert shape(placed.group_dims(8, stride=32)) == [("nvlink", 2), ("ib-ndr", 4)]  # 2 per rack over 4 racks
    assert placed.dim_between(63, 64).name == "ib-ndr" and placed.dim_between(62, 63).name == "nvlink"


def test_a_placed_node_keeps_its_share_of_sockets_and_its_figures() -> None:
    """36 Grace for 72 GPUs become 32 for 64: still two GPUs per Grace, so each GPU's offload path, its
    bandwidths and its peak are the full rack's."""
    rack = load_cluster("gb200-nvl72")
    placed = rack.with_gpus_per_node(64)
    node = placed.node_system()
    assert (len(node.devices), len(node.memories)) == (64, 32)  # 64 GPUs, 32 Grace memories
    for figure in ("offload_bytes_per_s", "prefetch_bytes_per_s", "pool_bytes"):
        assert getattr(placed.offload, figure) == pytest.approx(getattr(rack.offload, figure))
    assert placed.dims[0].bytes_per_s == rack.dims[0].bytes_per_s and placed.device == rack.device
    assert placed.name == "gb200-nvl72 (64 GPUs per node)" and rack.with_gpus_per_node(72) is rack


@pytest.mark.parametrize("gpus, message", [
    (0, r"gpus_per_node: got 0; must be an integer in 1\.\.72"),
    (73, r"gpus_per_node: got 73; must be an integer in 1\.\.72"),
    (63, r"gpus_per_node: got 63; must keep whole sockets \(36 per 72 GPUs\)"),
])
def test_bad_gpus_per_node_is_a_one_line_error(gpus: int, message: str) -> None:
    with pytest.raises(HardwareError, match=message) as info:
        load_cluster("gb200-nvl72").with_gpus_per_node(gpus)
    assert "\n" not in str(info.value)


def test_placement_equals_the_variant_file_written_by_hand() -> None:
    """``with_gpus_per_node(64)`` is the ``extends: gb200-nvl72`` variant with 64 GPUs and 32 Grace per node
    (``docs/hardware-format.md``): the same fabric dimensions, groups and offload figures at 256 GPUs."""
    by_hand = cluster_from_dict({"format": "mcdla-system/1", "extends": "gb200-nvl72", "name": "segment",
                                 "node": {"gpus": 64, "sockets": {"count": 32}}}).for_gpus(256)
    placed = load_cluster("gb200-nvl72").with_gpus_per_node(64).for_gpus(256)
    assert placed.dims == by_hand.dims and placed.group_dims(16, stride=4) == by_hand.group_dims(16, stride=4)
    for figure in ("offload_bytes_per_s", "prefetch_bytes_per_s", "pool_bytes", "latency_s"):
        assert getattr(placed.offload, figure) == getattr(by_hand.offload, figure)


@pytest.mark.parametrize(("size", "stride"), [(2, 8), (4, 8), (2, 16), (3, 8), (9, 4), (32, 1)])
def test_a_job_in_one_rack_prices_every_group_on_nvlink(size: int, stride: int) -> None:
    """A job of 32 or fewer ranks in one NVL72 rack: every group ``r, r + stride, ...`` lies in the rack (brute
    force over the groups that fit), so it is priced on NVLink alone, whether or not ``stride`` tiles the 72 GPUs."""
    gpus = 32 if size * stride <= 32 else size * stride
    rack = load_cluster("gb200-nvl72").for_gpus(gpus)
    groups = [range(r, r + size * stride, stride) for r in range(gpus - (size - 1) * stride)]
    assert rack.nodes == 1 and all(len(_nodes_of(g, 72)) == 1 for g in groups)
    assert [(d.name, d.size) for d in rack.group_dims(size, stride)] == [("nvlink", size)]
