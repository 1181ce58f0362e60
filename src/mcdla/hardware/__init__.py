"""Hardware model: devices, pool memories, switches and links, their topology and the bundled presets."""

from mcdla.hardware.cluster import ALGORITHMS, Cluster, FabricDim, load_cluster
from mcdla.hardware.gemm import GemmEfficiency
from mcdla.hardware.io import load_system, preset_names, save_system, system_from_dict, system_to_dict
from mcdla.hardware.pool_link import PoolLink
from mcdla.hardware.model import Device, Link, LinkKind, Memory, MemoryKind, Switch, System
from mcdla.hardware.topology import Resource, Route, Topology
from mcdla.hardware.traffic import TRAFFIC_CLASSES, PathResource, TrafficPath, routed_offload_link

__all__ = [
    "Device", "Link", "LinkKind", "Memory", "MemoryKind", "Switch", "System",
    "Topology", "Route", "Resource", "PoolLink",
    "Cluster", "FabricDim", "ALGORITHMS", "load_cluster", "GemmEfficiency",
    "TRAFFIC_CLASSES", "PathResource", "TrafficPath", "routed_offload_link",
    "load_system", "preset_names", "save_system", "system_from_dict", "system_to_dict",
]
