"""The executor of the program IR (:mod:`mcdla.sim.ir`) on the contention-aware engine over a system's links.

Entry point: :func:`execute` (system, rank programs) -> :class:`Execution`. Every transfer (an offload, a
prefetch, a send, a collective's phase, :mod:`mcdla.sim.collective_phases`) is placed on its route through the
:class:`~mcdla.hardware.model.System` (:class:`~mcdla.hardware.topology.Topology`) and shares every link and
memory max-min fairly with all other flows in flight (:class:`~mcdla.sim.flows.FlowNetwork`, the 2018 engine's
solver); time advances over the same deterministic event queue (:class:`~mcdla.sim.events.EventQueue`).

NOTE [contention accounting]
The same programs run twice. Once on the shared fabric; once on an idle one, where every transfer (one copy, or
one phase of a collective) runs alone, sharing links only among its own flows (a collective's flows through one
port are part of its algorithm, not contention). ``contention_s`` is the difference of the two makespans. It is
split over link classes (a link's :class:`~mcdla.hardware.model.LinkKind`, ``"dram"`` for a memory, ``"hbm"`` for
a device's HBM, which its offloads and prefetches cross) in
proportion to the flow-seconds slowed there: between two rate solves, a flow going slower than it would alone
on its route adds ``dt (1 - rate / alone)`` to the class of its bottleneck (its most loaded resource) when
flows of another transfer share that bottleneck. The split says where the shared run lost time, not a
counterfactual per class.

NOTE [phase latency]
A transfer ends when its last flow has drained plus its latency: a copy's route latency; a collective phase's
``hops`` times the largest route latency among its flows (the ring's steps, the tree's fill up and down), or
for in-network, among the routes between members (a GPU-to-GPU latency to the reducing switch, one back).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcdla.errors import SimError
from mcdla.hardware.model import System
from mcdla.hardware.topology import Topology
from mcdla.sim.collective_models import Collective
from mcdla.sim.events import EventQueue
from mcdla.sim.flows import FlowNetwork, Transfer
from mcdla.sim.ir import CollectiveOp, Compute, Offload, Op, Prefetch, RankProgram, Recv, Send, validate
from mcdla.sim.ir_compile import CompiledPrograms, Parts

__all__ = ["Execution", "execute", "CollectiveFlows", "collective_flow_time"]

@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """Result of :func:`execute`.

    Attributes:
        makespan_s: end of the last operation on the shared fabric (s).
        idle_makespan_s: the same programs on an idle fabric (NOTE [contention accounting]).
        contention_s: ``makespan_s - idle_makespan_s``.
        contention_by_class_s: ``contention_s`` split over link classes (NOTE [contention accounting]).
        slowed_flow_s: the split's weights, flow-seconds slowed per link class.
        op_end_s: end of each operation on the shared fabric, by ``(rank, op name)`` (s).
        solves: max-min rate solves of the shared run.
    """

    makespan_s: float
    idle_makespan_s: float
    contention_s: float
    contention_by_class_s: dict[str, float]
    slowed_flow_s: dict[str, float]
    op_end_s: dict[tuple[int, str], float]
    solves: int


class _Meeting:
    """A rendezvous (send/recv pair or collective) waiting for its members."""

    __slots__ = ("waiting", "needed")

    def __init__(self, needed: int) -> None:
        self.waiting: list[tuple[int, int]] = []
        self.needed = needed


class _Order:
    """What both runs of one plan read of its programs, built once: per rank, the indices of the ops each op
    waits on (``wait_index``), each stream's ops in program order (``streams``), and per op the streams whose
    head may become ready when it ends (``woken``: its own, and those of the ops that wait on it)."""

    __slots__ = ("wait_index", "streams", "woken")

    def __init__(self, plan: CompiledPrograms) -> None:
        self.wait_index: dict[int, list[tuple[int, ...]]] = {}
        self.streams: dict[int, dict[str, tuple[int, ...]]] = {}
        self.woken: dict[int, list[tuple[str, ...]]] = {}
        for rank, prog in plan.programs.items():
            ops = prog.ops
            index = {op.name: i for i, op in enumerate(ops)}
            wait_index = self.wait_index[rank] = [tuple(index[w] for w in op.waits) for op in ops]
            streams: dict[str, list[int]] = {}
            for i, op in enumerate(ops):
                streams.setdefault(op.stream, []).append(i)
            self.streams[rank] = {name: tuple(ids) for name, ids in streams.items()}
            woken: list[dict[str, None]] = [{op.stream: None} for op in ops]
            for j, waits in enumerate(wait_index):
                for w in waits:
                    woken[w][ops[j].stream] = None
            self.woken[rank] = [tuple(names) for names in woken]


class _Run:
    """One run of the programs, on the shared fabric (``shared``) or an idle one (NOTE [contention accounting])."""

    def __init__(self, plan: CompiledPrograms, *, shared: bool, isolated: dict[Parts, float],
                 order: _Order | None = None) -> None:
        order = _Order(plan) if order is None else order
        self.plan = plan
        self.shared = shared
        self.isolated = isolated
        self.queue = EventQueue()
        self.net = FlowNetwork(plan.capacities, plan.routes) if shared else None
        self.ops = {rank: prog.ops for rank, prog in plan.programs.items()}
        self.done: dict[int, list[bool]] = {rank: [False] * len(ops) for rank, ops in self.ops.items()}
        self.started: dict[int, list[bool]] = {rank: [False] * len(ops) for rank, ops in self.ops.items()}
        self.wait_index = order.wait_index
        self.streams: dict[int, dict[str, deque[int]]] = {
            rank: {name: deque(ids) for name, ids in streams.items()} for rank, streams in order.streams.items()}
        # the streams whose head may become ready when op i ends (this run's queues of _Order.woken)
        self.woken: dict[int, list[tuple[deque[int], ...]]] = {}
        for rank, names in order.woken.items():
            queue_of = self.streams[rank].__getitem__
            self.woken[rank] = [tuple(map(queue_of, row)) for row in names]
        self.end_s: dict[tuple[int, str], float] = {}
        self.meetings: dict[tuple[Any, ...], _Meeting] = {}
        self.counters: dict[tuple[Any, ...], int] = {}
        self.slowed: dict[str, float] = {}

    # -- operations -------------------------------------------------------------------------------------------
    def _try_start(self, rank: int, now: float) -> None:
        ops, done, started, wait_index = self.ops[rank], self.done[rank], self.started[rank], self.wait_index[rank]
        for queue in self.streams[rank].values():
            if queue:
                head = queue[0]
                if not started[head] and all(map(done.__getitem__, wait_index[head])):
                    started[head] = True
                    self._start(rank, head, ops[head], now)

    def _complete(self, arg: tuple[int, int], now: float) -> None:
        rank, i = arg
        ops, done = self.ops[rank], self.done[rank]
        done[i] = True
        op = ops[i]
        self.end_s[(rank, op.name)] = now
        self.streams[rank][op.stream].popleft()
        started, wait_index, is_done = self.started[rank], self.wait_index[rank], done.__getitem__
        for queue in self.woken[rank][i]:
            if queue:
                head = queue[0]
                if not started[head] and all(map(is_done, wait_index[head])):
                    started[head] = True
                    self._start(rank, head, ops[head], now)

    def _meet(self, key: tuple[Any, ...], needed: int, rank: int, i: int) -> list[tuple[int, int]] | None:
        """Join rendezvous ``key``; returns every member once all ``needed`` have arrived."""
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings[key] = _Meeting(needed)
        meeting.waiting.append((rank, i))
        if len(meeting.waiting) < needed:
            return None
        del self.meetings[key]
        return meeting.waiting

    def _next(self, key: tuple[Any, ...]) -> int:
        j = self.counters.get(key, 0)
        self.counters[key] = j + 1
        return j

    def _start(self, rank: int, i: int, op: Op, now: float) -> None:
        plan = self.plan
        if isinstance(op, Compute):
            seconds = op.seconds
            if seconds is None:
                dev = plan.devices_by_name[plan.device[rank]]
                assert op.flops is not None
                seconds = op.flops / (dev.flops_per_s(op.precision) * dev.compute_efficiency)
            self.queue.push(now + seconds, self._complete, (rank, i))
        elif isinstance(op, (Offload, Prefetch)):
            parts, latency = plan.copy_parts[(rank, i)]
            self._transfer(parts, latency, self._complete, (rank, i), now)
        elif isinstance(op, (Send, Recv)):
            pair = (rank, op.peer) if isinstance(op, Send) else (op.peer, rank)
            key = ("p2p", *pair, self._next(("p2p", type(op).__name__, *pair)))
            members = self._meet(key, 2, rank, i)
            if members is not None:
                sender = next(m for m in members if isinstance(self.ops[m[0]][m[1]], Send))
                parts, latency = plan.copy_parts[sender]
                self._transfer(parts, latency, self._ends, members, now)
        else:
            assert isinstance(op, CollectiveOp)
            coll = op.collective
            key = ("coll", coll.group, self._next(("coll", coll.group, rank)))
            members = self._meet(key, coll.size, rank, i)
            if members is not None:
                self._phase((plan.collective_parts[coll], 0, members), now)

    def _ends(self, members: list[tuple[int, int]], now: float) -> None:
        for member in members:
            self._complete(member, now)

    def _phase(self, state: tuple[tuple[tuple[Parts, float], ...], int, list[tuple[int, int]]], now: float) -> None:
        phases, j, members = state
        if j == len(phases):
            self._ends(members, now)
            return
        parts, latency = phases[j]
        self._transfer(parts, latency, self._phase, (phases, j + 1, members), now)

    # -- transfers --------------------------------------------------------------------------------------------
    def _transfer(self, parts: Parts, latency_s: float, handler: Callable[[Any, float], None], arg: Any,
                  now: float) -> None:
        routes = self.plan.routes
        if self.net is None:
            self.queue.push(now + _isolated_s(self.plan, parts, self.isolated) + latency_s, handler, arg)
            return
        t = Transfer(latency_s, handler, arg)
        for route, nbytes in parts:
            if nbytes > 0.0 and routes[route]:
                self.net.add(now, route, nbytes, t)
                t.pending += 1
        if t.pending == 0:
            self.queue.push(now + latency_s, handler, arg)

    def _account(self, dt: float) -> None:
        """NOTE [contention accounting]: charge ``dt`` of the current rates' slowdowns to bottleneck classes."""
        assert self.net is not None
        plan = self.plan
        active = self.net.active()
        alone_rate = plan.alone_rate
        for route, rate, _token in active:
            if 0.0 < rate < alone_rate[route] * (1.0 - 1e-9):
                break
        else:
            return  # no flow is slowed: nothing to charge
        load: dict[int, float] = {}
        owners: dict[int, set[int]] = {}
        for route, rate, token in active:
            for res in plan.routes[route]:
                load[res] = load.get(res, 0.0) + rate
                owners.setdefault(res, set()).add(id(token))
        for route, rate, _token in active:
            alone = plan.alone_rate[route]
            if rate <= 0.0 or rate >= alone * (1.0 - 1e-9):
                continue
            neck = max(plan.routes[route], key=lambda r: load[r] / plan.capacities[r])
            if len(owners[neck]) > 1:
                cls = plan.classes[neck]
                self.slowed[cls] = self.slowed.get(cls, 0.0) + dt * (1.0 - rate / alone)

    def run(self) -> float:
        """Run every program to its end; returns the makespan (s). SimError when they deadlock."""
        queue, net = self.queue, self.net
        for rank in self.ops:
            self._try_start(rank, 0.0)
        now, last_t = 0.0, 0.0
        while True:
            if net is not None and net.dirty:
                net.recompute(now)
            t_queue = queue.peek_time()
            t_net = net.next_time if net is not None else math.inf
            now = t_queue if t_queue < t_net else t_net
            if now == math.inf:
                break
            if net is not None:
                if now > last_t:  # rates held since the last instant
                    self._account(now - last_t)
                    last_t = now
                for transfer in net.pop_finished(now):
                    transfer.pending -= 1
                    if transfer.pending == 0:
                        queue.push(now + transfer.latency_s, transfer.handler, transfer.arg)
            queue.run_until(now)
        for rank, done in self.done.items():
            if not all(done):
                op = self.ops[rank][done.index(False)]
                raise SimError(f"programs deadlock: rank {rank} op {op.name!r} never finishes (waits {op.waits}, "
                               f"stream {op.stream!r}); check the order of sends, receives and collectives")
        return max(self.end_s.values(), default=0.0)


def _isolated_s(plan: CompiledPrograms, parts: Parts, cache: dict[Parts, float]) -> float:
    """Seconds for the flows of one transfer to drain alone on the fabric (max-min among themselves)."""
    got = cache.get(parts)
    if got is not None:
        return got
    net = FlowNetwork(plan.capacities, plan.routes)
    for route, nbytes in parts:
        if nbytes > 0.0 and plan.routes[route]:
            net.add(0.0, route, nbytes, None)
    now = 0.0
    while len(net):
        net.recompute(now)
        now = net.next_time
        net.pop_finished(now)
    cache[parts] = now
    return now


def execute(system: System, programs: Iterable[RankProgram], *, devices: Mapping[int, str] | None = None,
            mirrors: Mapping[int, Sequence[str]] | None = None) -> Execution:
    """Run ``programs`` (checked by :func:`mcdla.sim.ir.validate`) on ``system`` with contention (:class:`Execution`).

    Args:
        system: the link-level hardware (``Cluster.expand()`` gives one for a generated preset).
        programs: one :class:`~mcdla.sim.ir.RankProgram` per rank; a representative subset of a large system
            folds symmetric peers (NOTE [folded ranks] in :mod:`mcdla.sim.ir`).
        devices: device name of each rank; default rank ``r`` on ``system.devices[r]``.
        mirrors: for a folded rank, the devices of the ``fold - 1`` ranks it stands for; its flows then load
            exactly the resources their mirrored routes share (otherwise every resource but its end ports).

    Raises:
        SimError: an invalid program set, a rank without a device, an unknown memory, an in-network collective
            with no switch to reduce in, mirrors that do not fit, or programs that deadlock.
        HardwareError: no route between two ends.
    """
    plan = CompiledPrograms(system, validate(programs), devices, mirrors=mirrors)
    isolated: dict[Parts, float] = {}
    order = _Order(plan)
    shared = _Run(plan, shared=True, isolated=isolated, order=order)
    makespan = shared.run()
    idle = _Run(plan, shared=False, isolated=isolated, order=order).run()
    contention = makespan - idle
    total_slowed = sum(shared.slowed.values())
    by_class = ({c: contention * s / total_slowed for c, s in sorted(shared.slowed.items())}
                if total_slowed > 0 else {})
    assert shared.net is not None
    return Execution(makespan_s=makespan, idle_makespan_s=idle, contention_s=contention,
                     contention_by_class_s=by_class, slowed_flow_s=dict(sorted(shared.slowed.items())),
                     op_end_s=dict(shared.end_s), solves=shared.net.solves)


class CollectiveFlows:
    """The flow evaluator of collectives on one system, its routes kept across evaluations.

    :meth:`time` gives the seconds a collective takes when nothing else runs: each phase of
    :func:`mcdla.sim.collective_phases.lower` alone on the system's routes (max-min among its own flows), then its
    latency (NOTE [phase latency]). On :func:`~mcdla.sim.fabric_of_dims.dims_system` it equals
    :func:`~mcdla.sim.collective_models.closed_form_time` (NOTE [why the phases equal the closed forms]).
    """

    def __init__(self, system: System, *, devices: Mapping[int, str] | None = None) -> None:
        """``devices``: device name of each rank; default rank ``r`` on ``system.devices[r]``."""
        self.system = system
        self.devices = devices
        self.topo = Topology(system)

    def time(self, collective: Collective) -> float:
        """Seconds ``collective`` takes on the idle system."""
        op = CollectiveOp(name="c", collective=collective)
        programs = validate(RankProgram(rank=r, ops=(op,)) for r in collective.group)
        plan = CompiledPrograms(self.system, programs, self.devices, self.topo)
        isolated: dict[Parts, float] = {}
        return sum(_isolated_s(plan, parts, isolated) + latency for parts, latency in plan.collective_parts[collective])


def collective_flow_time(collective: Collective, system: System, *, devices: Mapping[int, str] | None = None) -> float:
    """Seconds ``collective`` takes alone on ``system`` by its flow phases (:meth:`CollectiveFlows.time`)."""
    return CollectiveFlows(system, devices=devices).time(collective)
