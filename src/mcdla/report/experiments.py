"""The MC-DLA reproduction: the paper's central comparison and its two sweeps, as plain records.

Every number comes from :func:`mcdla.sim.simulate` on the bundled presets and the analytical zoo; nothing is
tuned toward the paper's 2.8x (see ``docs/reproduction.md`` for the assumptions that drive the result).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from statistics import geometric_mean
from typing import Any

from mcdla.errors import ConfigError
from mcdla.hardware import LinkKind, MemoryKind, System, load_system
from mcdla.plan import make_plan, policy_plan
from mcdla.profile.progress import OnProgress, notify
from mcdla.sim import pool_link, simulate
from mcdla.workload import Workload, zoo

__all__ = [
    "Record",
    "PCIE_GENERATIONS",
    "PCIE_DMA_EFFICIENCY",
    "HOST_DRAM_BY_GENERATION",
    "sweep_system",
    "COMPUTE_SCALES",
    "run_one",
    "run_matrix",
    "speedup_rows",
    "mean_speedup",
    "compute_pcie_sweep",
    "sweep_speedups",
    "with_compute_efficiency",
    "with_pcie_share",
    "VARIANTS",
    "variant_speedups",
]

PCIE_GENERATIONS: dict[int, float] = {3: 16e9, 4: 32e9, 5: 64e9, 6: 128e9}
"""PCIe x16 raw bandwidth per direction by generation (bytes/s) [src] alpha-one-index.github.io/ai-infra-index."""
PCIE_DMA_EFFICIENCY = 0.8
"""Fraction of the raw PCIe rate that DMA achieves (TLP/DLLP headers, flow control, ACKs): realistic DMA reaches
70-80% of nominal (blogs.oracle.com/pyakutis/resource/expected_pcie_bw.html); the dc-dla preset's 12.8 GB/s."""
HOST_DRAM_BY_GENERATION: dict[int, tuple[float, str]] = {
    3: (76.8e9, "4 x DDR4-2400 = 76.8 GB/s per socket, the DGX-1's Xeon E5-2698 v4 (dc-dla preset)"),
    4: (204.8e9, "8 x DDR4-3200 = 8 x 25.6 = 204.8 GB/s per socket, PCIe 4.0-era servers [derived]"),
    5: (460.8e9, "12 x DDR5-4800 = 460.8 GB/s per socket, EPYC Genoa (PCIe 5.0) [derived]"),
    6: (460.8e9, "12 x DDR5-4800 = 460.8 GB/s per socket, as PCIe 5.0 [assumption: no newer published figure]"),
}
"""Host (socket) DRAM bandwidth of the era of each PCIe generation (bytes/s, source): the compute x PCIe sweep
moves the host memory with the link, else DDR4's 76.8 GB/s caps every generation past 4.0."""
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fp32": ("fp32, vDNN-all", {"precision": "fp32"}),
    "conv": ("fp16, vDNN-conv", {"policy": "conv"}),
    "lp": ("fp16, lp planner", {"planner": "lp"}),
    "pofo": ("fp16, pofo planner", {"planner": "pofo"}),
}
"""The reproduction's variants of the default (fp16, vDNN-all): key -> (label, :func:`run_matrix` settings)."""
COMPUTE_SCALES: tuple[float, ...] = (1, 2, 4, 8, 16, 32)
"""Device compute relative to a V100 (the paper: compute grew 20-34x in five years, PCIe 1x)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One simulated iteration: what ``results.json`` and the CSV hold."""

    workload: str
    batch: int
    parallel: str
    system: str
    policy: str
    iteration_time_s: float
    compute_s: float
    recompute_s: float
    exposed_virtualization_s: float
    exposed_communication_s: float
    peak_device_bytes: float
    offloaded_bytes: float
    feasible: bool
    compute_scale: float = 1.0
    pcie_generation: int = 3
    """PCIe generation of the host links (0: not varied, e.g. mc-dla in the sweep)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON/CSV; an infeasible iteration's infinite time becomes None."""
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}


def _plan_for(system: System, workload: Workload, policy: str, planner: str | None):
    if math.isinf(min(d.hbm_bytes for d in system.devices)):
        return policy_plan(workload, "none"), "none"
    if planner is None:
        return policy_plan(workload, policy), policy
    budget = min(d.hbm_bytes for d in system.devices)
    return make_plan(workload, budget, pool_link(system), planner=planner), planner


def run_one(
    system: System,
    workload: Workload,
    *,
    parallel: str,
    policy: str = "all",
    planner: str | None = None,
    compute_scale: float = 1.0,
    pcie_generation: int = 3,
) -> Record:
    """Simulate one iteration of ``workload`` on ``system`` and keep the figures of a record.

    An oracle system (unlimited device memory) always runs without virtualization.
    """
    plan, used = _plan_for(system, workload, policy, planner)
    result = simulate(system, workload, plan, parallel=parallel)
    return Record(
        workload=workload.name,
        batch=workload.batch,
        parallel=parallel,
        system=system.name,
        policy=used,
        iteration_time_s=result.iteration_time_s,
        compute_s=result.compute_s,
        recompute_s=result.recompute_s,
        exposed_virtualization_s=result.exposed_virtualization_s,
        exposed_communication_s=result.exposed_communication_s,
        peak_device_bytes=result.peak_device_bytes,
        offloaded_bytes=result.offloaded_bytes,
        feasible=result.feasible,
        compute_scale=compute_scale,
        pcie_generation=pcie_generation,
    )


def _run_job(job: tuple[System, Workload, dict[str, Any]]) -> Record:
    system, workload, kwargs = job
    return run_one(system, workload, **kwargs)


def _map(jobs: Sequence[tuple[System, Workload, dict[str, Any]]], workers: int | None,
         on_progress: OnProgress | None = None) -> list[Record]:
    workers = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    records: list[Record] = []
    notify(on_progress, 0, len(jobs), "simulating")
    if workers <= 1 or len(jobs) < 4:
        for job in jobs:
            records.append(_run_job(job))
            notify(on_progress, len(records), len(jobs), "simulating")
        return records
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for record in pool.map(_run_job, jobs, chunksize=max(1, len(jobs) // (4 * workers))):
            records.append(record)
            notify(on_progress, len(records), len(jobs), "simulating")
    return records


def with_compute_efficiency(system: System, efficiency: float) -> System:
    """``system`` with every device sustaining ``efficiency`` of its peak FLOP/s (the device-speed lever:
    a slower device hides more of each offloaded byte behind compute)."""
    if not 0 < efficiency <= 1:
        raise ConfigError(f"compute_efficiency: got {efficiency!r}; must be > 0 and <= 1")
    return dataclasses.replace(system, devices=tuple(
        dataclasses.replace(d, compute_efficiency=efficiency) for d in system.devices))


def _offloads_to_host(system: System) -> bool:
    kinds = {m.name: m.kind for m in system.memories}
    return any(kinds[m] is MemoryKind.HOST for pool in system.pools.values() for m in pool)


def with_pcie_share(system: System, share_bytes_per_s: float) -> System:
    """``system`` with its PCIe links scaled so that each device gets ``share_bytes_per_s`` to its host pool
    when every device offloads at once (:func:`mcdla.sim.pool_link`); a system whose pool is not host memory
    (mc-dla's memory-nodes) is returned unchanged.

    On dc-dla two GPUs share each switch uplink, so a share of 6.4 GB/s is the preset (12.8 GB/s links) and
    12.8 GB/s is what a whole x16 per GPU would give. Past the host DRAM's share per device (19.2 GB/s: four
    GPUs per 76.8 GB/s socket) the links no longer decide, and the share is refused.
    """
    if not 0 < share_bytes_per_s < math.inf:
        raise ConfigError(f"pcie_share: got {share_bytes_per_s!r} bytes/s; must be > 0 and finite")
    if not _offloads_to_host(system):
        return system
    factor = share_bytes_per_s / pool_link(system).offload_bytes_per_s
    scaled = dataclasses.replace(system, links=tuple(
        dataclasses.replace(l, bytes_per_s=l.bytes_per_s * factor,
                            source=f"{l.source}; x {factor:.3g} for a {share_bytes_per_s / 1e9:g} GB/s PCIe share per GPU")
        if l.kind is LinkKind.PCIE else l for l in system.links))
    reached = pool_link(scaled).offload_bytes_per_s
    if not math.isclose(reached, share_bytes_per_s, rel_tol=1e-9):
        raise ConfigError(f"pcie_share: got {share_bytes_per_s / 1e9:g} GB/s; must be at most "
                          f"{reached / 1e9:g} GB/s on {system.name} (its host DRAM's share per device)")
    return scaled


def _adjusted(system: System, compute_efficiency: float | None, pcie_share_bytes_per_s: float | None) -> System:
    if compute_efficiency is not None:
        system = with_compute_efficiency(system, compute_efficiency)
    if pcie_share_bytes_per_s is not None:
        system = with_pcie_share(system, pcie_share_bytes_per_s)
    return system


def run_matrix(
    workloads: Iterable[str] | None = None,
    systems: Sequence[str] = ("dc-dla", "mc-dla", "oracle"),
    parallels: Sequence[str] = ("data", "model"),
    *,
    policy: str = "all",
    planner: str | None = None,
    precision: str = "fp16",
    saves: str = "cudnn",
    compute_efficiency: float | None = None,
    pcie_share_bytes_per_s: float | None = None,
    workers: int | None = None,
    on_progress: OnProgress | None = None,
) -> list[Record]:
    """The reproduction matrix: workloads x systems x parallelism, at each workload's default batch.
    ``on_progress`` hears of each finished simulation.

    ``saves``: what layers save (:func:`mcdla.workload.zoo.build`); ``"cudnn"`` by default, as vDNN's cuDNN
    layers (a max-pool keeps no int64 indices). ``compute_efficiency`` (fraction of peak, every system) and
    ``pcie_share_bytes_per_s`` (systems that offload to host memory): :func:`with_compute_efficiency`,
    :func:`with_pcie_share`; None keeps the presets' figures."""
    names = tuple(workloads) if workloads is not None else zoo.names()
    loaded = [_adjusted(load_system(s), compute_efficiency, pcie_share_bytes_per_s) for s in systems]
    built = [zoo.build(n, precision=precision, saves=saves) for n in names]
    jobs = [
        (system, workload, {"parallel": p, "policy": policy, "planner": planner})
        for workload in built
        for p in parallels
        for system in loaded
    ]
    return _map(jobs, workers, on_progress)


def variant_speedups(keys: Sequence[str], **settings: Any) -> dict[str, tuple[float, int]]:
    """Per variant key (:data:`VARIANTS`): label -> (geo-mean speedup, feasible configurations) of its
    :func:`run_matrix`, the other ``settings`` (e.g. ``compute_efficiency``, ``workers``) shared by all."""
    found = {}
    for key in keys:
        label, own = VARIANTS[key]
        rows = speedup_rows(run_matrix(**{**settings, **own}))
        found[label] = (mean_speedup(rows), sum(r["feasible"] for r in rows))
    return found


def speedup_rows(records: Sequence[Record], base: str = "dc-dla", target: str = "mc-dla", oracle: str = "oracle") -> list[dict[str, Any]]:
    """Per (workload, parallel): the three iteration times, target's speedup over base, and target's gap to
    the oracle (target time / oracle time - 1)."""
    by_key: dict[tuple[str, str], dict[str, Record]] = {}
    for r in records:
        by_key.setdefault((r.workload, r.parallel), {})[r.system] = r
    rows = []
    for (workload, parallel), systems in by_key.items():
        if not {base, target, oracle} <= systems.keys():
            continue
        b, t, o = systems[base], systems[target], systems[oracle]
        feasible = b.feasible and t.feasible and o.feasible
        rows.append(
            {
                "workload": workload,
                "parallel": parallel,
                f"{base}_s": b.iteration_time_s,
                f"{target}_s": t.iteration_time_s,
                f"{oracle}_s": o.iteration_time_s,
                "speedup": b.iteration_time_s / t.iteration_time_s if feasible else None,
                "gap_to_oracle": t.iteration_time_s / o.iteration_time_s - 1.0 if feasible else None,
                "feasible": feasible,
            }
        )
    return rows


def mean_speedup(rows: Sequence[dict[str, Any]]) -> float:
    """Geometric mean of the speedups of the feasible rows (the usual average of ratios); nan if none."""
    speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    return geometric_mean(speedups) if speedups else float("nan")


def compute_pcie_sweep(
    workloads: Iterable[str] | None = None,
    *,
    scales: Sequence[float] = COMPUTE_SCALES,
    generations: Sequence[int] = tuple(PCIE_GENERATIONS),
    parallel: str = "data",
    policy: str = "all",
    planner: str | None = None,
    precision: str = "fp16",
    saves: str = "cudnn",
    workers: int | None = None,
    on_progress: OnProgress | None = None,
) -> list[Record]:
    """mc-dla and dc-dla (at each PCIe generation: :func:`sweep_system`) as device compute grows from 1x to 32x
    a V100, under ``policy`` or, when given, ``planner`` (budget: the device memory)."""
    names = tuple(workloads) if workloads is not None else zoo.names()
    built = [zoo.build(n, precision=precision, saves=saves) for n in names]
    dc, mc = load_system("dc-dla"), load_system("mc-dla")
    jobs = []
    for scale in scales:
        for workload in built:
            jobs.append((mc.with_compute_scale(scale), workload, {"parallel": parallel, "policy": policy,
                                                                  "planner": planner, "compute_scale": scale,
                                                                  "pcie_generation": 0}))
            for gen in generations:
                jobs.append((sweep_system(dc, scale, gen), workload,
                             {"parallel": parallel, "policy": policy, "planner": planner,
                              "compute_scale": scale, "pcie_generation": gen}))
    return _map(jobs, workers, on_progress)


def sweep_system(dc: System, scale: float, generation: int) -> System:
    """``dc`` with device compute x ``scale``, PCIe links at ``generation``'s DMA rate and host DRAM of its era."""
    dram, dram_source = HOST_DRAM_BY_GENERATION[generation]
    system = dc.with_compute_scale(scale).with_link_bandwidth(
        LinkKind.PCIE, PCIE_GENERATIONS[generation] * PCIE_DMA_EFFICIENCY,
        source=f"PCIe {generation}.0 x16 raw (alpha-one-index spec table) x {PCIE_DMA_EFFICIENCY} DMA efficiency",
    )
    return dataclasses.replace(system, memories=tuple(
        dataclasses.replace(m, dram_bytes_per_s=dram, source=dram_source) if m.kind is MemoryKind.HOST else m
        for m in system.memories))


def sweep_speedups(records: Sequence[Record]) -> dict[int, dict[float, float]]:
    """From :func:`compute_pcie_sweep` records: ``{pcie_generation: {compute_scale: geo-mean speedup of
    mc-dla over dc-dla}}``."""
    mc = {(r.workload, r.parallel, r.compute_scale): r for r in records if r.system == "mc-dla"}
    ratios: dict[int, dict[float, list[float]]] = {}
    for r in records:
        if r.system == "mc-dla":
            continue
        other = mc.get((r.workload, r.parallel, r.compute_scale))
        if other is not None and other.feasible and r.feasible:
            ratios.setdefault(r.pcie_generation, {}).setdefault(r.compute_scale, []).append(
                r.iteration_time_s / other.iteration_time_s
            )
    return {g: {s: geometric_mean(v) for s, v in sorted(by.items())} for g, by in sorted(ratios.items())}
