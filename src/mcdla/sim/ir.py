"""The program IR: per-rank ordered operations on streams, run by :mod:`mcdla.sim.ir_engine`.

A lowering (an LLM execution, a hand-written scenario) describes what every rank does as a
:class:`RankProgram`: an ordered list of operations, each on a named stream. The executor needs no model
knowledge: durations, bytes, memory tiers, peers and communicator groups are all given.

NOTE [IR dependencies]
An operation starts when (1) the operation before it on the same stream of the same rank has finished (program
order per stream), (2) every operation named in its ``waits`` (same rank, earlier in the program) has finished,
and (3) for a :class:`Send` / :class:`Recv` pair, both ends have started (a rendezvous, as NCCL's p2p); for a
:class:`CollectiveOp`, every member of the group has started its matching operation. Matching is by order: the
j-th send from rank a to rank b meets the j-th receive on b from a; the j-th collective a rank runs on a given
group (the rank tuple) meets the j-th each other member runs on it. Streams run concurrently, so compute on
``"compute"`` overlaps an offload on ``"offload"`` unless a wait orders them.

NOTE [folded ranks]
A rank with ``fold = k`` stands for ``k`` identical ranks that run the same program on mirrored devices (the
other tensor-parallel peers of a pipeline stage, the other data-parallel replicas), so a representative set of
ranks loads shared links (a PCIe switch's uplink, a memory's DRAM, a spine) as the full system would. Given the
mirrors' devices (``execute(..., mirrors=)``), each flow is placed at its own ends and at each mirror's (a peer
rank's mirror, the same slot of the mirror's memory pool), and every resource on its route counts as many times
as those ``k`` routes cross it. Without them, its flows count ``k`` times on every resource except the links at
their own two end devices (each mirror has its own ports): right for mirrors that share everything behind their
ports (peers under one PCIe switch), too heavy for mirrors in other nodes. Ranks that exchange data (a
send/recv pair, a collective's members) must have one fold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from mcdla.errors import SimError
from mcdla.sim.collective_models import Collective

__all__ = ["Compute", "Offload", "Prefetch", "Send", "Recv", "CollectiveOp", "Op", "RankProgram", "validate"]


def _nonneg(owner: str, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SimError(f"{owner}.{field}: got {value!r}; must be a finite number >= 0")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class _OpBase:
    name: str
    stream: str
    waits: tuple[str, ...] = ()

    def _check(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SimError(f"op name: got {self.name!r}; must be a non-empty string")
        object.__setattr__(self, "waits", tuple(self.waits))


@dataclass(frozen=True, slots=True, kw_only=True)
class Compute(_OpBase):
    """Work on a stream for ``seconds``, or ``flops`` at the device's ``precision`` peak x its compute efficiency."""

    stream: str = "compute"
    seconds: float | None = None
    flops: float | None = None
    precision: str = "fp16"

    def __post_init__(self) -> None:
        self._check()
        if (self.seconds is None) == (self.flops is None):
            raise SimError(f"op {self.name!r}: got seconds={self.seconds!r}, flops={self.flops!r}; must give exactly one")
        if self.seconds is not None:
            object.__setattr__(self, "seconds", _nonneg(f"op {self.name!r}", "seconds", self.seconds))
        else:
            object.__setattr__(self, "flops", _nonneg(f"op {self.name!r}", "flops", self.flops))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Copy(_OpBase):
    nbytes: float

    def __post_init__(self) -> None:
        self._check()
        object.__setattr__(self, "nbytes", _nonneg(f"op {self.name!r}", "nbytes", self.nbytes))


@dataclass(frozen=True, slots=True, kw_only=True)
class Offload(_Copy):
    """Copy ``nbytes`` from the rank's device to the system memory ``memory`` (a pool tier)."""

    stream: str = "offload"
    memory: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefetch(_Copy):
    """Copy ``nbytes`` from the system memory ``memory`` back to the rank's device."""

    stream: str = "prefetch"
    memory: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Send(_Copy):
    """Send ``nbytes`` to rank ``peer`` (pipeline activations, gradients)."""

    stream: str = "send"
    peer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Recv(_Copy):
    """Receive ``nbytes`` from rank ``peer``."""

    stream: str = "recv"
    peer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveOp(_OpBase):
    """This rank's part in ``collective`` (every member runs a matching one)."""

    stream: str = "comm"
    collective: Collective

    def __post_init__(self) -> None:
        self._check()
        if not isinstance(self.collective, Collective):
            raise SimError(f"op {self.name!r}.collective: got {type(self.collective).__name__}; must be a Collective")


Op = Compute | Offload | Prefetch | Send | Recv | CollectiveOp


@dataclass(frozen=True, slots=True, kw_only=True)
class RankProgram:
    """What rank ``rank`` runs: ``ops`` in program order; ``fold`` ranks it stands for (NOTE [folded ranks])."""

    rank: int
    ops: tuple[Op, ...]
    fold: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise SimError(f"program rank: got {self.rank!r}; must be an integer >= 0")
        if isinstance(self.fold, bool) or not isinstance(self.fold, int) or self.fold < 1:
            raise SimError(f"rank {self.rank} fold: got {self.fold!r}; must be an integer >= 1")
        object.__setattr__(self, "ops", tuple(self.ops))


def _signature(c: Collective) -> tuple[object, ...]:
    return (c.kind, c.nbytes, c.levels, c.algorithm)


def validate(programs: Iterable[RankProgram]) -> dict[int, RankProgram]:
    """Check a set of rank programs (NOTE [IR dependencies]); returns them by rank.

    Raises:
        SimError (one line): a repeated rank or op name, a wait on an unknown or later op, a peer or group
        member with no program, a send without its receive (or bytes that differ), a collective that a member
        does not run or runs with other bytes, kind, levels or algorithm, or exchanging ranks of different folds.
    """
    by_rank: dict[int, RankProgram] = {}
    for prog in programs:
        if not isinstance(prog, RankProgram):
            raise SimError(f"programs: got {type(prog).__name__}; must be RankProgram")
        if prog.rank in by_rank:
            raise SimError(f"programs: rank {prog.rank} has two programs; must have one")
        by_rank[prog.rank] = prog
    sends: dict[tuple[int, int], list[float]] = {}
    recvs: dict[tuple[int, int], list[float]] = {}
    colls: dict[tuple[int, ...], dict[int, list[tuple[str, Collective]]]] = {}
    for rank, prog in by_rank.items():
        seen: set[str] = set()
        for op in prog.ops:
            where = f"rank {rank} op {op.name!r}"
            if op.name in seen:
                raise SimError(f"{where}: name repeated; op names must be unique within a rank")
            for w in op.waits:
                if w not in seen:
                    raise SimError(f"{where}.waits: got {w!r}; must name an earlier op of rank {rank}")
            seen.add(op.name)
            if isinstance(op, (Send, Recv)):
                if op.peer not in by_rank or op.peer == rank:
                    raise SimError(f"{where}.peer: got {op.peer!r}; must be another rank with a program "
                                   f"({_ranks(by_rank)})")
                if by_rank[op.peer].fold != prog.fold:
                    raise SimError(f"{where}.peer: rank {op.peer} has fold {by_rank[op.peer].fold}, rank {rank} "
                                   f"{prog.fold}; ranks that exchange data must have one fold")
                key = (rank, op.peer) if isinstance(op, Send) else (op.peer, rank)
                (sends if isinstance(op, Send) else recvs).setdefault(key, []).append(op.nbytes)
            elif isinstance(op, CollectiveOp):
                group = op.collective.group
                if rank not in group:
                    raise SimError(f"{where}.collective.group: got {group}; must contain rank {rank}")
                for member in group:
                    if member not in by_rank:
                        raise SimError(f"{where}.collective.group: member {member} has no program ({_ranks(by_rank)})")
                    if by_rank[member].fold != prog.fold:
                        raise SimError(f"{where}.collective.group: member {member} has fold {by_rank[member].fold}, "
                                       f"rank {rank} {prog.fold}; members must have one fold")
                colls.setdefault(group, {}).setdefault(rank, []).append((op.name, op.collective))
    for key in sends.keys() | recvs.keys():
        s, r = sends.get(key, []), recvs.get(key, [])
        if len(s) != len(r):
            raise SimError(f"rank {key[0]} sends {len(s)} times to rank {key[1]}, which receives {len(r)} times from "
                           f"it; every send must meet one receive")
        for j, (a, b) in enumerate(zip(s, r)):
            if a != b:
                raise SimError(f"send {j} from rank {key[0]} to rank {key[1]}: got {a!r} bytes sent, {b!r} received; "
                               "must be equal")
    for group, members in colls.items():
        first = members[group[0]] if group[0] in members else []
        for member in group:
            mine = members.get(member, [])
            if len(mine) != len(first):
                raise SimError(f"collectives on group {group}: rank {member} runs {len(mine)}, rank {group[0]} "
                               f"{len(first)}; every member must run each one")
            for (name_a, a), (name_b, b) in zip(first, mine):
                if _signature(a) != _signature(b):
                    raise SimError(f"collective {name_b!r} of rank {member} on group {group}: got {b.kind} of "
                                   f"{b.nbytes!r} bytes ({b.algorithm}); rank {group[0]}'s {name_a!r} is {a.kind} of "
                                   f"{a.nbytes!r} bytes ({a.algorithm}); members must agree")
    return by_rank


def _ranks(by_rank: dict[int, RankProgram]) -> str:
    ranks = sorted(by_rank)
    return f"ranks {ranks[0]}..{ranks[-1]}" if len(ranks) > 8 else f"ranks {ranks}"

