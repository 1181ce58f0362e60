"""Impossible requests get one-line errors: bad names, bad hardware, bad plans, bad arguments."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import HardwareError, McdlaError, PlanError, SimError, WorkloadError
from mcdla.hardware import PoolLink, load_system, system_from_dict, system_to_dict
from mcdla.hardware.model import Link, Memory, MemoryKind, System
from mcdla.sim import evaluate_plan, pool_link, simulate
from mcdla.workload.plan import Action

from .conftest import chain, device, offload_all, plan_of, ring_system


def _one_line(exc: pytest.ExceptionInfo[McdlaError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


def test_unknown_preset() -> None:
    """An unknown system name is a one-line HardwareError listing the presets."""
    with pytest.raises(HardwareError) as exc:
        load_system("dgx-9000")
    assert "dc-dla" in _one_line(exc)


def test_unknown_workload() -> None:
    """An unknown workload name is a one-line WorkloadError listing the zoo."""
    from mcdla.workload import load_workload

    with pytest.raises(WorkloadError) as exc:
        load_workload("no-such-net")
    assert "no-such-net" in _one_line(exc)


def test_negative_bandwidth() -> None:
    """A negative link bandwidth is rejected in the model, in files and in a pool link, on one line."""
    with pytest.raises(HardwareError) as exc:
        Link(a="x", b="y", bytes_per_s=-3.0)
    assert "-3" in _one_line(exc)
    data = system_to_dict(load_system("dc-dla"))
    data["links"][0]["bandwidth"] = "-3GB/s"
    with pytest.raises(HardwareError) as exc:
        system_from_dict(data)
    _one_line(exc)
    with pytest.raises(HardwareError) as exc:
        evaluate_plan(chain(2), plan_of(chain(2)), PoolLink.symmetric(-1e9))
    assert "offload_bytes_per_s: got -1000000000.0" in _one_line(exc)


def test_disconnected_topology() -> None:
    """Simulating a system whose nodes do not all connect is a one-line HardwareError."""
    system = System(name="split", devices=(device("a"), device("b")), rings=())
    w = chain(2)
    with pytest.raises(HardwareError) as exc:
        simulate(system, w, plan_of(w))
    assert "disconnected" in _one_line(exc)


def test_device_without_route_to_its_pool() -> None:
    """A device whose only way to its pool memory is through another device cannot route (devices never forward)."""
    system = System(
        name="detour", devices=(device("a"), device("b")),
        memories=(Memory(name="h", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=math.inf),),
        links=(Link(a="a", b="b", bytes_per_s=1e9), Link(a="b", b="h", bytes_per_s=1e9)),
        pools={"a": ("h",), "b": ("h",)}, rings=(("a", "b"),))
    w = chain(2)
    with pytest.raises(HardwareError) as exc:
        simulate(system, w, offload_all(w))
    assert "no route from 'a' to 'h'" in _one_line(exc)
    with pytest.raises(HardwareError):
        pool_link(system, "a")


def test_offload_without_a_pool() -> None:
    """A plan that offloads on a system whose devices have no pool is a one-line SimError."""
    w = chain(2)
    with pytest.raises(SimError) as exc:
        simulate(ring_system(2), w, offload_all(w))
    assert "has no pool memory" in _one_line(exc)
    assert simulate(ring_system(2), w, plan_of(w)).feasible  # keeping everything needs no pool


def test_collectives_without_rings() -> None:
    """Several devices and no rings cannot all-reduce: one-line SimError."""
    base = ring_system(2)
    system = System(name="noring", devices=base.devices, links=base.links, rings=())
    w = chain(2)
    with pytest.raises(SimError) as exc:
        simulate(system, w, plan_of(w))
    assert "no rings" in _one_line(exc)


def test_plan_for_another_workload() -> None:
    """A plan naming layers the workload does not have is a PlanError (plan.check_matches)."""
    other = chain(3, name="other")
    plan = plan_of(other, {"l2": Action.OFFLOAD})
    with pytest.raises(PlanError) as exc:
        simulate(ring_system(1), chain(2), plan)
    _one_line(exc)


def test_recompute_layer_zero() -> None:
    """Layer 0's tensor is the input: recomputing it is a PlanError."""
    w = chain(3)
    with pytest.raises(PlanError) as exc:
        simulate(ring_system(1), w, plan_of(w, {"l0": Action.RECOMPUTE}))
    assert "layer 0" in _one_line(exc)


def test_prefetch_trigger_must_be_a_later_layer() -> None:
    """A prefetch issued at a backward that runs after the one that needs it is a PlanError."""
    w = chain(3)
    plan = plan_of(w, {"l1": Action.OFFLOAD, "l0": Action.OFFLOAD}, prefetch_at={"l1": "l0"})
    with pytest.raises(PlanError) as exc:
        simulate(ring_system(1, pool_bytes_per_s=1e9), w, plan)
    assert "prefetch_at: got 'l0'" in _one_line(exc)


@pytest.mark.parametrize("kwargs,match", [
    ({"parallel": "pipeline"}, "parallel: got 'pipeline'"),
    ({"bucket_bytes": 0}, "bucket_bytes: got 0"),
    ({"bucket_bytes": math.inf}, "bucket_bytes: got inf"),
])
def test_bad_arguments(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    """Bad simulate arguments are one-line SimErrors naming the argument."""
    w = chain(2)
    with pytest.raises(SimError, match=match):
        simulate(ring_system(2), w, plan_of(w), **kwargs)


def test_unknown_device_for_pool_link() -> None:
    """pool_link for a device the system does not have is a one-line HardwareError."""
    with pytest.raises(HardwareError) as exc:
        pool_link(load_system("mc-dla"), "gpu9")
    assert "gpu9" in _one_line(exc)
