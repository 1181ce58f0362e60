"""The program IR executor (mcdla.sim.ir_engine) on hand-built systems: every answer computed independently
(closed forms worked by hand, the closed-form collective evaluator, the unfolded program)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import SimError
from mcdla.hardware import FabricDim, LinkKind
from mcdla.hardware.model import Device, Link, Memory, MemoryKind, Switch, System
from mcdla.sim.collective_models import Collective, closed_form_time
from mcdla.sim.fabric import Fabric
from mcdla.sim.fabric_of_dims import dims_system
from mcdla.sim.flows import max_min_rates
from mcdla.sim.ir import CollectiveOp, Compute, Offload, Op, Prefetch, RankProgram, Recv, Send
from mcdla.sim.ir_engine import execute

_FLOPS = {"fp16": 1e15}


def _gpus(n: int) -> tuple[Device, ...]:
    return tuple(Device(name=f"g{i}", peak_flops_per_s=_FLOPS, hbm_bytes=80e9, hbm_bytes_per_s=3e12, source="test")
                 for i in range(n))


def _host(dram: float = 1e13) -> Memory:
    return Memory(name="host", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=dram, source="test")


def test_compute_overlaps_an_offload_and_waits_order_a_prefetch() -> None:
    """One rank, 10 GB/s PCIe with 1 us: compute 0.2 s || offload 1 GB (0.1 s + 1 us) end at 0.2 s; a prefetch
    waiting for both ends at 0.2 + 0.1 + 1e-6 s; 7 TFLOP at 1 PFLOP/s x 0.7 take 0.01 s."""
    system = System(name="one", devices=_gpus(1), memories=(_host(),),
                    links=(Link(a="g0", b="host", bytes_per_s=10e9, latency_s=1e-6, kind=LinkKind.PCIE),))
    prog = RankProgram(rank=0, ops=(
        Compute(name="f", seconds=0.2), Offload(name="o", nbytes=1e9, memory="host"),
        Prefetch(name="p", nbytes=1e9, memory="host", waits=("f", "o")),
        Compute(name="b", flops=7e12, waits=("p",))))
    run = execute(system, [prog])
    assert run.op_end_s[(0, "o")] == pytest.approx(0.1 + 1e-6, rel=1e-12)
    assert run.op_end_s[(0, "f")] == pytest.approx(0.2, rel=1e-12)
    assert run.op_end_s[(0, "p")] == pytest.approx(0.3 + 1e-6, rel=1e-12)
    assert run.makespan_s == pytest.approx(0.31 + 1e-6, rel=1e-12)
    assert run.contention_s == 0.0 and run.contention_by_class_s == {}


def _shared_uplink() -> System:
    """g0, g1 -- 100 GB/s -- switch -- 10 GB/s PCIe -- host."""
    return System(name="uplink", devices=_gpus(2), memories=(_host(),), switches=(Switch(name="sw"),), links=(
        Link(a="g0", b="sw", bytes_per_s=100e9, kind=LinkKind.NVLINK),
        Link(a="g1", b="sw", bytes_per_s=100e9, kind=LinkKind.NVLINK),
        Link(a="sw", b="host", bytes_per_s=10e9, kind=LinkKind.PCIE)))


def test_two_flows_on_one_link_get_half_each() -> None:
    """Two 1 GB offloads through one 10 GB/s link: 5 GB/s each, 0.2 s instead of 0.1 s alone; the 0.1 s lost is
    PCIe's."""
    progs = [RankProgram(rank=r, ops=(Offload(name="o", nbytes=1e9, memory="host"),)) for r in (0, 1)]
    run = execute(_shared_uplink(), progs)
    assert run.makespan_s == pytest.approx(0.2, rel=1e-12)
    assert run.idle_makespan_s == pytest.approx(0.1, rel=1e-12)
    assert run.contention_by_class_s == pytest.approx({"pcie": 0.1}, rel=1e-12)


@pytest.mark.parametrize("alg", ["ring", "tree", "in-network"])
def test_collective_on_an_idle_fabric_equals_the_closed_form(alg: str) -> None:
    """A hierarchical all-reduce run as an IR op on 4 x 3 ranks of the dimension star takes the closed form."""
    dims = (FabricDim(name="nv", size=4, bytes_per_s=400e9, latency_s=1e-6, kind=LinkKind.NVLINK),
            FabricDim(name="ib", size=3, bytes_per_s=50e9, latency_s=5e-6, kind=LinkKind.NETWORK))
    coll = Collective(kind="all-reduce", nbytes=2e9, group=tuple(range(12)), levels=(4, 3), algorithm=(alg, alg))
    progs = [RankProgram(rank=r, ops=(CollectiveOp(name="ar", collective=coll),)) for r in range(12)]
    run = execute(dims_system(dims), progs)
    assert run.makespan_s == pytest.approx(closed_form_time(coll, dims), rel=1e-9)
    assert run.contention_s == pytest.approx(0.0, abs=1e-15)


def test_all_reduce_sharing_a_port_with_an_offload() -> None:
    """Ring all-reduce of 1 GB on g0, g1 (each ring flow 1 GB) while g0 offloads 0.5 GB through its 100 GB/s port:
    both at 50 GB/s until the offload ends at 0.01 s, then the ring's last 0.5 GB at 100 GB/s: 0.015 s + 2 hops
    of 1 us. Alone: 0.01 s + 2 us. The 5 ms lost is NVLink's."""
    system = System(name="pair", devices=_gpus(2), memories=(_host(),), switches=(Switch(name="sw"),), links=(
        Link(a="g0", b="sw", bytes_per_s=100e9, latency_s=0.5e-6, kind=LinkKind.NVLINK),
        Link(a="g1", b="sw", bytes_per_s=100e9, latency_s=0.5e-6, kind=LinkKind.NVLINK),
        Link(a="sw", b="host", bytes_per_s=1e12, kind=LinkKind.PCIE)))
    coll = Collective(kind="all-reduce", nbytes=1e9, group=(0, 1))
    progs = [RankProgram(rank=0, ops=(CollectiveOp(name="ar", collective=coll),
                                      Offload(name="o", nbytes=0.5e9, memory="host"))),
             RankProgram(rank=1, ops=(CollectiveOp(name="ar", collective=coll),))]
    run = execute(system, progs)
    assert run.op_end_s[(0, "o")] == pytest.approx(0.01 + 0.5e-6, rel=1e-12)
    assert run.op_end_s[(0, "ar")] == pytest.approx(0.015 + 2e-6, rel=1e-12)
    assert run.idle_makespan_s == pytest.approx(0.01 + 2e-6, rel=1e-12)
    assert run.contention_by_class_s == pytest.approx({"nvlink": 0.005}, rel=1e-9)


def _two_switches() -> System:
    """g0, g1 on PCIe switch pa; g2, g3 on pb; pa and pb -- 20 GB/s -- core -- host."""
    links = [Link(a=f"g{i}", b="pa" if i < 2 else "pb", bytes_per_s=16e9, latency_s=1e-6, kind=LinkKind.PCIE)
             for i in range(4)]
    links += [Link(a=s, b="core", bytes_per_s=20e9, latency_s=1e-6, kind=LinkKind.PCIE) for s in ("pa", "pb")]
    links.append(Link(a="core", b="host", bytes_per_s=30e9, kind=LinkKind.CPU_INTERCONNECT))
    return System(name="two", devices=_gpus(4), memories=(_host(dram=25e9),),
                  switches=(Switch(name="pa"), Switch(name="pb"), Switch(name="core")), links=tuple(links))


def _sender(rank: int, peer: int, fold: int = 1) -> RankProgram:
    return RankProgram(rank=rank, fold=fold, ops=(
        Compute(name="f", seconds=0.01), Offload(name="o", nbytes=1e9, memory="host"),
        Send(name="s", nbytes=0.6e9, peer=peer, waits=("f",)),
        Prefetch(name="p", nbytes=1e9, memory="host", waits=("o", "s"))))


def _receiver(rank: int, peer: int, fold: int = 1) -> RankProgram:
    return RankProgram(rank=rank, fold=fold, ops=(
        Offload(name="o", nbytes=0.4e9, memory="host"), Recv(name="r", nbytes=0.6e9, peer=peer),
        Compute(name="b", seconds=0.02, waits=("r",))))


def test_folded_program_equals_the_unfolded_one() -> None:
    """Ranks 0 -> 2 with fold 2 stand for 0 -> 2 and 1 -> 3 on mirrored devices: shared uplinks, core and DRAM
    see both; the makespan and every op's end equal the four-rank run's."""
    full = execute(_two_switches(), [_sender(0, 2), _sender(1, 3), _receiver(2, 0), _receiver(3, 1)])
    folded = execute(_two_switches(), [_sender(0, 2, fold=2), _receiver(2, 0, fold=2)])
    mirrored = execute(_two_switches(), [_sender(0, 2, fold=2), _receiver(2, 0, fold=2)],
                       mirrors={0: ("g1",), 2: ("g3",)})
    for run in (folded, mirrored):
        assert run.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
        for key, end in run.op_end_s.items():
            assert end == pytest.approx(full.op_end_s[key], rel=1e-12)
    alone = execute(_two_switches(), [_sender(0, 2), _receiver(2, 0)])
    assert alone.makespan_s < full.makespan_s  # the fold does load the shared links


def test_folded_program_with_mirrors_equals_the_unfolded_one() -> None:
    """Rank 0 on g0 with mirror g2 (the other PCIe switch): only core -> host and the DRAM are shared, not pa's
    uplink; the run equals g0 and g2 offloading and prefetching themselves, and differs from the fold without
    mirrors (which loads pa's uplink twice)."""
    def prog(rank: int, fold: int = 1) -> RankProgram:
        return RankProgram(rank=rank, fold=fold, ops=(Offload(name="o", nbytes=1e9, memory="host"),
                                                      Prefetch(name="p", nbytes=0.5e9, memory="host", waits=("o",))))
    full = execute(_two_switches(), [prog(0), prog(2)])
    mirrored = execute(_two_switches(), [prog(0, fold=2)], mirrors={0: ("g2",)})
    assert mirrored.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
    assert mirrored.op_end_s[(0, "o")] == pytest.approx(full.op_end_s[(0, "o")], rel=1e-12)
    heavy = execute(_two_switches(), [prog(0, fold=2)])
    assert heavy.makespan_s > mirrored.makespan_s * 1.05


def test_bad_mirrors_are_one_line_errors() -> None:
    """A mirror list of the wrong length, and a mirror on a device a rank uses."""
    progs = [RankProgram(rank=0, fold=2, ops=(Offload(name="o", nbytes=1.0, memory="host"),))]
    with pytest.raises(SimError, match=r"mirrors\[0\]: got \('g1', 'g2'\); must name 1 devices"):
        execute(_two_switches(), progs, mirrors={0: ("g1", "g2")})
    with pytest.raises(SimError, match="got a device twice"):
        execute(_two_switches(), progs, mirrors={0: ("g0",)})


def test_deadlock_is_one_line_error() -> None:
    """Two ranks that each receive before sending never start: one-line SimError naming the first stuck op."""
    progs = [RankProgram(rank=r, ops=(Recv(name="r", nbytes=1.0, peer=1 - r, stream="s"),
                                      Send(name="s", nbytes=1.0, peer=1 - r, stream="s"))) for r in (0, 1)]
    with pytest.raises(SimError, match="programs deadlock: rank 0 op 'r' never finishes") as err:
        execute(_shared_uplink(), progs)
    assert "\n" not in str(err.value)


def test_unknown_memory_is_one_line_error() -> None:
    """An offload to a memory the system lacks names the op, the memory and the system's memories."""
    with pytest.raises(SimError, match=r"rank 0 op 'o'.memory: got 'cxl'; must be a memory of system 'uplink' \(host\)"):
        execute(_shared_uplink(), [RankProgram(rank=0, ops=(Offload(name="o", nbytes=1.0, memory="cxl"),))])


@st.composite
def _mirrored_pair(draw: st.DrawFn) -> tuple[list[RankProgram], list[RankProgram]]:
    """Random programs for a sender on pa and a receiver on pb (with one send of random size at random places),
    as two ranks of fold 2 and as the four ranks they stand for."""
    def ops(peer_send: int | None, peer_recv: int | None) -> list[Op]:
        out: list[Op] = []
        for i in range(draw(st.integers(1, 5))):
            kind = draw(st.sampled_from(("compute", "offload", "prefetch")))
            waits = (out[-1].name,) if out and draw(st.booleans()) else ()
            size = draw(st.floats(1e6, 2e9))
            out.append(Compute(name=f"c{i}", seconds=size / 1e11, waits=waits) if kind == "compute" else
                       Offload(name=f"o{i}", nbytes=size, memory="host", waits=waits) if kind == "offload" else
                       Prefetch(name=f"p{i}", nbytes=size, memory="host", waits=waits))
        at = draw(st.integers(0, len(out)))
        nbytes = 3e8
        if peer_send is not None:
            out.insert(at, Send(name="s", nbytes=nbytes, peer=peer_send))
        if peer_recv is not None:
            out.insert(at, Recv(name="r", nbytes=nbytes, peer=peer_recv))
        return out

    sender, receiver = ops(2, None), ops(None, 0)
    full = [RankProgram(rank=0, ops=tuple(sender)), RankProgram(rank=1, ops=tuple(_peer(sender, 3))),
            RankProgram(rank=2, ops=tuple(receiver)), RankProgram(rank=3, ops=tuple(_peer(receiver, 1)))]
    folded = [RankProgram(rank=0, ops=tuple(sender), fold=2), RankProgram(rank=2, ops=tuple(receiver), fold=2)]
    return full, folded


def _peer(ops: list[Op], peer: int) -> list[Op]:
    return [dataclasses.replace(op, peer=peer) if isinstance(op, (Send, Recv)) else op for op in ops]


@settings(max_examples=40, deadline=None)
@given(_mirrored_pair())
def test_random_folded_programs_equal_the_unfolded_ones(case: tuple[list[RankProgram], list[RankProgram]]) -> None:
    """Any mix of compute, copies and a send on ranks 0 -> 2 folded x2 with mirrors g1, g3: every op ends when
    it does in the four-rank run of the same programs."""
    full_progs, folded_progs = case
    full = execute(_two_switches(), full_progs)
    folded = execute(_two_switches(), folded_progs, mirrors={0: ("g1",), 2: ("g3",)})
    for key, end in folded.op_end_s.items():
        assert end == pytest.approx(full.op_end_s[key], rel=1e-9)


def test_offload_and_prefetch_share_the_devices_hbm() -> None:
    """A device whose HBM (40 GB/s) is slower than its two link directions (100 GB/s each): an offload and a
    prefetch of 1 GB at once share the HBM, 20 GB/s each, 0.05 s; alone each takes 1 GB / 40 GB/s = 0.025 s, and
    the 0.025 s lost is the HBM's. The 2018 engine runs the same copies in the same time (one copy placement)."""
    slow = dataclasses.replace(_gpus(1)[0], hbm_bytes_per_s=40e9)
    system = System(name="slow-hbm", devices=(slow,), memories=(_host(),), pools={"g0": ("host",)},
                    links=(Link(a="g0", b="host", bytes_per_s=100e9, kind=LinkKind.PCIE),))
    prog = RankProgram(rank=0, ops=(Offload(name="o", nbytes=1e9, memory="host"),
                                    Prefetch(name="p", nbytes=1e9, memory="host")))
    run = execute(system, [prog])
    assert run.makespan_s == pytest.approx(1e9 / 20e9, rel=1e-12)
    assert run.idle_makespan_s == pytest.approx(1e9 / 40e9, rel=1e-12)
    assert run.contention_by_class_s == pytest.approx({"hbm": 1e9 / 40e9}, rel=1e-12)
    fabric = Fabric.from_system(system)
    (_mem, off), = fabric.offload_routes[0]
    (_mem, pre), = fabric.prefetch_routes[0]
    rates = max_min_rates(fabric.capacities, [fabric.routes[off], fabric.routes[pre]])
    assert rates == pytest.approx([20e9, 20e9], rel=1e-12)
