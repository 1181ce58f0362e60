"""Nodes whose GPUs are wired to each other without a scale-up switch: the topologies of the 2018 systems.

``node.scale_up.topology`` says how a node template joins its GPUs (format: ``docs/hardware-format.md``):

* ``switch`` (the default, expanded by :mod:`mcdla.hardware.cluster`): one port per GPU into a scale-up switch.
* ``hybrid-cube-mesh``: the DGX-1V's NVLink2 mesh of 8 GPUs (:data:`HYBRID_CUBE_MESH_LANES`); a link of ``n``
  lanes carries ``n / 6`` of the GPU's ``scale_up.bandwidth``, its latency is the whole GPU-to-GPU latency;
  collectives run its three Hamiltonian cycles, each in both directions.
* ``memory-node-ring``: MC-DLA's ring ``gpu0 mem0 gpu1 mem1 ... gpu{k-1} mem{k-1}``, one memory-node after each
  GPU; each of a GPU's two ring links carries half its ``scale_up.bandwidth`` and half the GPU-to-GPU latency
  (two links per GPU-to-GPU step); ``memory_nodes.placement`` says which neighbours a GPU's pages go to.
  Collectives run the ring both ways, memory-nodes forwarding.
* ``host-centric``: HC-DLA's GPUs hang off their CPU socket (``sockets.gpu_link``), the GPUs of one socket are
  joined all-to-all (each GPU's ``scale_up.bandwidth`` split over its peers), the sockets form a ring of
  ``sockets.interconnect`` links; collectives run one ring through every socket, both ways.

Sockets may reach their GPUs through PCIe switches (``sockets.pcie_switch.shared_by`` GPUs behind each, the
switch's uplink with the ``gpu_link`` figures), as the DGX-1's; :func:`gpu_links` wires them for every topology.
These nodes have no scale-out fabric: a 2018 system is one node.

NOTE [2018 wiring order]
:func:`expand_direct` lists devices, memories, switches, links and rings in the order of the 2018 systems' explicit
graphs (``tests/hardware/data``), so the expanded System is the same graph link for link.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from mcdla.errors import HardwareError

__all__ = ["DIRECT_TOPOLOGIES", "HYBRID_CUBE_MESH_LANES", "HYBRID_CUBE_MESH_CYCLES", "HYBRID_CUBE_MESH_SOURCE",
           "check_direct", "expand_direct", "gpu_links", "socket_of"]

DIRECT_TOPOLOGIES = ("hybrid-cube-mesh", "memory-node-ring", "host-centric")
"""The values of ``scale_up.topology`` other than ``switch``."""

HYBRID_CUBE_MESH_LANES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
    (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2),
)
"""(GPU a, GPU b, NVLink lanes between them) of the DGX-1V hybrid cube-mesh: six lanes per GPU."""
HYBRID_CUBE_MESH_CYCLES: tuple[tuple[int, ...], ...] = (
    (0, 1, 2, 3, 7, 5, 6, 4), (0, 2, 6, 7, 4, 5, 1, 3), (0, 3, 2, 1, 5, 6, 7, 4),
)
"""Three Hamiltonian cycles of the mesh that together use every lane once (NCCL's rings on a DGX-1V)."""
HYBRID_CUBE_MESH_SOURCE = "lane counts of the DGX-1V hybrid cube-mesh (nvidia-smi topo)"
_MESH_LANES_PER_GPU = 6


def socket_of(gpu: int, gpus: int, sockets: int) -> int:
    """The socket GPU ``gpu`` of ``gpus`` attaches to (``gpu * sockets // gpus``)."""
    return gpu * sockets // gpus


def _reversed_ring(ring: list[str]) -> list[str]:
    """The same cycle the other way round, from the same first node."""
    return [ring[0], *reversed(ring[1:])]


def check_direct(node: Any, scale_out: Any, where: str) -> None:
    """One-line HardwareError for a node template its ``scale_up.topology`` cannot wire."""
    up = node.scale_up
    topology = up.topology if up is not None else "switch"
    mem = node.memory_nodes
    if node.sockets is not None and node.sockets.pcie_switch is not None:
        s = node.sockets
        per_socket = node.gpus // s.count
        if node.gpus % s.count or per_socket % s.pcie_switch.shared_by:
            raise HardwareError(f"{where}: node.sockets.pcie_switch.shared_by: got {s.pcie_switch.shared_by}; must divide "
                                f"the GPUs of each socket ({node.gpus} GPUs over {s.count} sockets)")
    if topology == "switch":
        if mem is not None and mem.link is None:
            raise HardwareError(f"{where}: node.memory_nodes.link: missing; memory-nodes on a scale-up switch need their link to it")
        if mem is not None and mem.placement not in (None, "all"):
            raise HardwareError(f"{where}: node.memory_nodes.placement: got {mem.placement!r}; must be 'all' on a scale-up "
                                "switch (neighbours exist on a memory-node-ring only)")
        return
    if scale_out is not None:
        raise HardwareError(f"{where}: scale_out: got a scale-out fabric; a {topology} node is one node "
                            "(scale-out needs scale_up.topology: switch)")
    if topology == "hybrid-cube-mesh":
        if node.gpus != 8:
            raise HardwareError(f"{where}: node.gpus: got {node.gpus}; a hybrid-cube-mesh has 8 GPUs")
        if mem is not None:
            raise HardwareError(f"{where}: node.memory_nodes: got memory-nodes on a hybrid-cube-mesh; they sit on a "
                                "scale-up switch or a memory-node-ring")
    elif topology == "memory-node-ring":
        if node.gpus < 2:
            raise HardwareError(f"{where}: node.gpus: got {node.gpus}; a memory-node-ring needs at least 2 GPUs")
        if mem is None or mem.count != node.gpus:
            got = "none" if mem is None else mem.count
            raise HardwareError(f"{where}: node.memory_nodes.count: got {got}; a memory-node-ring has one memory-node "
                                f"per GPU ({node.gpus})")
        if mem.link is not None:
            raise HardwareError(f"{where}: node.memory_nodes.link: got a link; on a memory-node-ring the ring links "
                                "are node.scale_up's")
    else:  # host-centric
        s = node.sockets
        if s is None:
            raise HardwareError(f"{where}: node.sockets: missing; a host-centric node's GPUs hang off its sockets")
        if node.gpus % s.count:
            raise HardwareError(f"{where}: node.sockets.count: got {s.count}; must divide node.gpus ({node.gpus}) "
                                "on a host-centric node")
        if s.count > 1 and s.interconnect is None:
            raise HardwareError(f"{where}: node.sockets.interconnect: missing; a host-centric node's sockets are "
                                "joined by it")
        if s.pcie_switch is not None:
            raise HardwareError(f"{where}: node.sockets.pcie_switch: got a PCIe switch; a host-centric GPU links "
                                "to its socket directly")
        if mem is not None:
            raise HardwareError(f"{where}: node.memory_nodes: got memory-nodes on a host-centric node; they sit on "
                                "a scale-up switch or a memory-node-ring")
    if mem is not None and mem.placement == "all":
        raise HardwareError(f"{where}: node.memory_nodes.placement: got 'all'; must be 'both-neighbours' or 'next' "
                            "on a memory-node-ring")


def gpu_links(node: Any, prefix: str, gpus: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The PCIe switches and the links from a node's GPUs to their sockets: one ``gpu_link`` per GPU to its
    socket, or, with ``sockets.pcie_switch``, one per GPU to its switch and one uplink per switch to its socket."""
    s = node.sockets
    k = len(gpus)
    if s.pcie_switch is None:
        return [], [{"a": g, "b": f"{prefix}cpu{socket_of(i, k, s.count)}", **s.gpu_link} for i, g in enumerate(gpus)]
    n = s.pcie_switch.shared_by
    names = [f"{prefix}pcie{w}" for w in range(k // n)]
    switches = [{"name": w, "source": s.pcie_switch.source} for w in names]
    links = [{"a": g, "b": names[i // n], **s.gpu_link} for i, g in enumerate(gpus)]
    links += [{"a": w, "b": f"{prefix}cpu{socket_of(j * n, k, s.count)}", **s.gpu_link} for j, w in enumerate(names)]
    return switches, links


def socket_parts(node: Any, prefix: str = "",
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[list[str]]]:
    """Socket memories (each followed by its expanders), CPU switches, their memory links and each socket's
    expanders, of one node of a template, every name after ``prefix`` (a generated node's ``n<i>.``)."""
    s = node.sockets
    memories: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    expanders: list[list[str]] = []
    for c in range(s.count):
        cpu, host = f"{prefix}cpu{c}", f"{prefix}host{c}"
        switches.append({"name": cpu, "source": s.source})
        memories.append({"name": host, **s.memory})
        links.append({"a": cpu, "b": host, "bandwidth": "inf", "kind": "other",
                      "source": f"on-die memory controller; the DRAM bandwidth of {host} is its limit"})
        mine: list[str] = []
        for e in range(node.expanders.per_socket if node.expanders is not None else 0):
            name = f"{prefix}cxl{c}_{e}"
            memories.append({"name": name, **node.expanders.memory})
            links.append({"a": cpu, "b": name, **node.expanders.link})
            mine.append(name)
        expanders.append(mine)
    return memories, switches, links, expanders


def _pools(node: Any, gpus: list[str], expanders: list[list[str]], mem_nodes: list[str]) -> dict[str, list[str]]:
    """Each GPU's pool memories under ``node.pool`` (every group the node has by default)."""
    groups = node.pool if node.pool is not None else [
        g for g in ("sockets", "expanders", "memory_nodes") if getattr(node, g) is not None]
    k = len(gpus)
    pools: dict[str, list[str]] = {}
    for i, g in enumerate(gpus):
        targets: list[str] = []
        c = socket_of(i, k, node.sockets.count) if node.sockets is not None else 0
        if "sockets" in groups:
            targets.append(f"host{c}")
        if "expanders" in groups:
            targets += expanders[c]
        if "memory_nodes" in groups:
            if node.memory_nodes.placement == "next":
                targets.append(mem_nodes[i])
            else:  # both ring neighbours, the one before the GPU first
                targets += [mem_nodes[(i - 1) % k], mem_nodes[i]]
        if targets:
            pools[g] = targets
    return pools


def _scale_up_link(a: str, b: str, up: Any, share: tuple[int, int], latency: float, what: str) -> dict[str, Any]:
    """A direct scale-up link carrying ``share`` (numerator, denominator) of a GPU's ``scale_up.bandwidth``
    (multiplied, then divided: exact for the 2018 figures)."""
    return {"a": a, "b": b, "bandwidth": up.bandwidth * share[0] / share[1], "latency": latency, "kind": up.kind,
            "source": f"{up.source} ({what})"}


def expand_direct(spec: Any) -> dict[str, Any]:
    """The explicit ``mcdla-system/1`` form of a one-node template whose topology is one of
    :data:`DIRECT_TOPOLOGIES` (NOTE [2018 wiring order])."""
    node = spec.node
    up = node.scale_up
    k = node.gpus
    gpus = [f"gpu{i}" for i in range(k)]
    devices = [{"name": g, **node.gpu} for g in gpus]
    memories: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    expanders: list[list[str]] = [[]]
    mem_nodes: list[str] = []
    if up.topology == "host-centric":
        memories, cpus, memory_links, expanders = socket_parts(node)
        switches = cpus
        s = node.sockets
        m = k // s.count
        ring: list[str] = []
        for c in range(s.count):
            mine = gpus[c * m:(c + 1) * m]
            links += [{"a": g, "b": f"cpu{c}", **s.gpu_link} for g in mine]
            links += [_scale_up_link(a, b, up, (1, m - 1), up.latency, f"1/{m - 1} of a GPU's bandwidth to "
                                     "its socket's GPUs") for a, b in combinations(mine, 2)]
            links += [lk for lk in memory_links if lk["a"] == f"cpu{c}"]
            if s.count > 2 or (s.count == 2 and c == 0):
                links.append({"a": f"cpu{c}", "b": f"cpu{(c + 1) % s.count}", **s.interconnect})
            ring += [*mine, f"cpu{c}"] + ([f"cpu{(c + 1) % s.count}"] if s.count > 1 else [])
        rings = [ring, _reversed_ring(ring)]
    else:
        if up.topology == "hybrid-cube-mesh":
            links += [_scale_up_link(f"gpu{a}", f"gpu{b}", up, (n, _MESH_LANES_PER_GPU), up.latency,
                                     f"{n} of the {_MESH_LANES_PER_GPU} lanes ({HYBRID_CUBE_MESH_SOURCE})")
                      for a, b, n in HYBRID_CUBE_MESH_LANES]
            rings = []
            for cycle in HYBRID_CUBE_MESH_CYCLES:
                rings += [[f"gpu{i}" for i in cycle], _reversed_ring([f"gpu{i}" for i in cycle])]
        else:  # memory-node-ring
            mem_nodes = [f"mem{i}" for i in range(k)]
            ring = [n for i in range(k) for n in (gpus[i], mem_nodes[i])]
            links += [_scale_up_link(a, b, up, (1, 2), up.latency / 2, "one of a GPU's two ring links: half "
                                     "its bandwidth, half the GPU-to-GPU latency")
                      for a, b in zip(ring, ring[1:] + ring[:1])]
            rings = [ring, _reversed_ring(ring)]
        if node.sockets is not None:
            host_memories, cpus, memory_links, expanders = socket_parts(node)
            pcie, to_sockets = gpu_links(node, "", gpus)
            memories += host_memories
            switches += pcie + cpus
            links += to_sockets + memory_links
            s = node.sockets
            if s.interconnect is not None:
                links += [{"a": f"cpu{a}", "b": f"cpu{b}", **s.interconnect} for a, b in combinations(range(s.count), 2)]
        memories += [{"name": name, **node.memory_nodes.memory} for name in mem_nodes]
    return {"format": "mcdla-system/1", "name": spec.name, "description": spec.description, "devices": devices,
            "memories": memories, "switches": switches, "links": links,
            "pools": _pools(node, gpus, expanders, mem_nodes), "rings": rings}
