"""The 2018 presets as node templates: their expansion against the explicit graphs they replace (kept in
tests/hardware/data), their closed-form paths against hand counts, and one-line errors for the template fields
that wire them (scale_up.topology, sockets.pcie_switch, memory_nodes.placement)."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from mcdla.errors import HardwareError
from mcdla.hardware import Cluster, System, load_cluster, preset_names
from mcdla.hardware.cluster import cluster_from_dict
from mcdla.hardware.io import explicit_system, read_system_document
from mcdla.hardware.traffic import routed_offload_link

DATA = Path(__file__).parent / "data"
PRESETS_2018 = ("dc-dla", "oracle", "mc-dla", "mc-dla-1n", "hc-dla")
SRC = Path(__file__).resolve().parents[2] / "src" / "mcdla"


def _graph(name: str) -> System:
    """The explicit graph a 2018 preset was before it became a template (an independent description)."""
    return explicit_system(yaml.safe_load((DATA / f"{name}-graph.yaml").read_text()), where=name)


def _figures(x):
    """Every field of a System but the free-text ones (sources, description), lists kept in order."""
    if dataclasses.is_dataclass(x):
        return {f.name: _figures(getattr(x, f.name)) for f in dataclasses.fields(x)
                if f.name not in ("source", "description")}
    if isinstance(x, (tuple, list)):
        return [_figures(v) for v in x]
    if isinstance(x, dict):
        return {k: _figures(v) for k, v in x.items()}
    return x


def test_every_preset_loads_as_a_generated_cluster() -> None:
    """Every bundled preset is a node template: it loads as a Cluster that is not an explicit graph, and its
    node expands to the engine's System."""
    for name in preset_names():
        c = load_cluster(name)
        assert isinstance(c, Cluster) and not c.explicit, name
        node = c.node_system()
        assert isinstance(node, System) and node.name == name and len(node.devices) == c.gpus_per_node
        data, _where = read_system_document(name)
        assert "node" in data or "extends" in data, name


@pytest.mark.parametrize("name", PRESETS_2018)
def test_expansion_is_the_old_graph_link_by_link(name: str) -> None:
    """Devices, memories, switches, links (ends, bandwidth, latency, kind, in order), pools and rings of the
    generated preset equal the explicit graph it replaces."""
    new, old = load_cluster(name).expand(), _graph(name)
    assert [d.name for d in new.devices] == [d.name for d in old.devices]
    for a, b in zip(new.links, old.links, strict=True):
        assert (a.a, a.b, a.bytes_per_s, a.latency_s, a.kind) == (b.a, b.b, b.bytes_per_s, b.latency_s, b.kind)
    assert new.pools == old.pools and new.rings == old.rings
    assert _figures(new) == _figures(old)


@pytest.mark.slow
def test_reproduction_times_are_bit_identical_to_the_old_graphs() -> None:
    """Every workload x parallelism of the reproduction matrix, the four variants' settings and the compute x PCIe
    sweep's dc-dla systems: the same iteration time (==, not approx) on the generated preset as on the explicit
    graph it replaces."""
    from mcdla.report.experiments import COMPUTE_SCALES, PCIE_GENERATIONS, run_one, sweep_system
    from mcdla.workload import zoo

    workloads = [zoo.build(n, precision="fp16", saves="cudnn") for n in zoo.names()]
    for name in PRESETS_2018:
        new, old = load_cluster(name).expand(), _graph(name)
        for w in workloads:
            for parallel in ("data", "model"):
                assert run_one(new, w, parallel=parallel).iteration_time_s == \
                    run_one(old, w, parallel=parallel).iteration_time_s, (name, w.name, parallel)
    fp32 = [zoo.build(n, precision="fp32", saves="cudnn") for n in zoo.names()]
    for name in ("dc-dla", "mc-dla"):
        new, old = load_cluster(name).expand(), _graph(name)
        for w in fp32:
            assert run_one(new, w, parallel="data").iteration_time_s == run_one(old, w, parallel="data").iteration_time_s
        for w in workloads[:3]:
            for policy, planner in (("conv", None), ("all", "lp")):
                assert run_one(new, w, parallel="data", policy=policy, planner=planner).iteration_time_s == \
                    run_one(old, w, parallel="data", policy=policy, planner=planner).iteration_time_s
    dc_new, dc_old = load_cluster("dc-dla").expand(), _graph("dc-dla")
    for scale in (COMPUTE_SCALES[0], COMPUTE_SCALES[-1]):
        for gen in PCIE_GENERATIONS:
            for w in workloads:
                assert run_one(sweep_system(dc_new, scale, gen), w, parallel="data").iteration_time_s == \
                    run_one(sweep_system(dc_old, scale, gen), w, parallel="data").iteration_time_s


def test_closed_form_paths_by_hand() -> None:
    """Hand counts from the presets' figures: dc-dla, two GPUs per 12.8 GB/s switch uplink, 6.4 GB/s each; mc-dla,
    two 75 GB/s ring links, 150 GB/s (75 with one neighbour); hc-dla, a GPU's own 75 GB/s NVLink to its socket
    (170 GB/s DDR4 over two GPUs is 85). Scale-up per GPU: the mesh's six 25 GB/s lanes, the ring's two 75 GB/s
    links, hc-dla's ring hop through the 32 GB/s X-bus carrying half a GPU's data."""
    for name, offload in (("dc-dla", 6.4e9), ("mc-dla", 150e9), ("mc-dla-1n", 75e9), ("hc-dla", 75e9)):
        c = load_cluster(name)
        assert c.pool_link().offload_bytes_per_s == pytest.approx(offload, rel=1e-12), name
        assert c.pool_link().offload_bytes_per_s == pytest.approx(
            routed_offload_link(c.expand()).offload_bytes_per_s, rel=1e-12), name
    for name, up in (("dc-dla", 150e9), ("mc-dla", 150e9), ("hc-dla", 64e9)):
        assert load_cluster(name).scale_up.bytes_per_s == pytest.approx(up, rel=1e-12), name
    assert load_cluster("oracle").device.hbm_bytes == float("inf")
    assert load_cluster("mc-dla").pool_link().pool_bytes == pytest.approx(1.3e12)


_HOST = {"kind": "host", "capacity": "100GB", "dram_bandwidth": "40GB/s", "source": "t"}
_PCIE = {"kind": "pcie", "bandwidth": "16GB/s", "latency": "1us", "source": "t"}


def _variant(preset: str, **node) -> dict:
    data, _where = read_system_document(preset)
    data = copy.deepcopy(data)
    for key, value in node.items():
        *parents, last = key.split("__")
        d = data["node"]
        for p in parents:
            d = d[p]
        d[last] = value
    return data


@pytest.mark.parametrize("data", [
    _variant("mc-dla", gpus=4, memory_nodes__count=4,
             sockets={"count": 2, "memory": _HOST, "gpu_link": _PCIE, "source": "t"}),
    _variant("mc-dla-1n", gpus=3, memory_nodes__count=3),
    _variant("hc-dla", sockets__count=1),
    _variant("hc-dla", sockets__count=2),
    _variant("dc-dla", sockets__pcie_switch__shared_by=4),
    _variant("dc-dla", expanders={"per_socket": 2, "memory": _HOST, "link": _PCIE, "source": "t"}),
], ids=["ring-with-sockets", "ring-of-3-next", "host-centric-1-socket", "host-centric-2-sockets",
        "mesh-4-per-switch", "mesh-with-expanders"])
def test_wired_variants_closed_form_equals_routed_max_min(data: dict) -> None:
    """Variants of the 2018 nodes (rings with host memory too, host-centric nodes of 1 or 2 sockets, 4 GPUs per PCIe
    switch, CXL behind the DGX-1's sockets): the offload link from the GPU's routes equals the flow drain of
    mcdla.sim.pool_link on the expansion, both directions and their sharing included."""
    from mcdla.sim import pool_link

    c = cluster_from_dict(data, where="variant")
    a, b = c.pool_link(), pool_link(c.expand())
    assert a.offload_bytes_per_s == pytest.approx(b.offload_bytes_per_s, rel=1e-9)
    assert a.prefetch_bytes_per_s == pytest.approx(b.prefetch_bytes_per_s, rel=1e-9)
    assert a.shared_direction == b.shared_direction and a.pool_bytes == pytest.approx(b.pool_bytes)
    assert c.without_offload().offload is None and c.without_offload().expand().pools == {}


def test_an_explicit_graph_file_loads_as_a_one_node_cluster() -> None:
    """A file listing its devices is a Cluster whose node is that graph: expand() gives it back as listed, its offload
    is the closed form over its routes, and the LLM model's fabric dimensions are refused in one line."""
    c = load_cluster(DATA / "mc-dla-graph.yaml")
    assert c.explicit and c.nodes == 1 and c.gpus_per_node == 8 and c.dims == ()
    assert c.expand() == _graph("mc-dla")
    assert c.pool_link().offload_bytes_per_s == pytest.approx(routed_offload_link(_graph("mc-dla")).offload_bytes_per_s)
    assert c.without_offload().offload is None and c.without_offload().expand().pools == {}
    with pytest.raises(HardwareError, match=r"an explicit graph \(devices listed\); must be a generator") as info:
        c.generated()
    assert "\n" not in str(info.value)


def test_no_module_outside_hardware_and_sim_builds_a_system_from_a_file() -> None:
    """Files (and the probed machine's document) become Systems only through Cluster (hardware/): no package but
    hardware/ and sim/ (the engine, which derives graphs) calls the System constructor or the explicit-graph parser."""
    builders = {"explicit_system", "_SystemSpec"}
    built: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("hardware/", "sim/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in builders or name == "System":
                    built.setdefault(rel, []).append(name)
            if isinstance(node, ast.ImportFrom):
                assert not builders & {a.name for a in node.names}, rel
    assert built == {}


def _dc() -> dict:
    data, _where = read_system_document("dc-dla")
    return copy.deepcopy(data)


def _with(data: dict, path: str, value) -> dict:
    """``data`` with the dotted ``path`` set to ``value`` (None deletes it)."""
    *parents, last = path.split(".")
    d = data
    for p in parents:
        d = d[p]
    if value is None:
        d.pop(last)
    else:
        d[last] = value
    return data


def _mc() -> dict:
    data, _where = read_system_document("mc-dla")
    return copy.deepcopy(data)


@pytest.mark.parametrize("data, message", [
    (_with(_dc(), "node.scale_up.topology", "torus"),
     "node.scale_up.topology: got 'torus'; must be 'switch', 'hybrid-cube-mesh', 'memory-node-ring' or 'host-centric'"),
    (_with(_dc(), "node.gpus", 4), "node.gpus: got 4; a hybrid-cube-mesh has 8 GPUs"),
    (_with(_dc(), "node.sockets.pcie_switch.shared_by", 3),
     "node.sockets.pcie_switch.shared_by: got 3; must divide the GPUs of each socket (8 GPUs over 2 sockets)"),
    (_with(_dc(), "node.sockets.pcie_switch.shared_by", 0), "node.sockets.pcie_switch.shared_by: got 0; must be greater"),
    (_with(_dc(), "node.sockets.pcie_switch.source", None), "node.sockets.pcie_switch.source: missing"),
    (_with(_dc(), "scale_out", {"nodes": 2, "bandwidth": "25GB/s", "source": "t"}),
     "scale_out: got a scale-out fabric; a hybrid-cube-mesh node is one node"),
    (_with(_mc(), "node.memory_nodes.count", 4),
     "node.memory_nodes.count: got 4; a memory-node-ring has one memory-node per GPU (8)"),
    (_with(_mc(), "node.memory_nodes.placement", "all"),
     "node.memory_nodes.placement: got 'all'; must be 'both-neighbours' or 'next' on a memory-node-ring"),
    (_with(_mc(), "node.memory_nodes.placement", "nearest"), "node.memory_nodes.placement: got 'nearest'; must be"),
    (_with(_mc(), "node.memory_nodes.link", {"bandwidth": "75GB/s", "source": "t"}),
     "node.memory_nodes.link: got a link; on a memory-node-ring the ring links are node.scale_up's"),
    (_with(_with(_with(_mc(), "node.scale_up.topology", "switch"), "node.memory_nodes.placement", "next"),
           "node.memory_nodes.link", {"bandwidth": "75GB/s", "source": "t"}),
     "node.memory_nodes.placement: got 'next'; must be 'all' on a scale-up switch"),
    (_with(_with(_mc(), "node.scale_up.topology", "switch"), "node.memory_nodes.placement", None),
     "node.memory_nodes.link: missing; memory-nodes on a scale-up switch need their link to it"),
    (_with(_mc(), "node.scale_up.topology", "host-centric"), "node.sockets: missing; a host-centric node's GPUs"),
])
def test_template_errors_are_one_line(data: dict, message: str) -> None:
    """Bad values of the fields that wire the 2018 nodes fail with one line naming the field, the value and what
    is allowed."""
    with pytest.raises(HardwareError) as info:
        cluster_from_dict(data, where="f")
    text = str(info.value)
    assert message in text and "\n" not in text, text
