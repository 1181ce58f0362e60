"""The planners' view: one device whose pool is reached through a :class:`PoolLink`.

``evaluate_plan`` is what every planner calls (thousands of times per search), so it skips building a
``System`` and a networkx ``Topology``: it compiles the one-device fabric straight from the link
(:meth:`Fabric.from_pool_link`) and runs the same engine. ``one_device_system`` builds the equivalent
``System``; ``tests/sim/test_single.py`` checks that both give identical results.
"""

from __future__ import annotations

import dataclasses
import math

from mcdla.errors import SimError
from mcdla.hardware.model import Device, Link, LinkKind, Memory, MemoryKind, System
from mcdla.hardware.pool_link import PoolLink
from mcdla.sim.engine import Engine, simulate_fabric
from mcdla.sim.fabric import POOL_MEMORY, Fabric
from mcdla.sim.program import build_program
from mcdla.sim.report import assemble
from mcdla.sim.result import SimResult
from mcdla.workload.model import Workload
from mcdla.workload.plan import Plan

__all__ = ["default_device", "one_device_system", "evaluate_plan"]


def default_device() -> Device:
    """The V100 of the ``dc-dla`` preset (its ``gpu0``), the default device of :func:`evaluate_plan`.

    Spelled out here so that a planner's inner loop never parses YAML; a test checks it equals the preset's.
    """
    return Device(
        name="gpu0",
        peak_flops_per_s={"fp16": 125e12, "fp32": 15.7e12},
        hbm_bytes=16e9,
        hbm_bytes_per_s=900e9,
        compute_efficiency=0.7,
        memory_efficiency=0.8,
        source="V100 SXM2 as in the dc-dla preset (src/mcdla/hardware/presets/dc-dla.yaml)",
    )


def _check_capacity(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SimError(f"{name}: got {value!r}; must be > 0 bytes (math.inf for unlimited)")
    return float(value)


def one_device_system(device: Device, link: PoolLink, capacity_bytes: float) -> System:
    """A system of ``device`` alone (capacity ``capacity_bytes``) whose pool memory is reached through ``link``.

    The pool is one host memory named ``"pool"`` of ``link.pool_bytes``. A full-duplex link becomes a link whose
    directions run at the offload and prefetch bandwidths; a half-duplex one (``shared_direction``) an unlimited
    link into a memory whose DRAM, shared by both directions, runs at the link's bandwidth. A ``Link`` has one
    bandwidth for both directions, so a link whose offload and prefetch bandwidths differ cannot be expressed
    as a System (SimError); :func:`evaluate_plan` handles it exactly.
    """
    capacity = _check_capacity("capacity_bytes", capacity_bytes)
    if link.offload_bytes_per_s != link.prefetch_bytes_per_s:
        raise SimError(
            f"link: offload_bytes_per_s {link.offload_bytes_per_s:g} != prefetch_bytes_per_s "
            f"{link.prefetch_bytes_per_s:g}; a System link has one bandwidth per direction (use evaluate_plan)"
        )
    if device.name == POOL_MEMORY:
        raise SimError(f"device.name: got {device.name!r}; the pool memory of a one-device system uses that name")
    bandwidth = link.offload_bytes_per_s
    source = link.source or "mcdla.sim.one_device_system"
    return System(
        name=f"one-device-{device.name}",
        devices=(dataclasses.replace(device, hbm_bytes=capacity),),
        memories=(
            Memory(name=POOL_MEMORY, kind=MemoryKind.HOST, capacity_bytes=link.pool_bytes,
                   dram_bytes_per_s=bandwidth if link.shared_direction else math.inf, source=source),
        ),
        links=(
            Link(a=device.name, b=POOL_MEMORY, bytes_per_s=math.inf if link.shared_direction else bandwidth,
                 latency_s=link.latency_s, kind=LinkKind.OTHER, source=source),
        ),
        pools={device.name: (POOL_MEMORY,)},
        description="one device and its pool, the planners' view (mcdla.sim.one_device_system)",
    )


def evaluate_plan(workload: Workload, plan: Plan, link: PoolLink, *, device: Device | None = None,
                  budget_bytes: float | None = None, update_s_per_param_byte: float = 0.0,
                  cpu_sharing: tuple[float, float] = (1.0, 1.0)) -> SimResult:
    """Simulate ``plan`` for ``workload`` on one device whose pool is reached through ``link``.

    Args:
        device: the device (default :func:`default_device`, the dc-dla V100).
        budget_bytes: device-memory capacity (bytes); None means ``plan.budget_bytes`` (its device budget).
        update_s_per_param_byte: CPU update time of an offloaded optimizer per parameter byte (s/B; NOTE [state in
            the program] in :mod:`mcdla.sim.program`); only plans with ``state`` entries read it.
        cpu_sharing: (compute, update) stretch factors, each >= 1, while a CPU update and compute run at once
            (NOTE [CPU sharing] in :mod:`mcdla.sim.device`); (1, 1): the updates have a core of their own.

    Same semantics as ``simulate(one_device_system(device, link, budget), workload, plan)``, and exact also for
    links whose offload and prefetch bandwidths differ.
    """
    dev = device if device is not None else default_device()
    capacity = _check_capacity("budget_bytes", plan.budget_bytes if budget_bytes is None else budget_bytes)
    if dev.hbm_bytes != capacity:
        dev = dataclasses.replace(dev, hbm_bytes=capacity)
    fabric = Fabric.from_pool_link(dev, link)
    if not plan.state or (update_s_per_param_byte == 0.0 and tuple(cpu_sharing) == (1.0, 1.0)):
        return simulate_fabric(fabric, workload, plan)
    if not 0 <= update_s_per_param_byte < math.inf:
        raise SimError(f"update_s_per_param_byte: got {update_s_per_param_byte!r}; must be a finite number >= 0")
    for i, factor in enumerate(cpu_sharing):
        if not 1.0 <= factor < math.inf:
            raise SimError(f"cpu_sharing[{i}]: got {factor!r}; must be a finite number >= 1 (a stretch factor)")
    program = build_program(workload, plan, dev, model_parallel=False, n_devices=1, bucket_bytes=math.inf,
                            update_s_per_param_byte=update_s_per_param_byte)
    program = dataclasses.replace(program, cpu_sharing=(float(cpu_sharing[0]), float(cpu_sharing[1])))
    engine = Engine(fabric, [program], unlimited_virtualization=False, record=False)
    engine.run()
    return assemble(engine, workload=workload.name, planner=plan.planner, parallel="data")
