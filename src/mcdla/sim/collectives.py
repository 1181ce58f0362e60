"""The 2018 engine's communicator: its collectives as :class:`~mcdla.sim.collective_models.Collective` s, lowered
by :func:`~mcdla.sim.collective_phases.lower` and placed on the system's rings.

NOTE [ring collectives]
A collective of ``S`` bytes over ``N`` devices and ``R`` rings splits its data evenly over the rings: on ring
``r`` it is the ring :class:`~mcdla.sim.collective_models.Collective` of ``S / R`` bytes whose group is the
ring's devices in ring order (``Fabric.ring_groups``). Its phases come from
:func:`~mcdla.sim.collective_phases.lower`, the one lowering the IR executor uses too: one phase in which each
device sends its next device ``s`` chunks of ``S / (R N)`` bytes (``s = 2 (N - 1)`` for an all-reduce, ``N - 1``
for an all-gather), then ``s`` hop latencies. The 2018 engine places such a phase as ONE flow of ``s`` chunks
over the whole ring (``Fabric.rings``: every hop's links along the ring, a link two hops cross counting twice):
all hops advance at one rate, that of the most constrained hop, as in a pipelined ring, which is flow-controlled
by its slowest link. The flow shares links max-min with every other flow (other rings, offloads, prefetches).
Running the ``s`` steps as one flow followed by ``s`` hop latencies equals ``s`` synchronized steps whenever
the ring's rate is constant during the collective; otherwise it differs only in where the (microsecond)
latency gaps fall. Uncontended, on rings whose hops each have bandwidth ``B`` and latency ``l``, this is the
closed form of :func:`~mcdla.sim.collective_models.closed_form_time` with bus bandwidth ``R B``:

    all-reduce:  2 (N - 1) / N * S / (R B) + 2 (N - 1) l
    all-gather:      (N - 1) / N * S / (R B) +     (N - 1) l

With ``collective_algorithm`` ``"tree"`` or ``"in-network"`` (``simulate``'s argument) a collective is instead
ONE :class:`~mcdla.sim.collective_models.Collective` of all ``S`` bytes over every device in rank order; each
flow of each phase runs on its own route (``Fabric.flow_routes``: the topology's route between its ends, an
in-network group reducing in :func:`~mcdla.sim.ir_compile.reducer_switch`, as in the IR executor), and a
phase ends ``hops`` hop latencies after its last flow drains (NOTE [phase latency] in
:mod:`mcdla.sim.ir_engine`). On an idle fabric of private ports this is the closed form of that algorithm.

Collectives run one at a time in launch order (one communicator); one starts when every device has launched
it and the previous one has ended. Rings progress independently, each through its phases in order; the
collective ends when all rings are done.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from mcdla.sim.collective_models import Collective
from mcdla.sim.collective_phases import Phase, lower
from mcdla.sim.program import Op

if TYPE_CHECKING:
    from mcdla.sim.device import DeviceState
    from mcdla.sim.engine import Engine

__all__ = ["CollectiveRunner"]


@lru_cache(maxsize=4096)
def _phases(kind: str, nbytes: float, group: tuple[int, ...], algorithm: str) -> tuple[Phase, ...]:
    """The phases of one collective (kept: an iteration launches the same few sizes many times)."""
    return lower(Collective(kind=kind, nbytes=nbytes, group=group, algorithm=algorithm))


class _Launch:
    """One collective of the programs: what the devices launched, and its progress over the rings."""

    __slots__ = ("index", "kind", "nbytes", "label", "arrivals", "rings_left", "start_s")

    def __init__(self, index: int, op: Op) -> None:
        self.index = index
        self.kind = op.coll_kind
        self.nbytes = op.coll_bytes
        self.label = op.coll_label
        self.arrivals = 0
        self.rings_left = 0
        self.start_s = 0.0


class _RingRun:
    """The phases of one launch still to run on ring ``ring`` (-1: the whole group, tree or in-network)."""

    __slots__ = ("launch", "ring", "phases", "next_phase")

    def __init__(self, launch: _Launch, ring: int, phases: tuple[Phase, ...]) -> None:
        self.launch = launch
        self.ring = ring
        self.phases = phases
        self.next_phase = 0


class CollectiveRunner:
    """Launches, sequences and runs the collectives of one simulation (NOTE [ring collectives])."""

    __slots__ = ("engine", "algorithm", "rings", "groups", "hops", "flow_routes", "n_devices", "collectives", "done",
                 "done_s", "next_index", "running", "total_bytes", "last_end_s")

    def __init__(self, engine: Engine) -> None:
        fabric = engine.fabric
        self.engine = engine
        self.algorithm = fabric.collective_algorithm
        self.flow_routes = fabric.flow_routes
        self.rings = fabric.rings
        self.groups = fabric.ring_groups
        self.hops = [frozenset(zip(g, g[1:] + g[:1])) for g in self.groups]
        self.n_devices = len(fabric.devices)
        self.collectives: list[_Launch] = []
        self.done: list[bool] = []
        self.done_s: list[float] = []
        self.next_index = 0
        self.running = False
        self.total_bytes = 0.0
        self.last_end_s = 0.0

    @property
    def all_done(self) -> bool:
        return self.next_index == len(self.collectives) and not self.running

    def arrive(self, device: DeviceState, op: Op, now: float) -> int:
        """``device`` launches its next collective (described by ``op``); returns the collective's index."""
        index = device.coll_count
        device.coll_count += 1
        if index == len(self.collectives):
            self.collectives.append(_Launch(index, op))
            self.done.append(False)
            self.done_s.append(math.inf)
        launch = self.collectives[index]
        launch.arrivals += 1
        if launch.arrivals == self.n_devices:
            self._try_start(now)
        return index

    def _try_start(self, now: float) -> None:
        if self.running or self.next_index >= len(self.collectives):
            return
        launch = self.collectives[self.next_index]
        if launch.arrivals < self.n_devices:
            return
        self.running = True
        launch.start_s = now
        self.total_bytes += launch.nbytes
        if self.algorithm != "ring":
            launch.rings_left = 1
            group = tuple(range(self.n_devices))
            self._next_phase(_RingRun(launch, -1, _phases(launch.kind, launch.nbytes, group, self.algorithm)), now)
            return
        share = launch.nbytes / len(self.rings)
        launch.rings_left = len(self.rings)
        for ring, group in enumerate(self.groups):
            self._next_phase(_RingRun(launch, ring, _phases(launch.kind, share, group, "ring")), now)

    def _next_phase(self, run: _RingRun, now: float) -> None:
        """Start ``run``'s next phase, or end its ring when none is left."""
        if run.next_phase == len(run.phases):
            self._ring_done(run.launch, now)
            return
        phase = run.phases[run.next_phase]
        run.next_phase += 1
        parts = self._place(phase, run.ring)
        latency_s = self.engine.fabric.route_latency_s
        if phase.hop_pairs:
            hop = max(latency_s[self.flow_routes[pair]] for pair in phase.hop_pairs)
        else:
            hop = max(latency_s[route] for route, _nbytes in parts)
        self.engine.transfer(parts, self._phase_done, run, now, latency_s=phase.hops * hop)

    def _phase_done(self, run: _RingRun, now: float) -> None:
        self._next_phase(run, now)

    def _place(self, phase: Phase, ring: int) -> list[tuple[int, float]]:
        """``(route id, bytes)`` of each flow of ``phase``: on ring ``ring``, one pipelined flow over the ring;
        for tree and in-network (``ring`` -1), each flow on its own route (NOTE [ring collectives])."""
        if ring < 0:
            return [(self.flow_routes[(f.src, f.dst)], f.nbytes) for f in phase.flows]
        assert {(f.src, f.dst) for f in phase.flows} == self.hops[ring], "a ring phase steps along its ring"
        assert len({f.nbytes for f in phase.flows}) == 1, "every member of a ring step sends one size"
        return [(self.rings[ring], phase.flows[0].nbytes)]

    def _ring_done(self, launch: _Launch, now: float) -> None:
        launch.rings_left -= 1
        if launch.rings_left == 0:
            self._finish(launch, now)

    def _finish(self, launch: _Launch, now: float) -> None:
        self.done[launch.index] = True
        self.done_s[launch.index] = now
        self.running = False
        self.next_index += 1
        self.last_end_s = now
        engine = self.engine
        if engine.spans is not None:
            engine.record_span((-1, 3, launch.label, "collective", launch.start_s, now), bytes=launch.nbytes,
                               kind=launch.kind)
        for device in engine.devices:
            if device.wait_coll == launch.index:
                device.try_compute(now)
        self._try_start(now)
