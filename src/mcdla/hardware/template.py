"""The node-template file: its schema (``node:``, ``scale_out:``, ``extends:``) and its expansion to the explicit
graph form (devices, memories, switches, links, pools, rings).

:class:`~mcdla.hardware.cluster.Cluster` is built from a validated template; :func:`expand_dict` is what
:meth:`~mcdla.hardware.cluster.Cluster.expand` lists (NOTE [generated names] and NOTE [generated rings] in
:mod:`mcdla.hardware.cluster`; a node without a scale-up switch: :mod:`mcdla.hardware.direct_topology`).
Format: ``docs/hardware-format.md``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcdla.errors import HardwareError, brief
from mcdla.hardware.direct_topology import DIRECT_TOPOLOGIES, expand_direct, gpu_links, socket_parts
from mcdla.hardware.gemm import DEFAULT_BACKWARD_RATIO, DEFAULT_FP8_FRACTION, DEFAULT_HALF_TOKENS
from mcdla.hardware.io import (LINK_BANDWIDTH, LINK_LATENCY, bandwidth_validator, capacity_validator, preset_names,
                               read_system_document)

__all__ = ["MAX_DEVICES", "is_generated", "resolve_extends", "expand_dict"]

MAX_DEVICES = 1 << 20
"""The most GPUs a template may describe (nodes x GPUs per node)."""
_Quantity = str | float | int
_Algorithm = Literal["ring", "tree", "in-network"]


def is_generated(data: Any) -> bool:
    """Whether a parsed system file is a generator (``node:`` or ``extends:``) rather than an explicit listing."""
    return isinstance(data, dict) and ("node" in data or "extends" in data)


_MAX_EXTENDS = 8


def _merge(base: Any, over: Any) -> Any:
    """``over`` laid onto ``base``: mappings merge key by key, anything else (lists included) replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    return over


def resolve_extends(data: dict[str, Any], where: str, depth: int = 0) -> dict[str, Any]:
    """A generator with ``extends: PRESET`` as the preset's (resolved) mapping with this file's keys laid on top."""
    if "extends" not in data:
        return data
    base_name = data["extends"]
    names = preset_names()
    if not isinstance(base_name, str) or base_name not in names:
        raise HardwareError(f"{where}: extends: got {brief(base_name)}; must be a preset ({', '.join(names)})")
    if depth >= _MAX_EXTENDS:
        raise HardwareError(f"{where}: extends: got a chain of more than {_MAX_EXTENDS} presets (a cycle?); must be shorter")
    base, base_where = read_system_document(base_name)
    if not is_generated(base):
        raise HardwareError(f"{where}: extends: got {base_name!r}, an explicit graph; must be a generator preset (with node:)")
    base = resolve_extends(base, base_where, depth + 1)
    return _merge(base, {k: v for k, v in data.items() if k != "extends"})


# -- file spec ------------------------------------------------------------------------------------------------
class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _FabricSpec(_Spec):
    """Figures shared by scale_up and scale_out."""

    name: str
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"]
    bandwidth: _Quantity = Field(description="per GPU, per direction")
    latency: _Quantity = Field(default=0.0, description="one-way GPU-to-GPU")
    algorithm: _Algorithm = "ring"
    switch_source: str = ""
    source: str

    _bw = LINK_BANDWIDTH
    _lat = LINK_LATENCY


class _ScaleUpSpec(_FabricSpec):
    name: str = "nvlink"
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"] = "nvlink"
    topology: Literal["switch", "hybrid-cube-mesh", "memory-node-ring", "host-centric"] = Field(
        default="switch", description="how the GPUs are joined (mcdla.hardware.direct_topology)")


class _ScaleOutSpec(_FabricSpec):
    name: str = "scale-out"
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"] = "network"
    nodes: int = Field(ge=1, le=MAX_DEVICES)
    via_gpu_link: bool = Field(default=False, description="the NIC sits behind the PCIe switch of the GPU's "
                               "socket link, so its GPUDirect RDMA crosses that link too")


class _GemmSpec(_Spec):
    peak_fraction: float = Field(gt=0, le=1)
    half_width: float = Field(ge=0, allow_inf_nan=False)
    source: str
    half_tokens: float = Field(default=DEFAULT_HALF_TOKENS, ge=0, allow_inf_nan=False)
    backward_ratio: float = Field(default=DEFAULT_BACKWARD_RATIO, gt=0, allow_inf_nan=False)
    fp8_fraction: float = Field(default=DEFAULT_FP8_FRACTION, gt=0, le=1)
    fp8_tn_only: bool = False
    bf16_over_fp8: float | None = Field(default=None, gt=0, le=1)


class _PcieSwitchSpec(_Spec):
    """PCIe switches between the GPUs and their socket, each shared by ``shared_by`` GPUs (the DGX-1's)."""

    shared_by: int = Field(ge=1, le=1024)
    source: str


class _CpuAdamSpec(_Spec):
    """The node's host running DeepSpeedCPUAdam over all its sockets' cores, in parameters per second (measured)."""

    params_per_s: float = Field(gt=0, allow_inf_nan=False)
    source: str


class _MeasuredRateSpec(_Spec):
    """A measured host rate in bytes/s and where it was measured."""

    bandwidth: _Quantity
    source: str

    _bw = bandwidth_validator("bandwidth", allow_inf=False)


class _SustainedDramSpec(_MeasuredRateSpec):
    """The host DRAM bandwidth a streaming kernel sustains over all the node's sockets' cores (measured, bytes/s)."""


class _FirstTouchCopySpec(_MeasuredRateSpec):
    """A device-to-host copy into pageable host memory the process has never touched, end to end (measured,
    bytes/s): the driver stages it through pinned buffers and the host thread copying out of them faults in each
    destination page (zeroed by the kernel) as it goes, so the host, not the link, sets the rate. One copying
    thread's figure: it does not divide among the node's GPUs."""


class _SocketsSpec(_Spec):
    count: int = Field(ge=1, le=MAX_DEVICES)
    memory: dict[str, Any]
    gpu_link: dict[str, Any]
    interconnect: dict[str, Any] | None = None
    pcie_switch: _PcieSwitchSpec | None = None
    cpu_adam: _CpuAdamSpec | None = None
    sustained_dram: _SustainedDramSpec | None = None
    first_touch_copy: _FirstTouchCopySpec | None = None
    source: str


class _ExpandersSpec(_Spec):
    per_socket: int = Field(ge=1, le=1024)
    memory: dict[str, Any]
    link: dict[str, Any]
    source: str


class _MemoryNodesSpec(_Spec):
    count: int = Field(ge=1, le=MAX_DEVICES)
    memory: dict[str, Any]
    link: dict[str, Any] | None = Field(default=None, description="to the scale-up switch; none on a memory-node-ring")
    placement: Literal["all", "both-neighbours", "next"] | None = Field(
        default=None, description="pool memories of a GPU: every memory-node (switch, the default there), both ring "
                                  "neighbours (memory-node-ring's default) or the one after the GPU on the ring")
    source: str


class _NvmeSpec(_Spec):
    """A node's local NVMe drives (ZeRO-Infinity's third tier); figures per drive."""

    drives: int = Field(ge=1, le=1024)
    capacity: _Quantity
    read_bandwidth: _Quantity
    write_bandwidth: _Quantity
    source: str

    _cap = capacity_validator("capacity", allow_inf=False)
    _bw = bandwidth_validator("read_bandwidth", "write_bandwidth", allow_inf=False)


class _AttentionKernelSpec(_Spec):
    """A kernel build's measured attention times over the LLM model's, by sequence length
    (:mod:`mcdla.hardware.attention_kernel`)."""

    seq_lens: list[int] = Field(min_length=1, max_length=64)
    fwd: list[float] = Field(min_length=1, max_length=64)
    bwd: list[float] = Field(min_length=1, max_length=64)
    source: str


class _NodeSpec(_Spec):
    gpus: int = Field(ge=1, le=MAX_DEVICES)
    gpu: dict[str, Any]
    gemm_efficiency: _GemmSpec | None = None
    attention_kernels: dict[str, _AttentionKernelSpec] = Field(default_factory=dict)
    source: str
    scale_up: _ScaleUpSpec | None = None
    sockets: _SocketsSpec | None = None
    expanders: _ExpandersSpec | None = None
    memory_nodes: _MemoryNodesSpec | None = None
    pool: list[Literal["sockets", "expanders", "memory_nodes"]] | None = None
    nvme: _NvmeSpec | None = None


class _ClusterSpec(_Spec):
    format: Literal["mcdla-system/1"]
    name: str
    description: str = ""
    figures: dict[str, Any] = Field(default_factory=dict, description="anchors only; ignored after parsing")
    node: _NodeSpec
    scale_out: _ScaleOutSpec | None = None


def _fabric_link(a: str, b: str, f: _FabricSpec, what: str) -> dict[str, Any]:
    return {"a": a, "b": b, "bandwidth": f.bandwidth, "latency": f.latency / 2, "kind": f.kind,
            "source": f"{f.source} ({what}; the GPU-to-GPU latency split over the two links to the switch)"}


def expand_dict(spec: _ClusterSpec) -> dict[str, Any]:
    """The explicit ``mcdla-system/1`` form of a generator (NOTE [generated names], NOTE [generated rings]; a node
    without a scale-up switch: :func:`~mcdla.hardware.direct_topology.expand_direct`)."""
    node = spec.node
    if node.scale_up is not None and node.scale_up.topology in DIRECT_TOPOLOGIES:
        return expand_direct(spec)
    nodes = spec.scale_out.nodes if spec.scale_out is not None else 1
    k = node.gpus
    devices: list[dict[str, Any]] = []
    memories: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    pools: dict[str, list[str]] = {}
    up_name = "nvswitch"
    for j in range(nodes):
        p = f"n{j}." if nodes > 1 else ""
        gpu = [f"{p}gpu{i}" for i in range(k)]
        for g in gpu:
            devices.append({"name": g, **node.gpu})
        if node.scale_up is not None:
            sw = p + up_name
            switches.append({"name": sw, "source": node.scale_up.switch_source or node.scale_up.source})
            links += [_fabric_link(g, sw, node.scale_up, f"{node.scale_up.name} port of a GPU") for g in gpu]
        socket_mem: list[str] = []
        socket_exp: list[list[str]] = []
        if node.sockets is not None:
            s = node.sockets
            socket_memories, cpus, memory_links, socket_exp = socket_parts(node, p)
            memories += socket_memories
            switches += cpus
            links += memory_links
            socket_mem = [f"{p}host{c}" for c in range(s.count)]
            if s.interconnect is not None:
                for a in range(s.count):
                    for b in range(a + 1, s.count):
                        links.append({"a": f"{p}cpu{a}", "b": f"{p}cpu{b}", **s.interconnect})
            pcie, to_sockets = gpu_links(node, p, gpu)
            switches += pcie
            links += to_sockets
        mem_nodes: list[str] = []
        if node.memory_nodes is not None:
            for m in range(node.memory_nodes.count):
                name = f"{p}mem{m}"
                memories.append({"name": name, **node.memory_nodes.memory})
                links.append({"a": name, "b": p + up_name, **node.memory_nodes.link})
                mem_nodes.append(name)
        groups = node.pool if node.pool is not None else [
            g for g in ("sockets", "expanders", "memory_nodes") if getattr(node, g) is not None]
        for i, g in enumerate(gpu):
            targets: list[str] = []
            c = i * node.sockets.count // k if node.sockets is not None else 0
            if "sockets" in groups:
                targets.append(socket_mem[c])
            if "expanders" in groups:
                targets += socket_exp[c]
            if "memory_nodes" in groups:
                targets += mem_nodes
            if targets:
                pools[g] = targets
    rings: list[list[str]] = []
    if nodes == 1 and k > 1:
        ring: list[str] = []
        for i in range(k):
            ring += [f"gpu{i}", up_name]
        rings.append(ring)
    elif nodes > 1:
        o = spec.scale_out
        assert o is not None
        switches.append({"name": o.name, "source": o.switch_source or o.source})
        for j in range(nodes):
            for i in range(k):
                links.append(_fabric_link(f"n{j}.gpu{i}", o.name, o, f"{o.name} rail of a GPU"))
        for r in range(k):
            ring = []
            for j in range(nodes):
                for step in range(k):
                    ring.append(f"n{j}.gpu{(r + step) % k}")
                    ring.append(f"n{j}.{up_name}" if step < k - 1 else o.name)
            rings.append(ring)
    return {"format": "mcdla-system/1", "name": spec.name, "description": spec.description, "devices": devices,
            "memories": memories, "switches": switches, "links": links, "pools": pools, "rings": rings}
