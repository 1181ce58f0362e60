"""Generated systems: ``nodes`` copies of a node template joined by a scale-out fabric, and their fabric dimensions.

A system file may describe its structure instead of listing it: a ``node:`` (its GPUs, a scale-up switch such
as an NVSwitch, CPU/Grace sockets with their memory, optional CXL expanders behind each socket, optional
MC-DLA memory-nodes on the scale-up switch) and a ``scale_out:`` fabric (InfiniBand, one rail per GPU, the
fat tree abstracted as one switch with a port per GPU) that joins ``scale_out.nodes`` copies of the node.
Every preset is such a template, the 2018 systems included (their nodes wire GPUs without a scale-up switch:
:mod:`mcdla.hardware.direct_topology`); a file that lists its graph instead loads as one node given as that graph
(NOTE [explicit node]). Format: ``docs/hardware-format.md``; the file schema and its expansion:
:mod:`mcdla.hardware.template`.

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

NOTE [explicit node]
A file that lists its devices, memories, switches and links (``docs/hardware-format.md``, explicit graph) loads as
a one-node Cluster whose node is that graph: :meth:`Cluster.expand` returns it as listed, the device is its first
one, the traffic paths are the first device's routes (:func:`~mcdla.hardware.traffic.graph_paths`). It has no
fabric dimensions, so the LLM time model refuses it (:meth:`Cluster.generated`); the event engine runs it.

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
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mcdla.errors import HardwareError, brief
from mcdla.hardware.attention_kernel import AttentionKernel
from mcdla.hardware.direct_topology import DIRECT_TOPOLOGIES, check_direct
from mcdla.hardware.gemm import DEFAULT_HALF_WIDTH, GemmEfficiency
from mcdla.hardware.model import Device, LinkKind, System
from mcdla.hardware.pool_link import PoolLink
from mcdla.hardware.template import MAX_DEVICES as _MAX_DEVICES
from mcdla.hardware.template import _ClusterSpec, _GemmSpec, expand_dict, is_generated, resolve_extends
from mcdla.hardware.traffic import TrafficPath, graph_paths, node_paths, offload_link

__all__ = ["ALGORITHMS", "FabricDim", "Cluster", "NvmeTier", "cluster_from_dict", "load_cluster", "is_generated"]

ALGORITHMS = ("ring", "tree", "in-network")
"""Collective algorithms of a fabric dimension: NCCL-style ring, double binary tree, in-switch reduction
(NVLink SHARP / InfiniBand SHARP). Hierarchical is not an algorithm of one dimension but the composition over
several (:func:`mcdla.sim.collective_models.collective_time` with a sequence of dimensions)."""



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
        attention_kernels: measured attention kernel builds a run may name (``node.attention_kernels``;
            :class:`~mcdla.hardware.attention_kernel.AttentionKernel`), by name.
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
    attention_kernels: tuple[AttentionKernel, ...] = ()
    paths: tuple[TrafficPath, ...] = dataclasses.field(compare=False)
    offload: PoolLink | None = dataclasses.field(compare=False)
    _spec: _ClusterSpec | None = dataclasses.field(repr=False, compare=False)
    # an explicit graph file's System (then _spec is None): the node given as a graph, NOTE [explicit node]
    _graph: System | None = dataclasses.field(default=None, repr=False, compare=False)
    _where: str = dataclasses.field(default="system", repr=False, compare=False)
    # (size, stride) -> group_dims' answer: a pure function of the frozen fields, asked once per group and
    # configuration by the LLM model, so a search over 10^5 configurations asks a handful of distinct ones
    _group_memo: dict[tuple[int, int], tuple[FabricDim, ...]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # same node? -> dim_between's answer, for the same reason
    _between_memo: dict[bool, FabricDim] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # GPUs in use on a partly used node -> paths_for_gpus' answer
    _paths_memo: dict[int, tuple[tuple[TrafficPath, ...], float]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # the time model's figures derived from this cluster alone (``model_memo``)
    _model_memo: dict[tuple[object, ...], object] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)

    def attention_kernel(self, name: str) -> AttentionKernel | None:
        """The measured attention kernel build ``name`` of this node, or None."""
        return next((k for k in self.attention_kernels if k.name == name), None)

    @property
    def model_memo(self) -> dict[tuple[object, ...], object]:
        """The time model's memo of figures that depend on this cluster and the key alone (a collective's time
        on a group, one layer's compute, the per-link floor's path table), each key's first item naming its kind.
        It lives and dies with the cluster (a replaced or reloaded cluster starts empty), so two clusters never
        share an answer and a search over one cluster asks each figure once."""
        return self._model_memo

    @property
    def n_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def scale_up(self) -> FabricDim | None:
        """The scale-up (NVLink) dimension, None for one-GPU nodes."""
        return self.dims[0] if self._spec is not None and self._spec.node.scale_up is not None else None

    @property
    def scale_out(self) -> FabricDim | None:
        """The scale-out dimension, None when the file has no ``scale_out``."""
        return self.dims[-1] if self._spec is not None and self._spec.scale_out is not None else None

    @property
    def explicit(self) -> bool:
        """Whether the node was given as an explicit graph (no fabric dimensions; NOTE [explicit node])."""
        return self._spec is None

    def generated(self, field: str | None = None) -> Cluster:
        """This cluster when a node template generated it; one-line HardwareError naming ``field`` (by default the
        file) for an explicit graph, which has no fabric dimensions for the LLM time model to price collectives on."""
        if self._spec is None:
            raise HardwareError(f"{field or self._where}: got {self.name!r}, an explicit graph (devices listed); must be "
                                "a generator with node: (docs/hardware-format.md)")
        return self

    @property
    def nvme(self) -> NvmeTier | None:
        """The node's NVMe tier (``node.nvme``), None without one."""
        n = self._spec.node.nvme if self._spec is not None else None
        if n is None:
            return None
        return NvmeTier(capacity_bytes=n.drives * n.capacity, read_bytes_per_s=n.drives * n.read_bandwidth,
                        write_bytes_per_s=n.drives * n.write_bandwidth, source=n.source)

    @property
    def cpu_adam_params_per_s(self) -> float | None:
        """The node's measured CPU-Adam rate (``node.sockets.cpu_adam``, parameters/s over the whole host), None
        without one."""
        sockets = self._spec.node.sockets if self._spec is not None else None
        return None if sockets is None or sockets.cpu_adam is None else sockets.cpu_adam.params_per_s

    @property
    def socket_sustained_dram_bytes_per_s(self) -> float | None:
        """One socket's share of the host's measured sustained DRAM bandwidth (``node.sockets.sustained_dram``,
        measured over all the sockets' cores, over the sockets), None without the figure."""
        sockets = self._spec.node.sockets if self._spec is not None else None
        if sockets is None or sockets.sustained_dram is None:
            return None
        return sockets.sustained_dram.bandwidth / sockets.count

    @property
    def first_touch_copy_bytes_per_s(self) -> float | None:
        """The measured rate of a device-to-host copy into never-touched pageable host memory
        (``node.sockets.first_touch_copy``; one copying thread's, whatever the job's GPUs), None without it."""
        sockets = self._spec.node.sockets if self._spec is not None else None
        if sockets is None or sockets.first_touch_copy is None:
            return None
        return sockets.first_touch_copy.bandwidth

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
        if self._spec is None or self._spec.scale_out is None:
            if nodes != 1:
                raise HardwareError(f"cluster {self.name!r}.nodes: got {nodes}; must be 1 without a scale_out fabric")
            return self
        spec = self._spec.model_copy(update={"scale_out": self._spec.scale_out.model_copy(update={"nodes": nodes})})
        return _cluster(spec, self._where, self.device)

    def for_gpus(self, gpus: int) -> Cluster:
        """The same cluster with the fewest whole nodes that hold ``gpus`` GPUs."""
        nodes = self.nodes_for(gpus, field=f"cluster {self.name!r}.gpus")
        return self if nodes == self.nodes else self.with_nodes(nodes)

    def with_gpus_per_node(self, gpus: int) -> Cluster:
        """The cluster as a job that takes ``gpus`` GPUs of every node sees it: nodes of ``gpus`` GPUs with
        their share of the node's sockets and memory-nodes, the same GPU, curve and fabrics, named
        ``"<name> (<gpus> GPUs per node)"``.

        Ranks fill a job's nodes in order (NOTE [generated names]), so where a job leaves part of each node to
        others, its parallel groups map onto the scale-up domains differently (:meth:`group_dims`): a
        scheduler that allocates whole trays per rack (Slurm ``--segment``, which Megatron-Bridge's launcher
        asks for on GB200 jobs beyond one rack: 16 of an NVL72 rack's 18 four-GPU trays for a 64-tray job)
        puts 64 consecutive ranks in each 72-GPU NVLink domain. One-line HardwareError for a count outside
        ``1..gpus_per_node`` or one that splits a socket or a memory-node's share between GPUs."""
        node = self._spec.node
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= node.gpus:
            raise HardwareError(f"cluster {self.name!r}.gpus_per_node: got {brief(gpus)}; must be an integer in "
                                f"1..{node.gpus} (the GPUs of one node)")
        if gpus == node.gpus:
            return self
        update: dict[str, Any] = {"gpus": gpus}
        for part in ("sockets", "memory_nodes"):
            group = getattr(node, part)
            if group is None:
                continue
            if (group.count * gpus) % node.gpus:
                raise HardwareError(f"cluster {self.name!r}.gpus_per_node: got {gpus}; must keep whole {part} "
                                    f"({group.count} per {node.gpus} GPUs)")
            share: dict[str, Any] = {"count": group.count * gpus // node.gpus}
            if part == "sockets" and group.cpu_adam is not None:  # the share of the host's cores
                share["cpu_adam"] = group.cpu_adam.model_copy(
                    update={"params_per_s": group.cpu_adam.params_per_s * gpus / node.gpus})
            if part == "sockets" and group.sustained_dram is not None:  # the kept sockets' share
                share["sustained_dram"] = group.sustained_dram.model_copy(
                    update={"bandwidth": group.sustained_dram.bandwidth * gpus / node.gpus})
            update[part] = group.model_copy(update=share)
        spec = self._spec.model_copy(update={"node": node.model_copy(update=update),
                                             "name": f"{self.name} ({gpus} GPUs per node)"})
        return _cluster(spec, self._where, self.device)

    def without_offload(self) -> Cluster:
        """The same hardware with no pool (``node.pool: []``): the "no offload, recompute instead" variant,
        named ``"<name> (no offload)"``."""
        if self._spec is None:
            assert self._graph is not None
            return _graph_cluster(dataclasses.replace(self._graph, name=f"{self.name} (no offload)", pools={}),
                                  self._where)
        node = self._spec.node.model_copy(update={"pool": []})
        spec = self._spec.model_copy(update={"node": node, "name": f"{self.name} (no offload)"})
        return _cluster(spec, self._where, self.device)

    def with_gemm_efficiency(self, gemm: GemmEfficiency) -> Cluster:
        """The same cluster with another GEMM efficiency curve (a refit), kept by :meth:`with_nodes`."""
        curve = _GemmSpec(peak_fraction=gemm.peak_fraction, half_width=gemm.half_width, source=gemm.source or "given",
                          half_tokens=gemm.half_tokens, backward_ratio=gemm.backward_ratio,
                          fp8_fraction=gemm.fp8_fraction, fp8_tn_only=gemm.fp8_tn_only,
                          bf16_over_fp8=gemm.bf16_over_fp8)
        if self._spec is None:
            return dataclasses.replace(self, gemm_efficiency=gemm)
        spec = self._spec.model_copy(update={"node": self._spec.node.model_copy(update={"gemm_efficiency": curve})})
        return _cluster(spec, self._where, self.device)

    def paths_for_gpus(self, gpus: int) -> tuple[TrafficPath, ...]:
        """One GPU's paths in a job of ``gpus`` GPUs, as the engine loads them: :attr:`paths` when the job fills
        its nodes' GPU slots (``gpus`` at least :attr:`gpus_per_node`: GPU 0's node is whole) or the node has no
        pool, otherwise those of a node where only GPUs ``0 .. gpus - 1`` send (ranks fill a node's GPUs in
        order), so the resources their pool copies cross are shared by those GPUs alone (8 GPUs of an NVL72 rack
        with memory-nodes spread their copies over the 36 memory-nodes' links, not 72 GPUs' worth). Only the
        pool's resources change: the scale-up and scale-out ones are each GPU's own. Kept per ``gpus``; one-line
        HardwareError for a count below 1."""
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise HardwareError(f"cluster {self.name!r}.paths_for_gpus: got {brief(gpus)}; must be an integer >= 1")
        if gpus >= self.gpus_per_node or self.offload is None:
            return self.paths
        return self._job_paths(gpus)[0]

    def _job_paths(self, gpus: int) -> tuple[tuple[TrafficPath, ...], float]:
        """GPU 0's paths and pool share on a node where GPUs ``0 .. gpus - 1`` send (``gpus`` below the node's)."""
        got = self._paths_memo.get(gpus)
        if got is None:
            if self._spec is None:
                assert self._graph is not None
                got = graph_paths(self._graph, in_use=gpus)
            else:
                got = _spec_paths(self._spec, self._where, self.device, in_use=gpus)
            self._paths_memo[gpus] = got
        return got

    def pool_link_for_gpus(self, gpus: int) -> PoolLink:
        """A GPU's path to its offload pool in a job of ``gpus`` GPUs: :meth:`pool_link` when the job fills its
        nodes' GPU slots, otherwise the same closed form over the resources only the job's GPUs share
        (:meth:`paths_for_gpus`: one GPU of a DGX-2 has its PCIe switch's uplink and its socket's DRAM to itself)
        and the GPU's share of the pool among them. The rule the engine's pool copies follow, for the time model
        (NOTE [ZeRO-Offload] in :mod:`mcdla.sim.llm_offload`). One-line HardwareError without a pool."""
        link = self.pool_link()
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise HardwareError(f"cluster {self.name!r}.pool_link_for_gpus: got {brief(gpus)}; must be an integer >= 1")
        if gpus >= self.gpus_per_node:
            return link
        key = ("job-pool-link", gpus)
        got = self._model_memo.get(key)
        if got is None:
            paths, pool_bytes = self._job_paths(gpus)
            got = self._model_memo[key] = offload_link(
                paths[0], pool_bytes=pool_bytes,
                source=f"{self.name}: GPUs 0..{gpus - 1} of a node offloading at once (closed form, mcdla.hardware.traffic)")
        return got  # type: ignore[return-value]

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
        holds every member when the cluster is one node (a job of 32 GPUs in an NVL72 rack: its data-parallel
        group of stride 8 is all NVLink), else ``gcd(size, gpus_per_node / stride)`` members when ``stride``
        divides the node and one otherwise (the group that straddles two nodes, which the collective waits for);
        the scale-up dimension joins those, the scale-out one the rest. A group that does not tile the nodes evenly
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
        self.generated(f"cluster {self.name!r}.group_dims")
        if size * stride > self.n_devices:
            raise HardwareError(
                f"cluster {self.name!r}.group_dims: size {size} x stride {stride} got {size * stride} ranks; "
                f"must be at most the {self.n_devices} GPUs")
        k = self.gpus_per_node
        if self.nodes == 1:
            per_node = size  # one node holds every rank: no member crosses the scale-out fabric
        else:
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
        self.generated(f"cluster {self.name!r}.dim_between")
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
        from mcdla.hardware.io import explicit_system

        if self._spec is None:
            assert self._graph is not None
            return self._graph
        return explicit_system(expand_dict(self._spec), where=self._where)


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
    """Validate a parsed system file into a :class:`Cluster`: a generator (with ``node:``) or an explicit graph
    (NOTE [explicit node]); one-line HardwareError otherwise."""
    from mcdla.hardware.io import _DeviceSpec, _LinkSpec, _MemorySpec, _one_line, explicit_system

    if not isinstance(data, dict):
        raise HardwareError(f"{where}: got {type(data).__name__}; must be a mapping with format: mcdla-system/1")
    if not is_generated(data):
        return _graph_cluster(explicit_system(data, where), where)
    data = resolve_extends(data, where)
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
    check_direct(node, spec.scale_out, where)
    nodes = spec.scale_out.nodes if spec.scale_out is not None else 1
    if nodes * node.gpus > _MAX_DEVICES:
        raise HardwareError(f"{where}: scale_out.nodes: got {nodes} nodes of {node.gpus} GPUs; must be at most {_MAX_DEVICES} GPUs")
    dev = _DeviceSpec.model_validate({"name": "gpu", **node.gpu})
    device = Device(name="gpu", peak_flops_per_s=dev.peak_flops_per_s, hbm_bytes=dev.hbm, hbm_bytes_per_s=dev.hbm_bandwidth,
                    compute_efficiency=dev.compute_efficiency, memory_efficiency=dev.memory_efficiency,
                    exp_per_s=dev.exp_rate, host_call_s=dev.host_call_time, source=dev.source)
    return _cluster(spec, where, device)


def _cluster(spec: _ClusterSpec, where: str, device: Device) -> Cluster:
    node = spec.node
    dims: list[FabricDim] = []
    direct = _is_direct(spec)
    paths, pool_bytes = _spec_paths(spec, where, device)
    if node.scale_up is not None:
        u = node.scale_up
        hop = next((p for p in paths if p.traffic == "scale-up"), None) if direct else None
        dims.append(FabricDim(name=u.name, size=node.gpus, bytes_per_s=hop.bytes_per_s() if hop else u.bandwidth,
                              latency_s=hop.latency_s if hop else u.latency, algorithm=u.algorithm,
                              kind=LinkKind(u.kind), source=u.source))
    if spec.scale_out is not None:
        o = spec.scale_out
        dims.append(FabricDim(name=o.name, size=o.nodes, bytes_per_s=o.bandwidth, latency_s=o.latency,
                              algorithm=o.algorithm, kind=LinkKind(o.kind), source=o.source))
    nodes = spec.scale_out.nodes if spec.scale_out is not None else 1
    g = node.gemm_efficiency
    gemm = (GemmEfficiency(peak_fraction=g.peak_fraction, half_width=g.half_width, source=g.source,
                           half_tokens=g.half_tokens, backward_ratio=g.backward_ratio, fp8_fraction=g.fp8_fraction,
                           fp8_tn_only=g.fp8_tn_only, bf16_over_fp8=g.bf16_over_fp8)
            if g is not None else _default_gemm(spec.name, device))
    if gemm.bf16_over_fp8 is not None and "fp8" not in device.peak_flops_per_s:
        raise HardwareError(f"{where}: node.gemm_efficiency.bf16_over_fp8: got {gemm.bf16_over_fp8:g}; needs an fp8 "
                            f"peak in the GPU's peak_flops_per_s (has {', '.join(sorted(device.peak_flops_per_s))})")
    kernels = tuple(AttentionKernel(name=name, seq_lens=tuple(k.seq_lens), fwd=tuple(k.fwd), bwd=tuple(k.bwd),
                                    source=k.source) for name, k in sorted(node.attention_kernels.items()))
    return Cluster(name=spec.name, description=spec.description, nodes=nodes, gpus_per_node=node.gpus, device=device,
                   gemm_efficiency=gemm, dims=tuple(dims), attention_kernels=kernels, paths=paths,
                   offload=_offload(spec.name, paths, pool_bytes),
                   _spec=spec, _where=where)


def _is_direct(spec: _ClusterSpec) -> bool:
    """Whether the node's GPUs are wired to each other without a scale-up switch (its paths come from the graph)."""
    return spec.node.scale_up is not None and spec.node.scale_up.topology in DIRECT_TOPOLOGIES


def _spec_paths(spec: _ClusterSpec, where: str, device: Device, *, in_use: int | None = None,
                ) -> tuple[tuple[TrafficPath, ...], float]:
    """GPU 0's paths of a node spec and its share of the pool (``node_paths``; on a directly wired node, with
    no switch port to read the figures from, the GPU's routes on the wired node, ``graph_paths``), with only
    GPUs ``0 .. in_use - 1`` sending where ``in_use`` is given (:meth:`Cluster.paths_for_gpus`)."""
    if _is_direct(spec):
        from mcdla.hardware.io import explicit_system

        return graph_paths(explicit_system(expand_dict(spec), where=where), in_use=in_use)
    return node_paths(spec.node, spec.scale_out, device, in_use=in_use)


def _default_gemm(name: str, device: Device) -> GemmEfficiency:
    """The GEMM curve of a node without ``node.gemm_efficiency``: the device's compute efficiency as peak."""
    return GemmEfficiency(peak_fraction=device.compute_efficiency, half_width=DEFAULT_HALF_WIDTH,
                          source=f"{name}: no node.gemm_efficiency; compute_efficiency {device.compute_efficiency} as "
                                 f"peak, the DGX A100 half-width {DEFAULT_HALF_WIDTH}")


def _offload(name: str, paths: tuple[TrafficPath, ...], pool_bytes: float) -> PoolLink | None:
    if pool_bytes <= 0:
        return None
    return offload_link(paths[0], pool_bytes=pool_bytes,
                        source=f"{name}: every GPU of a node offloading at once, pages interleaved over its pool "
                               "(closed form, mcdla.hardware.traffic)")


def _graph_cluster(system: System, where: str) -> Cluster:
    """An explicit graph as a one-node :class:`Cluster` (NOTE [explicit node])."""
    paths, pool_bytes = graph_paths(system)
    device = dataclasses.replace(system.devices[0], name="gpu")
    return Cluster(name=system.name, description=system.description, nodes=1, gpus_per_node=len(system.devices),
                   device=device, gemm_efficiency=_default_gemm(system.name, device), dims=(), paths=paths,
                   offload=_offload(system.name, paths, pool_bytes), _spec=None, _graph=system, _where=where)




def load_cluster(name_or_path: str | Path, *, nodes: int | None = None) -> Cluster:
    """A preset (``"dgx-h100"``, ``"mc-dla"``) or system file as a :class:`Cluster`, optionally with ``nodes`` nodes:
    a generator file's node template, or an explicit graph file's listed node (NOTE [explicit node])."""
    from mcdla.hardware.io import read_system_document

    data, where = read_system_document(name_or_path)
    cluster = cluster_from_dict(data, where)
    return cluster if nodes is None else cluster.with_nodes(nodes)
