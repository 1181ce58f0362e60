"""The hardware model: devices, memories, switches and links joined in a topology.

Plain, validated data in base units (bytes, bytes/s, FLOP/s, seconds). Every figure of a preset carries its
source in a ``source`` field. Links are full duplex: ``bytes_per_s`` is the bandwidth of *each direction*.
Routing lives in :mod:`mcdla.hardware.topology`; files in :mod:`mcdla.hardware.io`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from mcdla.errors import HardwareError, brief

__all__ = ["LinkKind", "Device", "Memory", "MemoryKind", "Switch", "Link", "System"]


def _check_positive(owner: str, name: str, value: float, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise HardwareError(f"{owner}.{name}: got {brief(value)}; must be a number > 0")
    if value <= 0 or (math.isinf(value) and not allow_inf):
        allowed = "> 0" if allow_inf else "finite and > 0"
        raise HardwareError(f"{owner}.{name}: got {brief(value)}; must be {allowed}")
    return float(value)


def _check_nonnegative(owner: str, name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise HardwareError(f"{owner}.{name}: got {brief(value)}; must be a number >= 0")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """An accelerator.

    Attributes:
        name: node name (``"gpu0"``).
        peak_flops_per_s: peak arithmetic rate per precision (``{"fp16": 125e12, "fp32": 15.7e12}``).
        hbm_bytes: device-memory capacity (``math.inf`` for an oracle).
        hbm_bytes_per_s: device-memory bandwidth, for the roofline.
        compute_efficiency: fraction of peak FLOP/s a layer reaches (documented assumption).
        memory_efficiency: fraction of HBM bandwidth a layer reaches.
        exp_per_s: exponentials per second of the special-function units (``MUFU.EX2``), the rate FlashAttention's
            softmax runs at besides its two matrix products; 0 = not given (no softmax term is charged).
        host_call_s: the host's time per launch of a grouped GEMM's per-expert loop on this device (Transformer
            Engine's cuBLASLt calls and fp8 quantization kernels, NOTE [expert parallelism]), which bounds many
            small expert GEMMs; 0 = not given (no issue time is charged).
        source: where the figures come from.
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    hbm_bytes: float
    hbm_bytes_per_s: float
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    exp_per_s: float = 0.0
    host_call_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"device {brief(self.name)}"
        object.__setattr__(self, "exp_per_s", _check_nonnegative(owner, "exp_per_s", self.exp_per_s))
        object.__setattr__(self, "host_call_s", _check_nonnegative(owner, "host_call_s", self.host_call_s))
        if not self.peak_flops_per_s:
            raise HardwareError(f"{owner}.peak_flops_per_s: got empty; must give at least one precision")
        object.__setattr__(
            self,
            "peak_flops_per_s",
            {str(k): _check_positive(owner, f"peak_flops_per_s[{k}]", v, allow_inf=True) for k, v in self.peak_flops_per_s.items()},
        )
        object.__setattr__(self, "hbm_bytes", _check_positive(owner, "hbm_bytes", self.hbm_bytes, allow_inf=True))
        object.__setattr__(
            self, "hbm_bytes_per_s", _check_positive(owner, "hbm_bytes_per_s", self.hbm_bytes_per_s, allow_inf=True)
        )
        for name in ("compute_efficiency", "memory_efficiency"):
            value = _check_positive(owner, name, getattr(self, name))
            if value > 1:
                raise HardwareError(f"{owner}.{name}: got {brief(value)}; must be in (0, 1]")
            object.__setattr__(self, name, value)

    @property
    def effective_hbm_bytes_per_s(self) -> float:
        """The sustained HBM rate memory-bound kernels get, ``hbm_bytes_per_s * memory_efficiency``: a streaming
        kernel reaches only that fraction of the peak bandwidth, so every byte-bound time divides by this."""
        return self.hbm_bytes_per_s * self.memory_efficiency

    def flops_per_s(self, precision: str) -> float:
        """Peak FLOP/s at ``precision``; one-line HardwareError listing the known precisions otherwise."""
        try:
            return self.peak_flops_per_s[precision]
        except KeyError:
            known = ", ".join(sorted(self.peak_flops_per_s))
            raise HardwareError(f"device {brief(self.name)}: no peak for precision {brief(precision)}; has {known}") from None


class MemoryKind(str, Enum):
    """Where a pool memory sits: host DRAM behind a CPU socket, or a memory-node on the device interconnect."""

    HOST = "host"
    MEMORY_NODE = "memory-node"


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """A capacity tier that devices offload to: a CPU socket's DRAM or an MC-DLA memory-node.

    Its DRAM bandwidth is a shared resource: every flow into or out of this memory passes through it.
    """

    name: str
    kind: MemoryKind
    capacity_bytes: float
    dram_bytes_per_s: float
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"memory {brief(self.name)}"
        if not isinstance(self.kind, MemoryKind):
            try:
                object.__setattr__(self, "kind", MemoryKind(self.kind))
            except ValueError:
                raise HardwareError(f"{owner}.kind: got {brief(self.kind)}; must be 'host' or 'memory-node'") from None
        object.__setattr__(self, "capacity_bytes", _check_positive(owner, "capacity_bytes", self.capacity_bytes, allow_inf=True))
        object.__setattr__(
            self, "dram_bytes_per_s", _check_positive(owner, "dram_bytes_per_s", self.dram_bytes_per_s, allow_inf=True)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    """A forwarding node with no memory of its own (PCIe switch, CPU root complex, NVSwitch)."""

    name: str
    source: str = ""


class LinkKind(str, Enum):
    """Physical kind of a link; only used for reporting and for sweeping one kind (e.g. PCIe generation)."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    CPU_INTERCONNECT = "cpu-interconnect"
    NETWORK = "network"
    OTHER = "other"


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A full-duplex link between two nodes.

    Attributes:
        a, b: node names.
        bytes_per_s: bandwidth of each direction (achievable, not signalling rate; see ``source``).
        latency_s: one-way latency added to each transfer that crosses the link.
        kind: physical kind.
        source: where the figures come from.
    """

    a: str
    b: str
    bytes_per_s: float
    latency_s: float = 0.0
    kind: LinkKind = LinkKind.OTHER
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"link {self.a}-{self.b}"
        if self.a == self.b:
            raise HardwareError(f"{owner}: got a link from {brief(self.a)} to itself; must join two different nodes")
        object.__setattr__(self, "bytes_per_s", _check_positive(owner, "bytes_per_s", self.bytes_per_s, allow_inf=True))
        object.__setattr__(self, "latency_s", _check_nonnegative(owner, "latency_s", self.latency_s))
        if not isinstance(self.kind, LinkKind):
            try:
                object.__setattr__(self, "kind", LinkKind(self.kind))
            except ValueError:
                allowed = ", ".join(k.value for k in LinkKind)
                raise HardwareError(f"{owner}.kind: got {brief(self.kind)}; must be one of {allowed}") from None

    @property
    def key(self) -> frozenset[str]:
        return frozenset((self.a, self.b))


@dataclass(frozen=True, slots=True, kw_only=True)
class System:
    """The expanded link graph the event engine runs on; build one with :meth:`Cluster.expand()
    <mcdla.hardware.cluster.Cluster.expand>` (every preset and system file loads as a
    :class:`~mcdla.hardware.cluster.Cluster`). The engine's tests and the sweeps' variants below build or derive
    small graphs directly, as its API.

    Attributes:
        name: preset or file name.
        devices: the accelerators, in rank order.
        memories: pool memories (host sockets, memory-nodes).
        switches: forwarding nodes.
        links: full-duplex links between any of the above.
        pools: for each device, the memories its offloaded pages go to; pages are interleaved evenly over
            them (MC-DLA's bandwidth-aware placement uses both ring neighbours).
        rings: collective rings, each a cycle of node names that visits every device once (other nodes on
            it, such as MC-DLA memory-nodes, forward). Data of a collective is split evenly over the rings;
            each ring is traversed in the listed direction.
        description: free text.
    """

    name: str
    devices: tuple[Device, ...]
    memories: tuple[Memory, ...] = ()
    switches: tuple[Switch, ...] = ()
    links: tuple[Link, ...] = ()
    pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rings: tuple[tuple[str, ...], ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("devices", "memories", "switches", "links", "rings"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "rings", tuple(tuple(r) for r in self.rings))
        object.__setattr__(self, "pools", {str(k): tuple(v) for k, v in self.pools.items()})
        if not self.devices:
            raise HardwareError(f"system {brief(self.name)}.devices: got none; must have at least one device")
        names: dict[str, str] = {}
        for kind, nodes in (("device", self.devices), ("memory", self.memories), ("switch", self.switches)):
            for node in nodes:
                if node.name in names:
                    raise HardwareError(f"system {brief(self.name)}: node name {brief(node.name)} is used twice")
                names[node.name] = kind
        seen: set[frozenset[str]] = set()
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in names:
                    raise HardwareError(f"system {brief(self.name)}.links[{i}]: got unknown node {brief(end)}")
            if link.key in seen:
                raise HardwareError(
                    f"system {brief(self.name)}.links[{i}]: {link.a}-{link.b} given twice; merge parallel links into one"
                )
            seen.add(link.key)
        for dev, targets in self.pools.items():
            if names.get(dev) != "device":
                raise HardwareError(f"system {brief(self.name)}.pools: got {brief(dev)}; keys must be device names")
            if not targets:
                raise HardwareError(f"system {brief(self.name)}.pools[{dev}]: got no memories; must name at least one")
            for t in targets:
                if names.get(t) != "memory":
                    raise HardwareError(f"system {brief(self.name)}.pools[{dev}]: got {brief(t)}; must name a memory")
        device_names = {d.name for d in self.devices}
        for r, ring in enumerate(self.rings):
            for node in ring:
                if node not in names:
                    raise HardwareError(f"system {brief(self.name)}.rings[{r}]: got unknown node {brief(node)}")
            if {n for n in ring if n in device_names} != device_names or sum(n in device_names for n in ring) != len(device_names):
                raise HardwareError(f"system {brief(self.name)}.rings[{r}]: must visit every device exactly once")

    # -- lookups -------------------------------------------------------------------------------------------
    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise HardwareError(f"system {brief(self.name)}: no device {brief(name)}")

    def memory(self, name: str) -> Memory:
        for m in self.memories:
            if m.name == name:
                return m
        raise HardwareError(f"system {brief(self.name)}: no memory {brief(name)}")

    def pool_of(self, device: str) -> tuple[str, ...]:
        """The memories ``device`` offloads to; HardwareError when it has none."""
        pool = self.pools.get(device, ())
        if not pool:
            raise HardwareError(f"system {brief(self.name)}: device {brief(device)} has no pool memory to offload to")
        return pool

    # -- variants ------------------------------------------------------------------------------------------
    def as_oracle(self) -> System:
        """The same system with unlimited device memory: no virtualization is ever needed."""
        return dataclasses.replace(
            self,
            name=f"{self.name}-oracle" if not self.name.endswith("oracle") else self.name,
            devices=tuple(dataclasses.replace(d, hbm_bytes=math.inf) for d in self.devices),
        )

    def with_compute_scale(self, factor: float) -> System:
        """Every device's peak FLOP/s and HBM bandwidth multiplied by ``factor`` (the compute-growth sweep)."""
        _check_positive("compute scale", "factor", factor)
        return dataclasses.replace(
            self,
            devices=tuple(
                dataclasses.replace(
                    d,
                    peak_flops_per_s={k: v * factor for k, v in d.peak_flops_per_s.items()},
                    hbm_bytes_per_s=d.hbm_bytes_per_s * factor,
                    exp_per_s=d.exp_per_s * factor,
                )
                for d in self.devices
            ),
        )

    def with_link_bandwidth(self, kind: LinkKind, bytes_per_s: float, source: str = "") -> System:
        """Every link of ``kind`` set to ``bytes_per_s`` per direction (e.g. a PCIe generation sweep)."""
        _check_positive(f"links of kind {kind.value}", "bytes_per_s", bytes_per_s, allow_inf=True)
        return dataclasses.replace(
            self,
            links=tuple(
                dataclasses.replace(l, bytes_per_s=bytes_per_s, source=source or l.source) if l.kind is kind else l
                for l in self.links
            ),
        )

    def with_hbm(self, hbm_bytes: float) -> System:
        """Every device's memory capacity set to ``hbm_bytes``."""
        _check_positive("device", "hbm_bytes", hbm_bytes, allow_inf=True)
        return dataclasses.replace(
            self, devices=tuple(dataclasses.replace(d, hbm_bytes=hbm_bytes) for d in self.devices)
        )
