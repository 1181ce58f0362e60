"""Ring collectives as flows over the system's rings.

NOTE [ring collectives]
A collective of ``S`` bytes over ``N`` devices and ``R`` rings splits its data evenly over the rings. On each
ring it runs in synchronized steps: in every step each device sends one chunk of ``S / (R N)`` bytes to its
next device along the ring, and the step ends when every chunk has arrived plus the ring's largest hop
latency. Two simplifications keep this cheap (one flow per ring and collective instead of one per hop and
step) without changing the closed forms below:

1. A step is ONE flow over the whole ring (every hop's links, a link two hops cross counting twice): all hops
   advance at one rate, that of the most constrained hop, as in a pipelined ring, which is flow-controlled by
   its slowest link. It shares links max-min with every other flow (other rings, offloads, prefetches).
2. The ``k`` steps of a ring are one flow of ``k`` chunks followed by ``k`` hop latencies. This equals ``k``
   synchronized steps whenever the ring's rate is constant during the collective; otherwise it differs only
   in where the (microsecond) latency gaps fall. An all-reduce (reduce-scatter then
all-gather) takes ``2 (N - 1)`` steps, an all-gather or a reduce-scatter ``N - 1``. Uncontended, on rings whose
hops each have bandwidth ``B`` and latency ``l``:

    all-reduce:  2 (N - 1) / N * S / (R B) + 2 (N - 1) l
    all-gather:      (N - 1) / N * S / (R B) +     (N - 1) l

Collectives run one at a time in launch order (one communicator); one starts when every device has launched
it and the previous one has ended. Rings progress independently; the collective ends when all rings are done.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mcdla.sim.program import ALL_REDUCE, Op

if TYPE_CHECKING:
    from mcdla.sim.device import DeviceState
    from mcdla.sim.engine import Engine

__all__ = ["CollectiveRunner", "steps"]


def steps(kind: int, n_devices: int) -> int:
    """Synchronized ring steps of a collective: ``2 (N - 1)`` for an all-reduce, ``N - 1`` otherwise."""
    return 2 * (n_devices - 1) if kind == ALL_REDUCE else n_devices - 1


class _Collective:
    __slots__ = ("index", "kind", "nbytes", "label", "arrivals", "rings_left", "start_s")

    def __init__(self, index: int, op: Op) -> None:
        self.index = index
        self.kind = op.coll_kind
        self.nbytes = op.coll_bytes
        self.label = op.coll_label
        self.arrivals = 0
        self.rings_left = 0
        self.start_s = 0.0


class CollectiveRunner:
    """Launches, sequences and runs the collectives of one simulation."""

    __slots__ = ("engine", "rings", "n_devices", "collectives", "done", "done_s", "next_index", "running",
                 "total_bytes", "last_end_s")

    def __init__(self, engine: Engine, rings: tuple[int, ...], n_devices: int) -> None:
        self.engine = engine
        self.rings = rings
        self.n_devices = n_devices
        self.collectives: list[_Collective] = []
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
            self.collectives.append(_Collective(index, op))
            self.done.append(False)
            self.done_s.append(math.inf)
        coll = self.collectives[index]
        coll.arrivals += 1
        if coll.arrivals == self.n_devices:
            self._try_start(now)
        return index

    def _try_start(self, now: float) -> None:
        if self.running or self.next_index >= len(self.collectives):
            return
        coll = self.collectives[self.next_index]
        if coll.arrivals < self.n_devices:
            return
        self.running = True
        coll.start_s = now
        self.total_bytes += coll.nbytes
        n_steps = steps(coll.kind, self.n_devices)
        coll.rings_left = len(self.rings)
        engine = self.engine
        chunk = coll.nbytes / (len(self.rings) * self.n_devices)
        for ring in self.rings:
            latency = n_steps * engine.fabric.route_latency_s[ring]
            engine.transfer([(ring, n_steps * chunk)], self._ring_done, coll, now, latency_s=latency)

    def _ring_done(self, coll: _Collective, now: float) -> None:
        coll.rings_left -= 1
        if coll.rings_left == 0:
            self._finish(coll, now)

    def _finish(self, coll: _Collective, now: float) -> None:
        self.done[coll.index] = True
        self.done_s[coll.index] = now
        self.running = False
        self.next_index += 1
        self.last_end_s = now
        engine = self.engine
        if engine.spans is not None:
            engine.record_span((-1, 3, coll.label, "collective", coll.start_s, now), bytes=coll.nbytes,
                               kind="all-reduce" if coll.kind == ALL_REDUCE else "all-gather")
        for device in engine.devices:
            if device.wait_coll == coll.index:
                device.try_compute(now)
        self._try_start(now)
