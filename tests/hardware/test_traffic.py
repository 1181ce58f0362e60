"""Traffic-class paths of generated nodes and their closed-form offload link, against the routed max-min
computation of the event engine's flows (mcdla.sim.pool_link) and hand counts from the presets' figures."""

import dataclasses
import time

import pytest

from mcdla.errors import HardwareError
from mcdla.hardware.cluster import cluster_from_dict, load_cluster
from mcdla.hardware.io import load_system, preset_names
from mcdla.hardware.traffic import offload_link, routed_offload_link
from mcdla.sim import pool_link

PRESETS_2018 = ("dc-dla", "hc-dla", "mc-dla", "mc-dla-1n", "oracle")
GENERATED = preset_names()  # every preset is a node template, the 2018 ones included


def _same(a, b) -> bool:
    close = lambda x, y: x == pytest.approx(y, rel=1e-9)
    return (close(a.offload_bytes_per_s, b.offload_bytes_per_s) and close(a.prefetch_bytes_per_s, b.prefetch_bytes_per_s)
            and close(a.latency_s, b.latency_s) and close(a.pool_bytes, b.pool_bytes)
            and a.shared_direction == b.shared_direction)


# The 72-GPU memory-node rack (~3 s) runs in the slow suite; its 8- and 1-GPU jobs
# (test_paths_of_a_partly_used_node_...) and the small memory-node nodes below run in the default suite.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "gb200-nvl72-memnode" else n
                                  for n in GENERATED])
def test_closed_form_equals_routed_max_min_on_every_generated_preset(name) -> None:
    """Cluster.offload (closed form over one GPU's path) equals sim.pool_link on the expanded node: bandwidth
    each way, direction sharing, latency and pool share."""
    c = load_cluster(name)
    assert _same(c.pool_link(), pool_link(c.node_system()))
    assert _same(c.pool_link(), routed_offload_link(c.node_system()))


@pytest.mark.parametrize("name", PRESETS_2018)
def test_closed_form_over_routes_equals_routed_max_min_on_the_2018_presets(name) -> None:
    """The explicit 2018 systems (dc-dla: two GPUs per PCIe switch uplink, 6.4 GB/s each; mc-dla: memory-nodes on
    the NVLink rings): the closed form over their routes equals the flow drain, directions included."""
    system = load_system(name)
    assert _same(routed_offload_link(system), pool_link(system))


@pytest.mark.parametrize("gpus, sockets, expanders, memory_nodes, dram, shared_by", [
    (4, 1, 0, 0, "40GB/s", 0), (4, 2, 1, 0, "inf", 0), (6, 3, 2, 0, "30GB/s", 0), (4, 0, 0, 2, "50GB/s", 0),
    (8, 2, 0, 4, "200GB/s", 0), (2, 1, 3, 1, "20GB/s", 0), (4, 1, 0, 0, "inf", 2), (4, 2, 1, 0, "inf", 2),
    (8, 2, 0, 4, "200GB/s", 4)])
def test_closed_form_equals_routed_max_min_on_small_nodes(gpus, sockets, expanders, memory_nodes, dram,
                                                          shared_by) -> None:
    """Small nodes mixing host memory, CXL expanders, memory-nodes whose DRAM binds or not and PCIe switches
    shared by ``shared_by`` GPUs: the closed form and the flow drain agree, including whether the two directions
    share."""
    mem = lambda kind: {"kind": kind, "capacity": "100GB", "dram_bandwidth": dram, "source": "t"}
    link = lambda bw: {"kind": "pcie", "bandwidth": bw, "latency": "1us", "source": "t"}
    node = {"gpus": gpus, "source": "t", "gpu": {"peak_flops_per_s": {"bf16": 1e15}, "hbm": "80GB",
                                                 "hbm_bandwidth": "3TB/s", "source": "t"},
            "scale_up": {"bandwidth": "100GB/s", "latency": "2us", "source": "t"}}
    if sockets:
        node["sockets"] = {"count": sockets, "memory": mem("host"), "gpu_link": link("32GB/s"), "source": "t"}
        if shared_by:
            node["sockets"]["pcie_switch"] = {"shared_by": shared_by, "source": "t"}
    if expanders:
        node["expanders"] = {"per_socket": expanders, "memory": mem("host"), "link": link("16GB/s"), "source": "t"}
    if memory_nodes:
        node["memory_nodes"] = {"count": memory_nodes, "memory": mem("memory-node"), "link": link("60GB/s"),
                                "source": "t"}
    c = cluster_from_dict({"format": "mcdla-system/1", "name": "small", "node": node})
    assert _same(c.pool_link(), pool_link(c.expand()))


@pytest.mark.parametrize(("name", "gpus"), [("gb200-nvl72-memnode", 8), ("gb200-nvl72-memnode", 1),
                                           ("dgx-h100", 2), ("dgx-h100", 6), ("dgx-h100-cxl", 3), ("dgx-a100", 5),
                                           ("gb200-nvl72", 4), ("dc-dla", 1), ("dc-dla", 3), ("mc-dla", 2)])
def test_paths_of_a_partly_used_node_equal_routed_max_min_over_the_gpus_in_use(name, gpus) -> None:
    """A job of fewer GPUs than a node (ranks on GPUs 0 .. gpus - 1): Cluster.paths_for_gpus' offload path gives
    the bandwidth each way, direction sharing and latency of the routed max-min computation on the expanded node
    where only those GPUs have a pool; 8 GPUs of the memory-node rack spread their copies over 36 memory-node
    links of 600 GB/s (2.7 TB/s each), so their 900 GB/s NVLink port binds, where the whole rack gets 300 GB/s."""
    c = load_cluster(name)
    system = c.node_system()
    used = {d.name: system.pools[d.name] for d in system.devices[:gpus] if d.name in system.pools}
    partial = dataclasses.replace(system, pools=used)
    got = offload_link(c.paths_for_gpus(gpus)[0], pool_bytes=1.0, source="")
    for want in (routed_offload_link(partial), pool_link(partial)):
        close = lambda x, y: x == pytest.approx(y, rel=1e-9)
        assert close(got.offload_bytes_per_s, want.offload_bytes_per_s)
        assert close(got.prefetch_bytes_per_s, want.prefetch_bytes_per_s)
        assert close(got.latency_s, want.latency_s) and got.shared_direction == want.shared_direction
    if name == "gb200-nvl72-memnode":
        assert got.offload_bytes_per_s == pytest.approx(900e9) and c.offload.offload_bytes_per_s == pytest.approx(300e9)
    assert c.paths_for_gpus(c.gpus_per_node) is c.paths and c.paths_for_gpus(gpus) is c.paths_for_gpus(gpus)
    with pytest.raises(HardwareError, match=r"paths_for_gpus: got 0; must be an integer >= 1"):
        c.paths_for_gpus(0)


def test_direction_sharing_by_hand() -> None:
    """gh200: C2C 450 GB/s each way, both at once 900 GB/s against 500 GB/s of LPDDR5X shared by reads and writes:
    each direction 250 GB/s, 1.8x the one-way time (> 1.5x): shared. dgx-h100: 4 GPUs x 51.2 GB/s x 2 = 409.6 GB/s
    against 307.2 GB/s of DDR5 per socket: 38.4 GB/s each, 1.33x: not shared (the PCIe links are full duplex)."""
    gh = load_cluster("gh200").path("offload")
    assert gh.bytes_per_s() == pytest.approx(450e9) and gh.bytes_per_s(both_directions=True) == pytest.approx(250e9)
    assert load_cluster("gh200").offload.shared_direction
    h = load_cluster("dgx-h100").path("offload")
    assert h.bytes_per_s(both_directions=True) == pytest.approx(307.2e9 / 8)
    assert not load_cluster("dgx-h100").offload.shared_direction


def test_paths_name_the_links_each_traffic_class_shares() -> None:
    """DGX H100: the GPU's PCIe x16 carries both its offloads and its NIC's RDMA; memory-nodes: offloads cross the
    GPU's NVLink port that its scale-up collectives use; GB200: offloads cross C2C only, not NVLink."""
    def names(cluster, traffic):
        return {r.resource for r in cluster.path(traffic).resources}
    h = load_cluster("dgx-h100")
    assert ("link", "gpu0", "cpu0") in names(h, "offload") & names(h, "scale-out")
    m = load_cluster("gb200-nvl72-memnode")
    port = ("link", "gpu0", "nvswitch")
    assert port in names(m, "offload") & names(m, "scale-up")
    (share,) = [r for r in m.path("offload").resources if r.resource == port]
    assert share.fraction == 1.0 and share.sharers == 1
    memnode = [r for r in m.path("offload").resources if r.resource == ("link", "nvswitch", "mem0")]
    assert memnode[0].sharers == 72 and memnode[0].fraction == pytest.approx(1 / 36)
    g = load_cluster("gb200-nvl72")
    assert port not in names(g, "offload") and ("link", "gpu0", "nvswitch") in names(g, "scale-up")


def test_a_node_of_16384_gpus_is_priced_in_well_under_a_second() -> None:
    """A generator file with 16,384 GPUs on one switch and 36 memory-nodes: closed form, no routing; each GPU's
    share of 36 x 600 GB/s is 36 x 600 / 16384 GB/s."""
    base = load_cluster("gb200-nvl72-memnode")._spec.model_dump(exclude_none=True)
    base["node"]["gpus"] = 16384
    base["node"]["sockets"]["count"] = 8192
    t0 = time.perf_counter()
    c = cluster_from_dict(base)
    assert time.perf_counter() - t0 < 1.0
    assert c.offload.offload_bytes_per_s == pytest.approx(36 * 600e9 / 16384)


def test_unknown_traffic_class_is_one_line() -> None:
    """Asking for a class the node lacks names the classes it has."""
    with pytest.raises(HardwareError, match=r"traffic class got 'offload'; has scale-up"):
        load_cluster("gb200-nvl72").without_offload().path("offload")


def test_nic_behind_the_gpu_link_only_where_the_file_says() -> None:
    """scale_out.via_gpu_link puts the GPU's socket link on the scale-out path of DGX A100/H100 (and the presets
    extending dgx-h100); Grace-based nodes reach their NIC without crossing C2C."""
    for name, via in (("dgx-a100", True), ("dgx-h100", True), ("dc-dla-2026", True), ("gh200", False),
                      ("gb200-nvl72", False)):
        resources = [r.resource for r in load_cluster(name).path("scale-out").resources]
        assert (("link", "gpu0", "cpu0") in resources) == via, name


def test_sizing_and_dropping_the_pool() -> None:
    """for_gpus takes the fewest whole nodes; without_offload keeps everything but the pool and says so in the
    name; a bad GPU count is one line."""
    c = load_cluster("gb200-nvl72")
    assert c.for_gpus(73).nodes == 2 and c.for_gpus(72).nodes == 1
    bare = c.without_offload()
    assert bare.offload is None and bare.name == "gb200-nvl72 (no offload)" and bare.device == c.device
    assert [p.traffic for p in bare.paths] == ["scale-up", "scale-out"]
    with pytest.raises(HardwareError, match=r"gpus: got 0; must be an integer"):
        c.for_gpus(0)
