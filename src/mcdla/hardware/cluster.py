"""Generated systems: ``nodes`` copies of a node template joined by a scale-out fabric, and their fabric dimensions.

A system file may describe its structure instead of listing it: a ``node:`` (its GPUs, a scale-up switch such
as an NVSwitch, CPU/Grace sockets with their memory, optional CXL expanders behind each socket, optional
MC-DLA memory-nodes on the scale-up switch) and a ``scale_out:`` fabric (InfiniBand, one rail per GPU, the
fat tree abstracted as one switch with a port per GPU) that joins ``scale_out.nodes`` copies of the node.
Format: ``docs/hardware-format.md``.

Two views of one description:

* :class:`Cluster` — compact, for models at scale (1,000-16,000 GPUs): the GPU, the node, and the fabric
  dimensions (:class:`FabricDim`: size, per-GPU bandwidth per direction, latency, collective algorithm),
  innermost first. Nothing is materialised; :mod:`mcdla.sim.collective_models` prices collectives on them.
* :meth:`Cluster.expand` — the ordinary :class:`~mcdla.hardware.model.System` with every device, memory,
  switch, link, pool and ring, for the event-driven engine (a few thousand devices at most in practice).

NOTE [generated names]
One node: ``gpu{i}``, ``nvswitch`` (the scale-up switch), ``cpu{s}``/``host{s}`` (socket s and its memory),
``cxl{s}_{e}`` (expander e behind socket s), ``mem{m}`` (memory-node m). With more than one node every name
gets the prefix ``n{j}.`` and the scale-out switch is named by ``scale_out.name``. GPU i attaches to socket
``i * sockets // gpus``. Ranks are node-major: rank ``j * gpus + i`` is GPU i of node j.

NOTE [generated rings]
One node: one ring through the scale-up switch in GPU order (a GPU's port carries each step once per
direction, so a second, reversed ring would only share the same ports). Several nodes: ``gpus`` rings, ring r
entering every node at GPU r and leaving it from GPU r-1 over that GPU's rail, so every rail carries exactly one
ring each way (NCCL's rail-aligned rings). The event engine runs these; the closed forms of
:mod:`mcdla.sim.collective_models` price the hierarchical and in-network algorithms the engine does not run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mcdla._io_safety import read_document
from mcdla.errors import HardwareError, brief
from mcdla.hardware.gemm import (DEFAULT_BACKWARD_RATIO, DEFAULT_FP8_FRACTION, DEFAULT_HALF_TOKENS, DEFAULT_HALF_WIDTH,
                                 GemmEfficiency)
from mcdla.hardware.io import BANDWIDTH_BOUNDS_BYTES_PER_S, CAPACITY_BOUNDS_BYTES, LATENCY_BOUNDS_S, within_bounds
from mcdla.hardware.model import Device, LinkKind, System
from mcdla.hardware.pool_link import PoolLink
from mcdla.hardware.traffic import TrafficPath, node_paths, offload_link
from mcdla.units import parse_bytes, parse_bytes_per_s, parse_seconds

__all__ = ["ALGORITHMS", "FabricDim", "Cluster", "NvmeTier", "cluster_from_dict", "load_cluster", "is_generated"]

ALGORITHMS = ("ring", "tree", "in-network")
"""Collective algorithms of a fabric dimension: NCCL-style ring, double binary tree, in-switch reduction
(NVLink SHARP / InfiniBand SHARP). Hierarchical is not an algorithm of one dimension but the composition over
several (:func:`mcdla.sim.collective_models.collective_time` with a sequence of dimensions)."""

_Quantity = str | float | int
_Algorithm = Literal["ring", "tree", "in-network"]
_MAX_DEVICES = 1 << 20


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


def _resolve_extends(data: dict[str, Any], where: str, depth: int = 0) -> dict[str, Any]:
    """A generator with ``extends: PRESET`` as the preset's (resolved) mapping with this file's keys laid on top."""
    if "extends" not in data:
        return data
    from mcdla.hardware.io import preset_names

    base_name = data["extends"]
    names = preset_names()
    if not isinstance(base_name, str) or base_name not in names:
        raise HardwareError(f"{where}: extends: got {brief(base_name)}; must be a preset ({', '.join(names)})")
    if depth >= _MAX_EXTENDS:
        raise HardwareError(f"{where}: extends: got a chain of more than {_MAX_EXTENDS} presets (a cycle?); must be shorter")
    import yaml

    base = yaml.safe_load(resources.files(_PRESET_PACKAGE).joinpath(f"{base_name}.yaml").read_text())
    if not is_generated(base):
        raise HardwareError(f"{where}: extends: got {base_name!r}, an explicit system; must be a generator preset (with node:)")
    base = _resolve_extends(base, f"preset {base_name!r}", depth + 1)
    return _merge(base, {k: v for k, v in data.items() if k != "extends"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricDim:
    """One dimension of a hierarchical fabric, as a collective sees it.

    Attributes:
        name: ``"nvlink"``, ``"ib-ndr"``, ...
        size: ranks in one group of this dimension (GPUs of an NVLink domain, nodes on the scale-out fabric).
        bytes_per_s: bandwidth of ONE GPU into this dimension, per direction (its NVLink port, its IB rail).
        latency_s: one-way GPU-to-GPU latency across the dimension (one step of a ring).
        algorithm: the collective algorithm used on it, one of :data:`ALGORITHMS`.
        kind: physical kind of its links.
        source: where the figures come from.
    """

    name: str
    size: int
    bytes_per_s: float
    latency_s: float = 0.0
    algorithm: str = "ring"
    kind: LinkKind = LinkKind.OTHER
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"fabric dimension {self.name!r}"
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise HardwareError(f"{owner}.size: got {self.size!r}; must be an integer >= 1")
        bw = self.bytes_per_s
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or bw <= 0:
            raise HardwareError(f"{owner}.bytes_per_s: got {bw!r}; must be a number > 0")
        lat = self.latency_s
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat < 0:
            raise HardwareError(f"{owner}.latency_s: got {lat!r}; must be finite and >= 0")
        if self.algorithm not in ALGORITHMS:
            raise HardwareError(f"{owner}.algorithm: got {self.algorithm!r}; must be one of {', '.join(ALGORITHMS)}")
        object.__setattr__(self, "bytes_per_s", float(bw))
        object.__setattr__(self, "latency_s", float(lat))
        if not isinstance(self.kind, LinkKind):
            object.__setattr__(self, "kind", LinkKind(self.kind))

    def subgroup(self, size: int) -> FabricDim:
        """The same dimension for a group of ``size`` of its ranks (a tensor-parallel group of 4 in an NVL8)."""
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= self.size:
            raise HardwareError(f"fabric dimension {self.name!r}.subgroup: got {size!r}; must be an integer in 1..{self.size}")
        return dataclasses.replace(self, size=size)

    def with_algorithm(self, algorithm: str) -> FabricDim:
        """The same dimension with another collective algorithm."""
        return dataclasses.replace(self, algorithm=algorithm)


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

    @field_validator("bandwidth")
    @classmethod
    def _bw(cls, v: _Quantity) -> float:
        # inf: an idealised fabric that never binds (a test's or a what-if's figure; it adds no time)
        return within_bounds(parse_bytes_per_s(v, "bandwidth"), "bandwidth", BANDWIDTH_BOUNDS_BYTES_PER_S, "B/s",
                             allow_inf=True)

    @field_validator("latency")
    @classmethod
    def _lat(cls, v: _Quantity) -> float:
        return within_bounds(parse_seconds(v, "latency"), "latency", LATENCY_BOUNDS_S, "s", allow_inf=False)


class _ScaleUpSpec(_FabricSpec):
    name: str = "nvlink"
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"] = "nvlink"


class _ScaleOutSpec(_FabricSpec):
    name: str = "scale-out"
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"] = "network"
    nodes: int = Field(ge=1, le=_MAX_DEVICES)
    via_gpu_link: bool = Field(default=False, description="the NIC sits behind the PCIe switch of the GPU's "
                               "socket link, so its GPUDirect RDMA crosses that link too")


class _GemmSpec(_Spec):
    peak_fraction: float = Field(gt=0, le=1)
    half_width: float = Field(ge=0, allow_inf_nan=False)
    source: str
    half_tokens: float = Field(default=DEFAULT_HALF_TOKENS, ge=0, allow_inf_nan=False)
    backward_ratio: float = Field(default=DEFAULT_BACKWARD_RATIO, gt=0, allow_inf_nan=False)
    fp8_fraction: float = Field(default=DEFAULT_FP8_FRACTION, gt=0, le=1)


class _SocketsSpec(_Spec):
    count: int = Field(ge=1, le=_MAX_DEVICES)
    memory: dict[str, Any]
    gpu_link: dict[str, Any]
    interconnect: dict[str, Any] | None = None
    source: str


class _ExpandersSpec(_Spec):
    per_socket: int = Field(ge=1, le=1024)
    memory: dict[str, Any]
    link: dict[str, Any]
    source: str


class _MemoryNodesSpec(_Spec):
    count: int = Field(ge=1, le=_MAX_DEVICES)
    memory: dict[str, Any]
    link: dict[str, Any]
    source: str


class _NvmeSpec(_Spec):
    """A node's local NVMe drives (ZeRO-Infinity's third tier); figures per drive."""

    drives: int = Field(ge=1, le=1024)
    capacity: _Quantity
    read_bandwidth: _Quantity
    write_bandwidth: _Quantity
    source: str

    @field_validator("capacity")
    @classmethod
    def _cap(cls, v: _Quantity) -> float:
        return within_bounds(parse_bytes(v, "capacity"), "capacity", CAPACITY_BOUNDS_BYTES, "B", allow_inf=False)

    @field_validator("read_bandwidth", "write_bandwidth")
    @classmethod
    def _bw(cls, v: _Quantity) -> float:
        return within_bounds(parse_bytes_per_s(v, "bandwidth"), "bandwidth", BANDWIDTH_BOUNDS_BYTES_PER_S, "B/s",
                             allow_inf=False)


class _NodeSpec(_Spec):
    gpus: int = Field(ge=1, le=_MAX_DEVICES)
    gpu: dict[str, Any]
    gemm_efficiency: _GemmSpec | None = None
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


# -- the compact view -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class NvmeTier:
    """A node's NVMe drives as one tier: capacity (bytes) and sequential read and write bandwidth (bytes/s),
    the node's totals over its drives, with their source."""

    capacity_bytes: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``nodes`` copies of a node joined by a scale-out fabric (see the module docstring).

    Attributes:
        name, description: from the file.
        nodes: number of nodes.
        gpus_per_node: GPUs in a node (the scale-up domain: 8 for a DGX, 72 for an NVL72).
        device: the GPU (named ``"gpu"``).
        gemm_efficiency: the GPU's GEMM efficiency curve (``node.gemm_efficiency``; without one, the device's
            ``compute_efficiency`` as peak and :data:`~mcdla.hardware.gemm.DEFAULT_HALF_WIDTH`).
        dims: fabric dimensions, innermost first: the scale-up domain (when a node has more than one GPU) and
            the scale-out fabric (when the file has one), each with the size of one group.
        paths: one GPU's :class:`~mcdla.hardware.traffic.TrafficPath` per traffic class the node has
            (``offload`` only with a pool).
        offload: the offload path as the planners' :class:`PoolLink` (every GPU offloading at once; None
            without a pool).
    """

    name: str
    description: str
    nodes: int
    gpus_per_node: int
    device: Device
    gemm_efficiency: GemmEfficiency
    dims: tuple[FabricDim, ...]
    paths: tuple[TrafficPath, ...] = dataclasses.field(compare=False)
    offload: PoolLink | None = dataclasses.field(compare=False)
    _spec: _ClusterSpec = dataclasses.field(repr=False, compare=False)
    _where: str = dataclasses.field(default="system", repr=False, compare=False)
    # (size, stride) -> group_dims' answer: a pure function of the frozen fields, asked once per group and
    # configuration by the LLM model, so a search over 10^5 configurations asks a handful of distinct ones
    _group_memo: dict[tuple[int, int], tuple[FabricDim, ...]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # same node? -> dim_between's answer, for the same reason
    _between_memo: dict[bool, FabricDim] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def scale_up(self) -> FabricDim | None:
        """The scale-up (NVLink) dimension, None for one-GPU nodes."""
        return self.dims[0] if self._spec.node.scale_up is not None else None

    @property
    def scale_out(self) -> FabricDim | None:
        """The scale-out dimension, None when the file has no ``scale_out``."""
        return self.dims[-1] if self._spec.scale_out is not None else None

    @property
    def nvme(self) -> NvmeTier | None:
        """The node's NVMe tier (``node.nvme``), None without one."""
        n = self._spec.node.nvme
        if n is None:
            return None
        return NvmeTier(capacity_bytes=n.drives * n.capacity, read_bytes_per_s=n.drives * n.read_bandwidth,
                        write_bytes_per_s=n.drives * n.write_bandwidth, source=n.source)

    def dim(self, name: str) -> FabricDim:
        """The dimension called ``name``; one-line HardwareError listing the names otherwise."""
        for d in self.dims:
            if d.name == name:
                return d
        raise HardwareError(f"cluster {self.name!r}: no fabric dimension {name!r}; has {', '.join(d.name for d in self.dims) or 'none'}")

    def nodes_for(self, gpus: int, *, field: str = "gpus") -> int:
        """The nodes a job of ``gpus`` GPUs occupies: ``ceil(gpus / gpus_per_node)``, the last one partly filled.

        The one rule every GPU count is checked by (``search --gpus``, an execution record's ``gpus`` in
        ``llm-predict``, :meth:`for_gpus`): any whole number of GPUs from 1 up, so 64 GPUs
        of one NVL72 rack or 1152 GPUs on 256-GPU DGX GH200 nodes are both valid. A parallel group that does not
        tile the nodes evenly is priced with more scale-out traffic than its layout has (the LLM time model's
        group layout says how). One-line HardwareError naming ``field`` otherwise.
        """
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= _MAX_DEVICES * self.gpus_per_node:
            raise HardwareError(f"{field}: got {brief(gpus)}; must be an integer in 1..{_MAX_DEVICES * self.gpus_per_node}"
                                f" ({_MAX_DEVICES} nodes of {self.gpus_per_node} GPUs of {self.name})")
        return -(-gpus // self.gpus_per_node)

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with ``nodes`` nodes (needs a ``scale_out`` fabric when ``nodes`` > 1)."""
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= _MAX_DEVICES:
            raise HardwareError(f"cluster {self.name!r}.nodes: got {nodes!r}; must be an integer in 1..{_MAX_DEVICES}")
        if self._spec.scale_out is None:
            if nodes != 1:
                raise HardwareError(f"cluster {self.name!r}.nodes: got {nodes}; must be 1 without a scale_out fabric")
            return self
        spec = self._spec.model_copy(update={"scale_out": self._spec.scale_out.model_copy(update={"nodes": nodes})})
        return _cluster(spec, self._where, self.device)

    def for_gpus(self, gpus: int) -> Cluster:
        """The same cluster with the fewest whole nodes that hold ``gpus`` GPUs."""
        nodes = self.nodes_for(gpus, field=f"cluster {self.name!r}.gpus")
        return self if nodes == self.nodes else self.with_nodes(nodes)

    def without_offload(self) -> Cluster:
        """The same hardware with no pool (``node.pool: []``): the "no offload, recompute instead" variant,
        named ``"<name> (no offload)"``."""
        node = self._spec.node.model_copy(update={"pool": []})
        spec = self._spec.model_copy(update={"node": node, "name": f"{self.name} (no offload)"})
        return _cluster(spec, self._where, self.device)

    def with_gemm_efficiency(self, gemm: GemmEfficiency) -> Cluster:
        """The same cluster with another GEMM efficiency curve (a refit), kept by :meth:`with_nodes`."""
        curve = _GemmSpec(peak_fraction=gemm.peak_fraction, half_width=gemm.half_width, source=gemm.source or "given",
                          half_tokens=gemm.half_tokens, backward_ratio=gemm.backward_ratio,
                          fp8_fraction=gemm.fp8_fraction)
        spec = self._spec.model_copy(update={"node": self._spec.node.model_copy(update={"gemm_efficiency": curve})})
        return _cluster(spec, self._where, self.device)

    def path(self, traffic: str) -> TrafficPath:
        """One GPU's path for ``traffic`` (``offload``, ``scale-up``, ``scale-out``); one-line HardwareError
        naming the classes the node has otherwise."""
        for p in self.paths:
            if p.traffic == traffic:
                return p
        raise HardwareError(f"cluster {self.name!r}: traffic class got {brief(traffic)}; has "
                            f"{', '.join(p.traffic for p in self.paths) or 'none'}")

    def group_dims(self, size: int, stride: int = 1) -> tuple[FabricDim, ...]:
        """The fabric dimensions a parallel group spans, innermost first, for collectives over it.

        The group is ranks ``r, r + stride, ..., r + (size - 1) stride`` in node-major rank order
        (:class:`~mcdla.workload.parallel_dims.ParallelDims` gives each dimension's size and stride). A node
        holds ``gcd(size, gpus_per_node / stride)`` members when ``stride`` divides the node, else one; the
        scale-up dimension joins those, the scale-out one the rest. A group that does not tile the nodes evenly
        (a data-parallel group of 128 over the 9 tensor-parallel groups of an NVL72 rack) is priced with the
        ``gcd`` members per node, which counts more scale-out traffic than the layout has. A group of one rank
        spans no dimension. Every GPU has its own port and rail, so groups side by side share no bandwidth here.
        """
        memo = self._group_memo.get((size, stride))
        if memo is not None and type(size) is int and type(stride) is int:
            return memo
        for label, value in (("size", size), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HardwareError(f"cluster {self.name!r}.group_dims: {label} got {brief(value)}; must be an integer >= 1")
        if size == 1:
            return ()
        if size * stride > self.n_devices:
            raise HardwareError(
                f"cluster {self.name!r}.group_dims: size {size} x stride {stride} got {size * stride} ranks; "
                f"must be at most the {self.n_devices} GPUs")
        k = self.gpus_per_node
        per_node = math.gcd(size, k // stride) if stride < k and k % stride == 0 else 1
        dims: list[FabricDim] = []
        if per_node > 1:
            up = self.scale_up
            assert up is not None  # more than one member per node means more than one GPU per node
            dims.append(dataclasses.replace(up, size=per_node))
        if size // per_node > 1:
            out = self.scale_out
            assert out is not None  # members on several nodes need nodes > 1, which needs scale_out
            # a ring over the groups' rails, one rail per member: more members than nodes when the group does not
            # tile them (the gcd above), so not a subgroup of the node count
            dims.append(dataclasses.replace(out, size=size // per_node))
        self._group_memo[(size, stride)] = tuple(dims)
        return tuple(dims)

    def dim_between(self, rank_a: int, rank_b: int) -> FabricDim:
        """The dimension a point-to-point transfer between two ranks crosses (pipeline-parallel neighbours)."""
        for r in (rank_a, rank_b):
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.n_devices:
                raise HardwareError(f"cluster {self.name!r}.dim_between: rank got {r!r}; must be in 0..{self.n_devices - 1}")
        if rank_a == rank_b:
            raise HardwareError(f"cluster {self.name!r}.dim_between: got rank {rank_a} twice; must be two different ranks")
        same = rank_a // self.gpus_per_node == rank_b // self.gpus_per_node
        memo = self._between_memo.get(same)
        if memo is None:
            dim = self.scale_up if same else self.scale_out
            assert dim is not None  # two GPUs of one node need scale_up; of two nodes, scale_out
            memo = self._between_memo[same] = dim.subgroup(2)
        return memo

    def node_system(self) -> System:
        """One node as a :class:`System` (no scale-out fabric), names without the ``n{j}.`` prefix."""
        return self.with_nodes(1).expand() if self.nodes != 1 else self.expand()

    def pool_link(self) -> PoolLink:
        """A GPU's path to its offload pool while EVERY GPU of the node offloads at once (the planners' view):
        :attr:`offload`, from the closed form of :mod:`mcdla.hardware.traffic`. One-line HardwareError when the
        node has no pool."""
        if self.offload is None:
            raise HardwareError(f"cluster {self.name!r}: device 'gpu0' has no pool memory to offload to")
        return self.offload

    def expand(self) -> System:
        """Every device, memory, switch, link, pool and ring, as an ordinary :class:`System` (validated)."""
        from mcdla.hardware.io import system_from_dict

        return system_from_dict(_expand_dict(self._spec), where=self._where)


# -- parsing and expansion ------------------------------------------------------------------------------------
def _check_figures(spec_cls: type[BaseModel], figures: dict[str, Any], where: str, **names: str) -> None:
    """Validate one template's figures (a device, memory or link without its names) with the explicit schema."""
    from mcdla.hardware.io import _one_line

    try:
        spec_cls.model_validate({**names, **figures})
    except ValidationError as exc:
        raise _one_line(exc, where) from None
    except HardwareError as exc:
        raise HardwareError(f"{where}: {exc}") from None


def cluster_from_dict(data: Any, where: str = "system") -> Cluster:
    """Validate a generator file (with ``node:``) into a :class:`Cluster`; one-line HardwareError otherwise."""
    from mcdla.hardware.io import _DeviceSpec, _LinkSpec, _MemorySpec, _one_line

    if not isinstance(data, dict):
        raise HardwareError(f"{where}: got {type(data).__name__}; must be a mapping with format: mcdla-system/1")
    data = _resolve_extends(data, where)
    try:
        spec = _ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, where) from None
    except HardwareError as exc:
        raise HardwareError(f"{where}: {exc}") from None
    node = spec.node
    _check_figures(_DeviceSpec, node.gpu, f"{where}: node.gpu", name="gpu")
    groups = (("sockets", node.sockets, (("memory", _MemorySpec), ("gpu_link", _LinkSpec), ("interconnect", _LinkSpec)))
              , ("expanders", node.expanders, (("memory", _MemorySpec), ("link", _LinkSpec)))
              , ("memory_nodes", node.memory_nodes, (("memory", _MemorySpec), ("link", _LinkSpec))))
    for group, gspec, parts in groups:
        if gspec is None:
            continue
        for part, cls in parts:
            figures = getattr(gspec, part)
            if figures is not None:
                _check_figures(cls, figures, f"{where}: node.{group}.{part}", **({"name": "m"} if cls is _MemorySpec else {"a": "x", "b": "y"}))
    if node.expanders is not None and node.sockets is None:
        raise HardwareError(f"{where}: node.expanders: got expanders without sockets; they attach to a socket, add node.sockets")
    if node.memory_nodes is not None and node.scale_up is None:
        raise HardwareError(f"{where}: node.memory_nodes: got memory-nodes without scale_up; they attach to the scale-up switch")
    if node.gpus > 1 and node.scale_up is None:
        raise HardwareError(f"{where}: node.scale_up: missing; a node of {node.gpus} GPUs needs a scale-up switch")
    if node.sockets is not None and node.sockets.count > node.gpus:
        raise HardwareError(f"{where}: node.sockets.count: got {node.sockets.count}; must be at most node.gpus ({node.gpus})")
    for group in node.pool or ():
        if getattr(node, group) is None:
            raise HardwareError(f"{where}: node.pool: got {group!r}; the node has no {group}")
    if spec.scale_out is not None and node.scale_up is not None and spec.scale_out.name == node.scale_up.name:
        raise HardwareError(f"{where}: scale_out.name: got {spec.scale_out.name!r}; must differ from node.scale_up.name")
    nodes = spec.scale_out.nodes if spec.scale_out is not None else 1
    if nodes * node.gpus > _MAX_DEVICES:
        raise HardwareError(f"{where}: scale_out.nodes: got {nodes} nodes of {node.gpus} GPUs; must be at most {_MAX_DEVICES} GPUs")
    dev = _DeviceSpec.model_validate({"name": "gpu", **node.gpu})
    device = Device(name="gpu", peak_flops_per_s=dev.peak_flops_per_s, hbm_bytes=dev.hbm, hbm_bytes_per_s=dev.hbm_bandwidth,
                    compute_efficiency=dev.compute_efficiency, memory_efficiency=dev.memory_efficiency,
                    exp_per_s=dev.exp_rate, source=dev.source)
    return _cluster(spec, where, device)


def _cluster(spec: _ClusterSpec, where: str, device: Device) -> Cluster:
    node = spec.node
    dims: list[FabricDim] = []
    if node.scale_up is not None:
        u = node.scale_up
        dims.append(FabricDim(name=u.name, size=node.gpus, bytes_per_s=u.bandwidth, latency_s=u.latency,
                              algorithm=u.algorithm, kind=LinkKind(u.kind), source=u.source))
    if spec.scale_out is not None:
        o = spec.scale_out
        dims.append(FabricDim(name=o.name, size=o.nodes, bytes_per_s=o.bandwidth, latency_s=o.latency,
                              algorithm=o.algorithm, kind=LinkKind(o.kind), source=o.source))
    nodes = spec.scale_out.nodes if spec.scale_out is not None else 1
    g = node.gemm_efficiency
    gemm = (GemmEfficiency(peak_fraction=g.peak_fraction, half_width=g.half_width, source=g.source,
                           half_tokens=g.half_tokens, backward_ratio=g.backward_ratio, fp8_fraction=g.fp8_fraction)
            if g is not None
            else GemmEfficiency(peak_fraction=device.compute_efficiency, half_width=DEFAULT_HALF_WIDTH,
                                source=f"{spec.name}: no node.gemm_efficiency; compute_efficiency "
                                       f"{device.compute_efficiency} as peak, the DGX A100 half-width {DEFAULT_HALF_WIDTH}"))
    paths, pool_bytes = node_paths(node, spec.scale_out, device)
    offload = None
    if pool_bytes > 0:
        offload = offload_link(paths[0], pool_bytes=pool_bytes,
                               source=f"{spec.name}: every GPU of a node offloading at once, pages interleaved over "
                                      "its pool (closed form, mcdla.hardware.traffic)")
    return Cluster(name=spec.name, description=spec.description, nodes=nodes, gpus_per_node=node.gpus, device=device,
                   gemm_efficiency=gemm, dims=tuple(dims), paths=paths, offload=offload, _spec=spec, _where=where)


def _fabric_link(a: str, b: str, f: _FabricSpec, what: str) -> dict[str, Any]:
    return {"a": a, "b": b, "bandwidth": f.bandwidth, "latency": f.latency / 2, "kind": f.kind,
            "source": f"{f.source} ({what}; the GPU-to-GPU latency split over the two links to the switch)"}


def _expand_dict(spec: _ClusterSpec) -> dict[str, Any]:
    """The explicit ``mcdla-system/1`` form of a generator (NOTE [generated names], NOTE [generated rings])."""
    node = spec.node
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
            for c in range(s.count):
                cpu, host = f"{p}cpu{c}", f"{p}host{c}"
                switches.append({"name": cpu, "source": s.source})
                memories.append({"name": host, **s.memory})
                links.append({"a": cpu, "b": host, "bandwidth": "inf", "kind": "other",
                              "source": f"on-die memory controller; the DRAM bandwidth of {host} is its limit"})
                socket_mem.append(host)
                exp: list[str] = []
                if node.expanders is not None:
                    for e in range(node.expanders.per_socket):
                        name = f"{p}cxl{c}_{e}"
                        memories.append({"name": name, **node.expanders.memory})
                        links.append({"a": cpu, "b": name, **node.expanders.link})
                        exp.append(name)
                socket_exp.append(exp)
            if s.interconnect is not None:
                for a in range(s.count):
                    for b in range(a + 1, s.count):
                        links.append({"a": f"{p}cpu{a}", "b": f"{p}cpu{b}", **s.interconnect})
            for i, g in enumerate(gpu):
                links.append({"a": g, "b": f"{p}cpu{i * s.count // k}", **s.gpu_link})
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


_PRESET_PACKAGE = "mcdla.hardware.presets"


def load_cluster(name_or_path: str | Path, *, nodes: int | None = None) -> Cluster:
    """A generated preset (``"dgx-h100"``) or generator file as a :class:`Cluster`, optionally with ``nodes`` nodes.

    One-line HardwareError for an explicit (listed) system such as ``mc-dla``, which has no fabric dimensions.
    """
    import yaml

    from mcdla.hardware.io import preset_names

    text = str(name_or_path)
    if text in preset_names():
        where = f"preset {text!r}"
        data = yaml.safe_load(resources.files(_PRESET_PACKAGE).joinpath(f"{text}.yaml").read_text())
    else:
        path = Path(text)
        if not (path.suffix in (".yaml", ".yml", ".json") or path.exists()):
            raise HardwareError(f"cluster: got {brief(text)}; must be a preset ({', '.join(preset_names())}) or a .yaml/.json file")
        where = f"system file {brief(text, 200)}"
        data = read_document(path, what="system file", error=HardwareError)
    if not is_generated(data):
        raise HardwareError(f"{where}: got an explicit system (devices listed); must be a generator with node: (docs/hardware-format.md)")
    cluster = cluster_from_dict(data, where)
    return cluster if nodes is None else cluster.with_nodes(nodes)
