"""The chain instance every planner reads: per-layer times and bytes, the link's transfer times, plan building.

A planner sees a workload as a chain ``F_0..F_{L-1}, B_{L-1}..B_0`` (``docs/timing-model.md``). The time and
the bytes of each operation are read off the engine's own program (:func:`build_chain`), so that a planner's
internal model and the engine can never disagree on what an operation costs: saved tensor ``S_i``, forward
transient (output + workspace), backward transient (2 * output + workspace), static bytes ``W``.

NOTE [trigger index]: a prefetch trigger is an integer ``k``: ``k in i+1..L-1`` is "when ``B_k`` starts" and
``k == L`` is "at the end of forward" (only allowed for the last layer, whose prefetch has no earlier backward
to start from). A larger ``k`` is an earlier time. This is the encoding the solvers use; :func:`build_plan`
turns it into layer names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mcdla.errors import PlanError
from mcdla.hardware.model import Device
from mcdla.hardware.pool_link import PoolLink
from mcdla.sim import BACKWARD, FORWARD, build_program, default_device
from mcdla.workload.model import LayerKind, Workload
from mcdla.workload.plan import Action, Plan

__all__ = ["Chain", "LinkTimes", "build_chain", "link_times", "build_plan", "triggers_of", "saved_cap"]

_BUCKET_BYTES = 25 * 2**20  # irrelevant on one device (no collectives); the engine's default


@dataclass(frozen=True, slots=True, kw_only=True)
class Chain:
    """A training step as planners see it.

    Attributes:
        workload, batch: what the chain was made from (copied into plans).
        names: layer names, in forward order.
        kinds: layer kinds (the vDNN ``conv`` policy keys off them).
        fwd_s, bwd_s: compute time of ``F_i`` and ``B_i`` (seconds), as the engine computes them.
        saved_bytes: ``S_i``, bytes of layer ``i``'s saved tensor.
        fwd_transient_bytes: bytes allocated for the duration of ``F_i`` besides ``S_i`` (output + workspace).
        bwd_transient_bytes: bytes allocated for the duration of ``B_i`` (2 * output + workspace).
        static_bytes: ``W``, bytes resident for the whole step (weights, gradients, optimizer state).
    """

    workload: str
    batch: int
    names: tuple[str, ...]
    kinds: tuple[LayerKind, ...]
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    fwd_transient_bytes: tuple[float, ...]
    bwd_transient_bytes: tuple[float, ...]
    static_bytes: float

    def __post_init__(self) -> None:
        n = len(self.names)
        for name in ("kinds", "fwd_s", "bwd_s", "saved_bytes", "fwd_transient_bytes", "bwd_transient_bytes"):
            if len(getattr(self, name)) != n:
                raise PlanError(f"chain.{name}: got {len(getattr(self, name))} entries; must have {n} (one per layer)")
        if n == 0:
            raise PlanError("chain.names: got no layers; must have at least one")

    def __len__(self) -> int:
        return len(self.names)

    @property
    def lower_bound_s(self) -> float:
        """The no-offload makespan floor: every forward and backward once, nothing waits (seconds)."""
        return math.fsum(self.fwd_s) + math.fsum(self.bwd_s)

    @property
    def offloadable(self) -> tuple[int, ...]:
        """Layers whose saved tensor has bytes to move (the others are always kept)."""
        return tuple(i for i, s in enumerate(self.saved_bytes) if s > 0)

    def no_offload_peak_bytes(self) -> float:
        """Peak device bytes when every saved tensor is kept (the engine's accounting, closed form)."""
        w = self.static_bytes
        prefix = 0.0
        peak = 0.0
        for i, s in enumerate(self.saved_bytes):
            prefix += s
            peak = max(peak, w + prefix + self.fwd_transient_bytes[i])
        suffix = prefix
        for i in range(len(self) - 1, -1, -1):
            peak = max(peak, w + suffix + self.bwd_transient_bytes[i])
            suffix -= self.saved_bytes[i]
        return peak


def build_chain(workload: Workload, device: Device | None = None) -> Chain:
    """The chain of ``workload`` on ``device`` (the engine's default device when None).

    Read off the engine's own program for the keep-all plan (:func:`mcdla.sim.build_program`): its
    operation times (roofline, or a layer's measured time) and the bytes each operation allocates, so that the
    planners' model can never drift from the engine's.
    """
    dev = device if device is not None else default_device()
    keep_all = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names,
                                 actions={})
    program = build_program(workload, keep_all, dev, model_parallel=False, n_devices=1, bucket_bytes=_BUCKET_BYTES)
    n = len(workload.layers)
    fwd = [0.0] * n
    bwd = [0.0] * n
    tr_f = [0.0] * n
    tr_b = [0.0] * n
    saved = program.saved_bytes
    for op in program.ops:
        if op.kind == FORWARD:
            fwd[op.layer] = op.duration_s
            tr_f[op.layer] = op.alloc_bytes - saved[op.layer]
        elif op.kind == BACKWARD:
            bwd[op.layer] = op.duration_s
            tr_b[op.layer] = op.alloc_bytes
    return Chain(
        workload=workload.name,
        batch=workload.batch,
        names=workload.layer_names,
        kinds=tuple(layer.kind for layer in workload.layers),
        fwd_s=tuple(fwd),
        bwd_s=tuple(bwd),
        saved_bytes=tuple(saved),
        fwd_transient_bytes=tuple(tr_f),
        bwd_transient_bytes=tuple(tr_b),
        static_bytes=program.static_bytes,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkTimes:
    """Whole-tensor transfer times of one chain over one link (seconds per layer; ``inf`` if impossible)."""

    offload_s: tuple[float, ...]
    prefetch_s: tuple[float, ...]
    shared_direction: bool
    offload_rate_bytes_per_s: float = math.inf
    prefetch_rate_bytes_per_s: float = math.inf


def _transfer_s(nbytes: float, bytes_per_s: float, latency_s: float) -> float:
    if nbytes <= 0:
        return 0.0
    return latency_s + (0.0 if math.isinf(bytes_per_s) else nbytes / bytes_per_s)


def link_times(chain: Chain, link: PoolLink) -> LinkTimes:
    """How long each saved tensor takes to offload and to prefetch alone on ``link``: latency + bytes / rate."""
    return LinkTimes(
        offload_s=tuple(_transfer_s(s, link.offload_bytes_per_s, link.latency_s) for s in chain.saved_bytes),
        prefetch_s=tuple(_transfer_s(s, link.prefetch_bytes_per_s, link.latency_s) for s in chain.saved_bytes),
        shared_direction=link.shared_direction,
        offload_rate_bytes_per_s=link.offload_bytes_per_s,
        prefetch_rate_bytes_per_s=link.prefetch_bytes_per_s,
    )


def saved_cap(budget_bytes: float, static_bytes: float) -> float:
    """The plan's ``saved_cap_bytes`` for a device budget (NOTE [plan budgets] in ``mcdla.workload.plan``): the
    budget less the static bytes, at least 0; unlimited stays unlimited. The engine holds static + resident
    saved + transient bytes within the budget at every event, so a plan's saved bytes never exceed this."""
    return math.inf if math.isinf(budget_bytes) else max(0.0, float(budget_bytes) - float(static_bytes))


def build_plan(
    chain: Chain,
    actions: Sequence[Action] | Mapping[int, Action],
    triggers: Mapping[int, int] | None = None,
    *,
    budget_bytes: float,
    planner: str,
    notes: str = "",
) -> Plan:
    """Turn solver output (an action per layer index, a trigger index per offloaded layer) into a Plan.

    ``triggers[i] == L`` (end of forward) is only valid for the last layer; a missing trigger means the
    engine's default (``B_{i+1}``, or end of forward for the last layer).
    """
    n = len(chain)
    triggers = triggers or {}
    acts = dict(enumerate(actions)) if not isinstance(actions, Mapping) else dict(actions)
    by_name: dict[str, Action] = {}
    prefetch: dict[str, str] = {}
    for i, act in acts.items():
        act = Action(act)
        if act is Action.KEEP:
            continue
        by_name[chain.names[i]] = act
        if act is Action.OFFLOAD and i in triggers:
            k = triggers[i]
            if k == n and i == n - 1:
                continue
            if not (i < k < n):
                raise PlanError(f"prefetch trigger of layer {chain.names[i]!r}: got index {k}; must be in {i + 1}..{n - 1}")
            prefetch[chain.names[i]] = chain.names[k]
    plan = Plan.from_actions(
        workload=chain.workload,
        batch=chain.batch,
        layer_names=chain.names,
        actions=by_name,
        budget_bytes=budget_bytes,
        saved_cap_bytes=saved_cap(budget_bytes, chain.static_bytes),
        planner=planner,
        prefetch_at=prefetch,
    )
    return dataclasses.replace(plan, notes=notes) if notes else plan


def triggers_of(chain: Chain, plan: Plan) -> dict[int, int]:
    """The trigger index of every offloaded layer of ``plan`` (defaults made explicit)."""
    n = len(chain)
    index = {name: i for i, name in enumerate(chain.names)}
    out: dict[int, int] = {}
    for i, name in enumerate(chain.names):
        d = plan.decision(name)
        if d.action is not Action.OFFLOAD:
            continue
        out[i] = index[d.prefetch_at] if d.prefetch_at is not None else (i + 1 if i + 1 < n else n)
    return out
