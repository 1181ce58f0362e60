"""The LLM time model (:mod:`mcdla.sim.llm`) on a hardware preset: a :class:`GpuCluster` from a :class:`Cluster`.

:func:`llm_system` reads everything the time model needs from a generated preset (``load_cluster``) instead of
hand-written figures: the GPU (peak FLOP/s, HBM capacity and bandwidth, efficiencies), the scale-up (NVLink)
and scale-out (InfiniBand) bandwidth and latency per GPU, and the second memory tier as
:meth:`Cluster.pool_link` sees it: the offload bandwidth each GPU gets while every GPU of the node offloads at
once, and the pool capacity per GPU. The cluster rides along as ``GpuCluster.fabric``, so TP and DP collectives
and pipeline sends are priced by :mod:`mcdla.sim.collective_models` on the preset's dimensions (NVLink SHARP
in-network all-reduce, hierarchical NVLink + IB reductions) rather than by flat rings.

The one figure the presets do not carry is the GEMM efficiency's fall-off with the per-rank width ``h / tp``:
the half-width of the A100 fit (:data:`DEFAULT_HALF_WIDTH`, ``docs/llm.md``) is assumed to carry over, with the
preset's ``compute_efficiency`` as the peak fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.sim.llm import GemmEfficiency, GpuCluster

__all__ = ["DEFAULT_HALF_WIDTH", "LlmSystem", "llm_system"]

DEFAULT_HALF_WIDTH = 140.0
"""Elements of per-rank GEMM width at which efficiency is half its peak: the A100 fit of ``docs/llm.md``
(``mcdla.report.llm_validation.A100_GEMM_EFFICIENCY``), assumed for newer GPUs too (no published fit)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSystem:
    """A preset as the LLM time model sees it.

    Attributes:
        name: the preset (and ``" (no offload)"`` when its second tier is switched off).
        cluster: the time model's :class:`GpuCluster` (``fabric`` set to the preset's :class:`Cluster`).
        offload_capacity_bytes: second-tier bytes per GPU (0 without a tier).
        gpus: GPUs the system was sized for (whole nodes: ``nodes * gpus_per_node >= gpus``).
    """

    name: str
    cluster: GpuCluster
    offload_capacity_bytes: float
    gpus: int

    @property
    def offload_bytes_per_s(self) -> float:
        return self.cluster.offload_bytes_per_s


def llm_system(preset: str | Cluster, *, gpus: int | None = None, offload: bool = True, precision: str = "bf16",
               gemm_efficiency: GemmEfficiency | None = None) -> LlmSystem:
    """The time model's view of ``preset`` (a name, file or :class:`Cluster`) sized for ``gpus`` GPUs.

    ``offload=False`` keeps the hardware but gives it no second tier (offload bandwidth and capacity 0), the
    "no offload, recompute instead" variant. One-line ConfigError/HardwareError for a bad preset or size.
    """
    cluster = preset if isinstance(preset, Cluster) else load_cluster(preset)
    if gpus is not None:
        nodes = cluster.nodes_for(gpus, field="llm_system.gpus")
        if nodes != cluster.nodes:
            cluster = cluster.with_nodes(nodes)
    up, out = cluster.scale_up, cluster.scale_out
    # A one-GPU node (gh200) has no NVLink domain: tp*cp = 1 is enforced by gpus_per_node, and the scale-out
    # figures stand in for the unused intra-node ones; a one-node system uses its scale-up for both.
    inner = up if up is not None else out
    outer = out if out is not None else up
    if inner is None or outer is None:
        raise ConfigError(f"llm_system: preset {cluster.name!r} has neither a scale-up nor a scale-out fabric")
    link = cluster.pool_link() if offload else None
    offload_bw = 0.0 if link is None else link.offload_bytes_per_s
    capacity = 0.0 if link is None else link.pool_bytes
    dev = cluster.device
    eff = gemm_efficiency or GemmEfficiency(
        peak_fraction=dev.compute_efficiency, half_width=DEFAULT_HALF_WIDTH,
        source=f"{cluster.name}: compute_efficiency {dev.compute_efficiency} as peak, A100 half-width {DEFAULT_HALF_WIDTH}")
    source = (f"preset {cluster.name!r} x {cluster.nodes} nodes" + (f"; {link.source}" if link is not None else
                                                                   "; offload off"))
    gpu_cluster = GpuCluster(
        device=dev, gpus_per_node=cluster.gpus_per_node, nvlink_bytes_per_s=inner.bytes_per_s,
        network_bytes_per_s=outer.bytes_per_s, nvlink_latency_s=inner.latency_s, network_latency_s=outer.latency_s,
        offload_bytes_per_s=offload_bw, precision=precision, gemm_efficiency=eff, source=source, fabric=cluster)
    return LlmSystem(name=cluster.name if offload else f"{cluster.name} (no offload)", cluster=gpu_cluster,
                     offload_capacity_bytes=capacity, gpus=gpus if gpus is not None else cluster.n_devices)
