"""Modern presets (the 2026 systems): they load, every figure has a source, and the generated structure has the counts,
bandwidths and pools the hardware has (checked against the figures recomputed here by hand)."""

from __future__ import annotations

import math
import re
from importlib import resources

import pytest
import yaml

from mcdla.errors import HardwareError
from mcdla.hardware import (LinkKind, MemoryKind, Topology, load_cluster, load_system, preset_names, save_system,
                            system_from_dict)

MODERN = ("dgx-a100", "dgx-h100", "dgx-h100-ndr", "h200", "gh200", "dgx-gh200", "gb200-nvl72", "gb200-nvl72-memnode",
          "dgx-h100-cxl", "dc-dla-2026", "b200", "gb300-nvl72")
_QUANTITY = re.compile(r"^[+-]?\d+(\.\d+)?([eE][+-]?\d+)?\s*[A-Za-z/]*$")


def _raw(name: str) -> dict:
    return yaml.safe_load(resources.files("mcdla.hardware.presets").joinpath(f"{name}.yaml").read_text())


def test_modern_presets_are_bundled() -> None:
    """Every preset the issue asks for is bundled next to the paper's five."""
    assert set(MODERN) <= set(preset_names())


def _unsourced(node: object, path: str, inherited: bool) -> list[str]:
    """Paths of numeric figures with no source in their own mapping (or, for peak_flops_per_s, its device's)."""
    bad: list[str] = []
    if isinstance(node, dict):
        has = isinstance(node.get("source"), str) and bool(node["source"].strip())
        for key, value in node.items():
            if key in ("format", "name", "description", "extends", "source", "switch_source"):
                continue
            if isinstance(value, (dict, list)):
                bad += _unsourced(value, f"{path}.{key}", has and key == "peak_flops_per_s")
            elif (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                    isinstance(value, str) and _QUANTITY.match(value)):
                if not (has or inherited):
                    bad.append(f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            bad += _unsourced(item, f"{path}[{i}]", inherited)
    return bad


@pytest.mark.parametrize("name", MODERN)
def test_every_numeric_field_has_a_source(name: str) -> None:
    """In the file: every number or quantity sits in a mapping with a non-empty source (peak_flops_per_s: in its
    gpu's); after expansion every device, memory, switch and link, and every fabric dimension,
    has one."""
    assert _unsourced(_raw(name), name, False) == []
    system = load_system(name)
    for item in (*system.devices, *system.memories, *system.switches, *system.links):
        assert item.source.strip(), f"{name}: {item} has no source"
    for dim in load_cluster(name).dims:
        assert dim.source.strip()


def test_source_check_catches_a_missing_source() -> None:
    """The walker above is not vacuous: a link figure without a source is reported."""
    raw = _raw("dgx-h100")
    del raw["node"]["sockets"]["gpu_link"]["source"]
    assert _unsourced(raw, "x", False) == ["x.node.sockets.gpu_link.bandwidth", "x.node.sockets.gpu_link.latency"]


def test_ndr_cluster_is_128_generated_dgx_nodes() -> None:
    """dgx-h100-ndr: 128 nodes x 8 GPUs = 1,024 devices, 128 NVSwitches, 256 socket memories, one 50 GB/s rail per
    GPU to the fat-tree switch, 8 rail-aligned rings; the same as dgx-h100 generated with nodes=128."""
    c = load_cluster("dgx-h100-ndr")
    assert (c.nodes, c.gpus_per_node, c.n_devices) == (128, 8, 1024)
    assert [(d.name, d.size) for d in c.dims] == [("nvlink", 8), ("ib-ndr", 128)]
    assert c.dims[1].bytes_per_s == 400e9 / 8  # NDR 400 Gb/s per port
    s = load_system("dgx-h100-ndr")
    assert len(s.devices) == 1024 and len({d.name for d in s.devices}) == 1024
    assert sum(sw.name.endswith(".nvswitch") for sw in s.switches) == 128
    assert sum(m.kind is MemoryKind.HOST for m in s.memories) == 256
    rails = [l for l in s.links if "ib-ndr" in (l.a, l.b)]
    assert len(rails) == 1024 and {l.bytes_per_s for l in rails} == {50e9} and {l.kind for l in rails} == {LinkKind.NETWORK}
    assert len(s.rings) == 8
    same = load_cluster("dgx-h100", nodes=128).expand()
    assert same.device_names == s.device_names and len(same.links) == len(s.links)


def test_ndr_rings_use_every_rail_once_each_way() -> None:
    """NOTE [generated rings]: over the 8 rings every GPU's rail carries exactly one ring step out and one in."""
    s = load_cluster("dgx-h100", nodes=4).expand()
    topo = Topology(s)
    out: dict[str, int] = {}
    into: dict[str, int] = {}
    for r in range(topo.ring_count):
        for _, _, route in topo.ring_hops(r):
            for res in route.resources:
                if res[2] == "ib-ndr":
                    out[res[1]] = out.get(res[1], 0) + 1
                if res[1] == "ib-ndr":
                    into[res[2]] = into.get(res[2], 0) + 1
    assert out == {d: 1 for d in s.device_names} and into == {d: 1 for d in s.device_names}


def test_nvl72_is_one_nvlink_domain_of_72() -> None:
    """gb200-nvl72: 72 GPUs, each with one 900 GB/s-per-direction port into the one NVLink switch, every pair two hops
    apart through it; 36 Grace memories of 480 GB, each the pool of exactly two GPUs."""
    c = load_cluster("gb200-nvl72")
    assert c.n_devices == 72 and c.scale_up is not None and c.scale_up.size == 72
    assert c.scale_up.bytes_per_s == 1.8e12 / 2
    s = load_system("gb200-nvl72")
    nvlinks = [l for l in s.links if l.kind is LinkKind.NVLINK]
    assert len(nvlinks) == 72 and all("nvswitch" in (l.a, l.b) and l.bytes_per_s == 900e9 for l in nvlinks)
    topo = Topology(s)
    assert [r[2] for r in topo.route("gpu0", "gpu71").resources] == ["nvswitch", "gpu71"]
    graces = [m for m in s.memories if m.kind is MemoryKind.HOST]
    assert len(graces) == 36 and {m.capacity_bytes for m in graces} == {480e9}
    users: dict[str, int] = {}
    for pool in s.pools.values():
        for m in pool:
            users[m] = users.get(m, 0) + 1
    assert set(users.values()) == {2} and len(users) == 36
    assert len(s.rings) == 1  # one NVLink domain, one ring through the switch


def test_gh200_c2c_is_450_per_direction_to_480gb_lpddr5x() -> None:
    """gh200: each GPU reaches its Grace's 480 GB LPDDR5X over NVLink-C2C at 450 GB/s per direction (900 bidir); with
    one GPU per Grace the C2C, not the ~500 GB/s LPDDR5X, bounds offload."""
    s = load_system("gh200")
    topo = Topology(s)
    (route,) = topo.pool_routes("n0.gpu0")
    assert route.bottleneck_bytes_per_s == 900e9 / 2
    assert s.memory(route.dst).capacity_bytes == 480e9
    assert topo.link("n0.gpu0", "n0.cpu0").kind is LinkKind.CPU_INTERCONNECT
    link = load_cluster("gh200").pool_link()
    assert link.offload_bytes_per_s == pytest.approx(450e9) and link.pool_bytes == 480e9


def test_pool_link_when_every_gpu_offloads() -> None:
    """Cluster.pool_link, recomputed by hand: DGX H100 PCIe 0.8 x 64 = 51.2 GB/s (4 x 51.2 < 307.2 socket DDR5);
    GB200 two GPUs share 500 GB/s of LPDDR5X -> 250; memnode 36 x 600 GB/s over 72 GPUs -> 300; CXL even
    interleave over DDR5 and four 25.6 GB/s x8 cards: each card link carries 4 GPUs x 1/5 -> 25.6 / 0.8 = 32 GB/s
    (slower than without them: even interleaving runs at the slowest memory's pace)."""
    expected = {"dgx-h100": 51.2e9, "dc-dla-2026": 51.2e9, "dgx-a100": 25.6e9, "gb200-nvl72": 250e9,
                "gb200-nvl72-memnode": 300e9, "dgx-h100-cxl": 32e9}
    for name, bw in expected.items():
        assert load_cluster(name).pool_link().offload_bytes_per_s == pytest.approx(bw, rel=1e-9), name
    assert load_cluster("dgx-h100-cxl").pool_link().pool_bytes == pytest.approx(1e12 / 4 + 4 * 256e9 / 4)
    assert load_cluster("gb200-nvl72-memnode").pool_link().pool_bytes == pytest.approx(36 * 2e12 / 72)


def test_memnode_variant_is_marked_hypothetical_and_pools_over_nvlink() -> None:
    """gb200-nvl72-memnode: 36 memory-nodes on the NVLink switch, every GPU's pool is all of them (not Grace), and
    the description and every memory-node figure say HYPOTHETICAL."""
    s = load_system("gb200-nvl72-memnode")
    nodes = [m for m in s.memories if m.kind is MemoryKind.MEMORY_NODE]
    assert len(nodes) == 36 and all("HYPOTHETICAL" in m.source for m in nodes)
    assert "HYPOTHETICAL" in s.description
    assert all(set(p) == {m.name for m in nodes} for p in s.pools.values())
    topology = Topology(s)
    assert all(topology.link(m.name, "nvswitch").bytes_per_s == 600e9 for m in nodes)


def test_variants_change_only_what_they_say() -> None:
    """extends: h200 is dgx-h100 with 141 GB / 4.8 TB/s GPUs; dc-dla-2026 is dgx-h100 by design (PCIe Gen5 at
    0.8 x 64 GB/s, the DMA efficiency in the source); dgx-h100-cxl adds 4 expanders per socket at 25.6 GB/s per
    direction (0.8 x 32), 36 GB/s DRAM."""
    base = load_system("dgx-h100")
    h200 = load_system("h200")
    assert h200.links == base.links and h200.device("gpu3").hbm_bytes == 141e9
    assert h200.device("gpu3").hbm_bytes_per_s == 4.8e12
    assert h200.device("gpu3").peak_flops_per_s == base.device("gpu3").peak_flops_per_s
    dc = load_system("dc-dla-2026")
    assert [(l.a, l.b, l.bytes_per_s) for l in dc.links] == [(l.a, l.b, l.bytes_per_s) for l in base.links]
    pcie = {l.bytes_per_s for l in dc.links if l.kind is LinkKind.PCIE}
    assert pcie == {0.8 * 64e9} and all("0.8 DMA" in l.source for l in dc.links if l.kind is LinkKind.PCIE)
    cxl = load_system("dgx-h100-cxl")
    assert cxl.pools["gpu0"] == ("host0", "cxl0_0", "cxl0_1", "cxl0_2", "cxl0_3")
    assert cxl.pools["gpu7"] == ("host1", "cxl1_0", "cxl1_1", "cxl1_2", "cxl1_3")
    assert Topology(cxl).link("cpu0", "cxl0_2").bytes_per_s == pytest.approx(0.8 * 32e9) and cxl.memory("cxl1_3").dram_bytes_per_s == 36e9


def test_group_dims_of_groups_that_do_not_tile_a_rack() -> None:
    """On 16 NVL72 racks a stride-8 group holds gcd(size, 72 / 8 = 9) members per rack: 12 -> 3 per rack over 4
    racks, 128 -> 1 per rack over 128 (priced across the racks, more scale-out traffic than the layout has)."""
    c = load_cluster("gb200-nvl72").with_nodes(16)
    shape = lambda dims: [(d.name, d.size) for d in dims]
    up, out = c.scale_up.name, c.scale_out.name
    assert shape(c.group_dims(12, stride=8)) == [(up, 3), (out, 4)]
    assert shape(c.group_dims(128, stride=8)) == [(out, 128)]
    assert shape(c.group_dims(9, stride=8)) == [(up, 9)]


def test_group_dims_for_parallel_groups() -> None:
    """Megatron-order groups on 128 x 8: TP 8 is the NVLink domain, DP 128 with stride 8 the rails, a group of 16
    both, TP 4 a subgroup of NVLink, a stride-2 group of 32 has 4 per node over 8 nodes; PP neighbours 8 apart
    cross the rails."""
    c = load_cluster("dgx-h100-ndr")
    shape = lambda dims: [(d.name, d.size) for d in dims]
    assert shape(c.group_dims(8)) == [("nvlink", 8)]
    assert shape(c.group_dims(128, stride=8)) == [("ib-ndr", 128)]
    assert shape(c.group_dims(16)) == [("nvlink", 8), ("ib-ndr", 2)]
    assert shape(c.group_dims(4)) == [("nvlink", 4)]
    assert shape(c.group_dims(32, stride=2)) == [("nvlink", 4), ("ib-ndr", 8)]
    assert shape(c.group_dims(1)) == []
    assert c.dim_between(0, 8).name == "ib-ndr" and c.dim_between(3, 4).name == "nvlink"
    assert c.dim_between(0, 8).size == 2
    assert shape(c.group_dims(2, stride=3)) == [("ib-ndr", 2)]  # straddles nodes: priced across them
    with pytest.raises(HardwareError, match=r"stride got 0; must be an integer >= 1"):
        c.group_dims(2, stride=0)
    with pytest.raises(HardwareError, match=r"must be at most the 1024 GPUs"):
        c.group_dims(256, stride=8)


def test_scale_to_16k_without_materialising() -> None:
    """A 16,384-GPU NVL72-style cluster (228 racks would not divide; 2,048 DGX H100 do) is a Cluster in no time."""
    c = load_cluster("dgx-h100", nodes=2048)
    assert c.n_devices == 16384 and c.dims[1].size == 2048


def test_expanded_system_round_trips() -> None:
    """An expanded preset saves as an explicit system file that loads back equal."""
    import tempfile
    from pathlib import Path

    s = load_system("gb200-nvl72-memnode")
    with tempfile.TemporaryDirectory() as d:
        save_system(s, Path(d) / "s.yaml")
        back = load_system(Path(d) / "s.yaml")
    assert back.device_names == s.device_names and back.links == s.links and back.pools == s.pools
    assert back.rings == s.rings and back.memories == s.memories


def _mini(**node_over) -> dict:
    src = "test figure"
    node = {"gpus": 2, "source": src,
            "gpu": {"peak_flops_per_s": {"fp16": "100TFLOP/s"}, "hbm": "80GB", "hbm_bandwidth": "2TB/s", "source": src},
            "scale_up": {"bandwidth": "100GB/s", "source": src}}
    node.update(node_over)
    return {"format": "mcdla-system/1", "name": "mini", "node": node}


@pytest.mark.parametrize("data,message", [
    (_mini(scale_up=None), "node.scale_up: missing; a node of 2 GPUs needs a scale-up switch"),
    (_mini(scale_up={"bandwidth": "100GB/s", "algorithm": "sharp", "source": "s"}), "node.scale_up.algorithm: got 'sharp'"),
    (_mini(scale_up={"bandwidth": "100Gb/s", "source": "s"}), "node.scale_up.bandwidth: got '100Gb/s'"),
    (_mini(gpus=0), "node.gpus: got 0"),
    (_mini(gpu={"hbm": "80GB", "hbm_bandwidth": "2TB/s", "peak_flops_per_s": {"fp16": 1e12}}), "node.gpu: source: missing"),
    (_mini(pool=["sockets"]), "node.pool: got 'sockets'; the node has no sockets"),
    (_mini(expanders={"per_socket": 1, "memory": {}, "link": {}, "source": "s"}), "node.expanders"),
    (_mini(sockets={"count": 1, "source": "s", "memory": {"kind": "host", "capacity": "1TB", "dram_bandwidth": "1TB/s"},
                    "gpu_link": {"bandwidth": "64GB/s", "source": "s"}}), "node.sockets.memory: source: missing"),
    ({**_mini(), "extends": "no-such"}, "extends: got 'no-such'; must be a preset"),
])
def test_generator_errors_are_one_line(data: dict, message: str) -> None:
    """Bad generator files fail with one line naming the field, the value and what is allowed."""
    with pytest.raises(HardwareError) as info:
        system_from_dict(data, where="f")
    text = str(info.value)
    assert message in text and "\n" not in text, text


def test_nodes_need_a_scale_out_fabric() -> None:
    """More than one node without scale_out is refused in one line."""
    c = load_cluster("dgx-h100")
    assert c.with_nodes(3).n_devices == 24
    bare = system_from_dict(_mini())  # one node, no scale_out: fine
    assert len(bare.devices) == 2 and not math.isinf(bare.links[0].bytes_per_s)
    from mcdla.hardware.cluster import cluster_from_dict

    with pytest.raises(HardwareError, match=r"nodes: got 2; must be 1 without a scale_out fabric"):
        cluster_from_dict(_mini()).with_nodes(2)
    graph = load_cluster(__file__.replace("test_modern_presets.py", "data/mc-dla-graph.yaml"))  # an explicit graph: one node
    with pytest.raises(HardwareError, match=r"nodes: got 2; must be 1 without a scale_out fabric"):
        graph.with_nodes(2)
    with pytest.raises(HardwareError, match=r"an explicit graph \(devices listed\); must be a generator"):
        graph.group_dims(2)


def test_group_dims_memo_is_per_cluster_and_checks_its_arguments() -> None:
    """group_dims remembers answers per cluster: a resized cluster recomputes (and refuses a group larger than
    itself), and a remembered (size, stride) still refuses a bool stride."""
    c = load_cluster("dgx-h100-ndr")
    assert c.group_dims(128, stride=8) == c.group_dims(128, stride=8) == (c.scale_out,)
    with pytest.raises(HardwareError, match=r"must be at most the 16 GPUs"):
        c.with_nodes(2).group_dims(128, stride=8)
    c.group_dims(8, stride=1)
    with pytest.raises(HardwareError, match=r"stride got True"):
        c.group_dims(8, stride=True)


def test_nodes_for_is_the_nodes_a_job_occupies() -> None:
    """Cluster.nodes_for gives the fewest 72-GPU nodes holding the job (brute force over 1..400) and refuses
    counts below one or past the largest system in one line naming the field."""
    cluster = load_cluster("gb200-nvl72")
    for gpus in range(1, 401):
        assert cluster.nodes_for(gpus) == min(n for n in range(1, 7) if n * 72 >= gpus)
    for bad in (0, -3, 2.5, True, 10**12):
        with pytest.raises(HardwareError, match=r"^execution\.gpus: got .*; must be an integer in 1\.\."):
            cluster.nodes_for(bad, field="execution.gpus")
