"""What the simulator predicts for a profiled model, and the plan the runtime can run.

NOTE [what is predicted]
The prediction is the engine's run of the plan the runtime runs, on a view of the profile that keeps only the
saved tensors as device bytes (no weights, no transients), with the plan's budget in that view as the device
capacity: the budget less the static bytes (weights, gradients, optimizer state), which is what the plan may
hold in saved tensors (and in transients, which neither side counts): the plan's ``saved_cap_bytes`` (NOTE
[plan budgets] in ``mcdla.workload.plan``). :func:`executable_plan` makes sure the run plan states it, and the
runtime honours it as a cap on its resident saved bytes the way the engine does
(NOTE [plan budget] in ``mcdla.runtime._policy``): the forward waits for in-flight offloads to free room. The
engine's makespan (its memory stalls included) is the predicted step time, its peak device bytes the
predicted peak resident saved bytes, which is what the runtime's ``StepReport.peak_resident_saved_bytes``
measures, and its exposed virtualization time (compute waiting for memory or for a prefetch) the predicted
wait, to set beside the runtime's ``pack_wait_s + unpack_wait_s``.

NOTE [measured times in the engine]
Every layer's measured forward and backward time goes to the engine and the planners as FLOPs on a device
whose peak is ``_PEAK_FLOPS_PER_S`` (and whose memory bandwidth is unlimited), so the roofline returns exactly
the measured time: the engine reads ``Layer.fwd_time_s`` itself, but the planners' chain
(``mcdla.plan.chain.build_chain``) times layers by the roofline, and this way both see the same times.

NOTE [one transfer per storage]
The runtime moves every saved storage as its own transfer, each paying the tier's per-transfer latency; the
engine moves a layer's saved bytes as one transfer that pays it once. For ``K`` storages of ``S`` bytes in ``L``
saving layers the runtime spends ``K * latency + S / bandwidth``; :func:`per_storage_link` gives the engine a
link whose bandwidth is ``S / ((K - L) * latency + S / bandwidth)`` with the same latency, so the transfers
take the same time in all (shared among layers in proportion to their bytes).

NOTE [executing the plan]
Before running, the plan is made executable without changing what the engine predicts: decisions for
layers that are not modules (``(model)``, ``(loss)``) cannot be carried out by the runtime and become
*keep* (reported as notes; the prediction is for the plan as run); an offload without ``prefetch_at``
gets the engine's default spelled out, the next layer in forward order, so the runtime prefetches at the
same moment the engine assumes; and since the runtime applies a module's decision to its submodules too, a
layer inside a decided glue owner (``blocks.0.fc2`` under an offloaded ``blocks.0`` at leaf granularity) gets
an explicit *keep*. Its ``saved_cap_bytes`` becomes the saved-bytes budget of NOTE [what is predicted]
(the smaller of the plan's own and its device budget less the static bytes, which tightens a plan file that
predates the field; an unlimited budget stays unlimited); ``budget_bytes`` stays the device budget.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from mcdla.errors import ConfigError, PlanError
from mcdla.hardware import Device, PoolLink
from mcdla.profile.timeline import MemoryTimeline
from mcdla.units import parse_bytes
from mcdla.workload.model import Layer, Workload
from mcdla.workload.plan import Action, Decision, Placement, Plan

__all__ = [
    "time_device", "timed_view", "parse_budget", "per_storage_link", "charge_copies", "saved_budget",
    "executable_plan", "Prediction", "predict", "make_plan_for", "StatePrediction", "predict_states",
]

_PEAK_FLOPS_PER_S = 1e12


def time_device(precision: str) -> Device:
    """The device on which a layer's FLOPs in :func:`timed_view` take exactly its measured time."""
    return Device(
        name="dev0", peak_flops_per_s={precision: _PEAK_FLOPS_PER_S}, hbm_bytes=math.inf, hbm_bytes_per_s=math.inf,
        compute_efficiency=1.0, memory_efficiency=1.0,
        source="mcdla.profile.predict: measured layer times encoded as FLOPs (NOTE [measured times in the engine])",
    )


def _timed(layer: Layer, *, saved_only: bool) -> Layer:
    fwd, bwd = layer.fwd_time_s or 0.0, layer.bwd_time_s or 0.0
    changes: dict[str, Any] = dict(fwd_flops=fwd * _PEAK_FLOPS_PER_S, bwd_flops=bwd * _PEAK_FLOPS_PER_S,
                                   fwd_bytes_moved=0.0, bwd_bytes_moved=0.0)
    if saved_only:
        changes.update(param_bytes=0.0, output_bytes=0.0, workspace_bytes=0.0)
    return dataclasses.replace(layer, **changes)


def timed_view(workload: Workload, *, saved_only: bool) -> Workload:
    """``workload`` with measured times as FLOPs for :func:`time_device`; ``saved_only`` also drops weights,
    outputs and workspace, so that device bytes are the resident saved bytes (NOTE [what is predicted])."""
    return workload.with_layers([_timed(l, saved_only=saved_only) for l in workload.layers])


def per_storage_link(link: PoolLink, workload: Workload, storages: Mapping[str, int]) -> PoolLink:
    """``link`` with the latency of every storage after a layer's first folded into its bandwidths
    (NOTE [one transfer per storage]); ``storages`` counts each layer's saved storages."""
    saving = [l for l in workload.layers if l.saved_bytes > 0]
    total = sum(l.saved_bytes for l in saving)
    extra = sum(max(0, storages.get(l.name, 1) - 1) for l in saving)
    if not saving or extra == 0 or link.latency_s == 0:
        return link

    def folded(bandwidth: float) -> float:
        return total / (extra * link.latency_s + total / bandwidth)

    return dataclasses.replace(
        link,
        offload_bytes_per_s=folded(link.offload_bytes_per_s),
        prefetch_bytes_per_s=folded(link.prefetch_bytes_per_s),
        source=f"{link.source}; {extra} extra per-storage latencies over {total:.4g} B folded into the bandwidths",
    )


def charge_copies(workload: Workload, plan: Plan, seconds_per_byte: float) -> Workload:
    """``workload`` with the compute time its plan's copies cost on a CPU added to the layers that run while
    they happen (NOTE [copies on the CPU] in :mod:`mcdla.profile.rounds`): an offloaded layer's forward pays
    for its write, the backward that issues its prefetch (``prefetch_at``, else its own) for the read."""
    if seconds_per_byte <= 0:
        return workload
    fwd_extra: dict[str, float] = {}
    bwd_extra: dict[str, float] = {}
    for d in plan.decisions:
        if d.action is not Action.OFFLOAD or d.layer not in workload.layer_names:
            continue
        cost = workload.layers[workload.index_of(d.layer)].saved_bytes * seconds_per_byte
        fwd_extra[d.layer] = fwd_extra.get(d.layer, 0.0) + cost
        reader = d.prefetch_at or d.layer
        bwd_extra[reader] = bwd_extra.get(reader, 0.0) + cost
    return workload.with_layers([
        dataclasses.replace(l, fwd_time_s=(l.fwd_time_s or 0.0) + fwd_extra.get(l.name, 0.0),
                            bwd_time_s=(l.bwd_time_s or 0.0) + bwd_extra.get(l.name, 0.0))
        for l in workload.layers
    ])


def parse_budget(text: str | float, workload: Workload) -> float:
    """A device budget in bytes: a size (``"96MiB"``) or ``"P%"``, meaning static bytes plus the largest
    transient plus P% of the saved bytes (what is left resident of the activations)."""
    if isinstance(text, str) and text.strip().endswith("%"):
        try:
            pct = float(text.strip()[:-1])
        except ValueError:
            raise ConfigError(f"--budget: got {text!r}; must be a size like '96MiB' or a percentage like '50%'") from None
        if not 0 <= pct <= 100:
            raise ConfigError(f"--budget: got {text!r}; a percentage must be between 0% and 100%")
        transient = max(2 * l.output_bytes + l.workspace_bytes for l in workload.layers)
        return workload.static_bytes + transient + pct / 100 * workload.saved_bytes
    try:
        budget = parse_bytes(text, "--budget")
    except ConfigError:
        raise ConfigError(f"--budget: got {text!r}; must be a size like '96MiB' or a percentage like '50%'") from None
    if not budget > 0:
        raise ConfigError(f"--budget: got {text!r}; must be > 0")
    return budget


def saved_budget(budget_bytes: float, workload: Workload) -> float:
    """A device budget's share for saved tensors: ``budget_bytes`` less the static bytes (NOTE [what is
    predicted]); unlimited stays unlimited. PlanError when the static bytes alone do not fit."""
    if math.isinf(budget_bytes):
        return budget_bytes
    share = budget_bytes - workload.static_bytes
    if not share > 0:
        raise PlanError(
            f"plan.budget_bytes: got {budget_bytes:.6g}; must exceed the model's static bytes "
            f"{workload.static_bytes:.6g} (weights, gradients, optimizer state)"
        )
    return share


def executable_plan(plan: Plan, workload: Workload, module_names: Sequence[str]) -> tuple[Plan, tuple[str, ...]]:
    """The plan the runtime can run, and notes on what changed (NOTE [executing the plan])."""
    modules = set(module_names)
    names = workload.layer_names
    decisions, notes = [], []
    for d in plan.decisions:
        if d.layer not in modules:
            if d.action is not Action.KEEP:
                notes.append(f"decision {d.action.value} for {d.layer!r} dropped: not a module, the runtime cannot run it")
            continue
        if d.action is Action.OFFLOAD and d.prefetch_at is None:
            i = names.index(d.layer)
            if i + 1 < len(names) and names[i + 1] in modules:
                d = dataclasses.replace(d, prefetch_at=names[i + 1])
        decisions.append(d)
    decided = {d.layer: d.action for d in decisions}
    for name in names:
        if name in modules and name not in decided and _inherited(name, decided) not in (None, Action.KEEP):
            decisions.append(Decision(layer=name, action=Action.KEEP))
    cap = min(plan.saved_cap_bytes, saved_budget(plan.budget_bytes, workload))  # type: ignore[type-var]
    return dataclasses.replace(plan, decisions=tuple(decisions), layer_names=names,
                               saved_cap_bytes=cap), tuple(notes)


def _inherited(name: str, decided: Mapping[str, Action]) -> Action | None:
    """The decision the runtime applies to module ``name`` without one of its own: its nearest decided
    ancestor's. A layer that is a glue owner (``blocks.0`` at leaf granularity) is not its children, so they
    get an explicit *keep*."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        action = decided.get(".".join(parts[:k]))
        if action is not None:
            return action
    return None


class Prediction(NamedTuple):
    """What the engine predicts for a run plan (NOTE [what is predicted]); seconds and bytes."""

    step_s: float
    peak_saved_bytes: float
    timeline: MemoryTimeline
    wait_s: float  # compute waiting for memory or for a prefetch (the engine's exposed virtualization)


def predict(workload: Workload, plan: Plan, link: PoolLink) -> Prediction:
    """The engine's step time, peak resident saved bytes, their timeline and the compute side's waits for
    ``plan`` (a run plan from :func:`executable_plan`, whose ``saved_cap_bytes`` is the saved-bytes budget)."""
    from mcdla.sim import evaluate_plan

    result = evaluate_plan(timed_view(workload, saved_only=True), plan, link,
                           device=time_device(workload.precision), budget_bytes=plan.saved_cap_bytes)
    if not result.feasible:
        raise PlanError(f"simulator: the plan cannot run: {result.infeasible_reason}")
    line = result.memory_timeline.get("device", ())
    timeline = MemoryTimeline.from_pairs([(float(t), float(b)) for t, b in line] or [(0.0, 0.0)])
    return Prediction(float(result.iteration_time_s), float(result.peak_device_bytes), timeline,
                      float(result.exposed_virtualization_s))


def make_plan_for(workload: Workload, budget_bytes: float, link: PoolLink, planner: str | None) -> Plan:
    """``mcdla.plan.make_plan`` on the workload with its measured times (NOTE [measured times in the engine])."""
    from mcdla.plan import make_plan

    view = timed_view(workload, saved_only=False)
    kwargs: dict[str, Any] = {}
    if planner is not None:
        kwargs["planner"] = planner
    if "device" in inspect.signature(make_plan).parameters:
        kwargs["device"] = time_device(workload.precision)
    return make_plan(view, budget_bytes, link, **kwargs)


class StatePrediction(NamedTuple):
    """What the engine predicts for a plan's weights, gradients and optimizer state (NOTE [predicting state])."""

    step_s: float
    peak_weight_bytes: float  # resident bytes of the offloaded layers' weights (ParameterOffloader's peak)
    exposed_s: float  # compute waiting for weight fetches and, after the last backward, for updates
    serial_step_s: float  # compute, every state copy and every update one after another (no spare core)
    compute_s: float  # the layers' forward and backward alone
    update_s: float  # every CPU update, one after another
    fetch_s: float  # every weight fetch (forward and backward) at the link's rate and latency, one after another
    gradient_out_s: float  # every offloaded optimizer's gradient copied out, the same way
    copy_in_s: float  # every new value step() copies in (into the device's weights or the pool's), the same way
    kept_update_s: float = 0.0  # step()'s updates of the state kept on the device, and gathering their weights

    @property
    def copy_s(self) -> float:
        """Every state transfer, one after another."""
        return self.fetch_s + self.gradient_out_s + self.copy_in_s


def predict_states(workload: Workload, plan: Plan, link: PoolLink, *, update_s_per_param_byte: float = 0.0,
                   cpu_sharing: tuple[float, float] = (1.0, 1.0),
                   device_update_s_per_param_byte: float = 0.0) -> StatePrediction:
    """The engine's step time and peak resident offloaded-weight bytes for ``plan``'s ``state`` entries.

    NOTE [predicting state]
    The step is the engine's run of the measured layer times (NOTE [measured times in the engine]) with the
    plan's state (NOTE [state in the program] in ``mcdla.sim.program``) on an unlimited device: the fetches of
    offloaded weights as many layers ahead as each entry's ``prefetch`` says, gradients out and parameters back
    over ``link``. The peak
    weight bytes come from a second run that counts weights only (no saved tensors, outputs, workspace or
    optimizer state; gradients kept): its peak less the bytes it keeps throughout (every gradient and the kept
    weights) is what ``mcdla.offload_parameters`` reports as ``peak_resident_bytes``, the offloaded weights
    resident at once. Each CPU update takes ``update_s_per_param_byte`` per parameter byte (a measured rate),
    one at a time, overlapped with the rest of backward as the optimizer's worker thread runs them; on a CPU
    the two share its cores, by the measured stretches ``cpu_sharing`` (NOTE [CPU sharing] in
    :mod:`mcdla.sim.device`; (1, 1): a spare core for the worker).
    The optimizer state kept on the device is updated by ``step()`` after all that, at
    ``device_update_s_per_param_byte`` (a measured rate: the plain optimizer's step), and when any of those
    modules has its weights offloaded ``step()`` gathers every offloaded weight for it (one fetch each) and
    writes the updated ones back, as ``offload_optimizer`` runs it: all of it adds to the step.
    ``serial_step_s`` bounds the other end: on a CPU whose cores are all busy (a shared machine) the copies and
    updates get no core of their own, so they add to the compute (the engine's compute time plus every state
    transfer at the link's rates and latency plus every update).
    """
    from mcdla.sim import evaluate_plan

    device = time_device(workload.precision)
    timed = timed_view(workload, saved_only=False)
    result = evaluate_plan(timed, plan, link, device=device, budget_bytes=math.inf,
                           update_s_per_param_byte=update_s_per_param_byte, cpu_sharing=cpu_sharing)
    if not result.feasible:
        raise PlanError(f"simulator: the plan cannot run: {result.infeasible_reason}")
    weights_only = dataclasses.replace(
        timed.with_layers([dataclasses.replace(l, saved_bytes=0.0, output_bytes=0.0, workspace_bytes=0.0)
                           for l in timed.layers]), optimizer_bytes_per_param_byte=0.0)
    state = tuple(dataclasses.replace(sd, gradients=Placement.DEVICE, optimizer_state=Placement.DEVICE)
                  for sd in plan.state)
    weights_plan = dataclasses.replace(plan, decisions=(), state=state)
    peak = evaluate_plan(weights_only, weights_plan, link, device=device, budget_bytes=math.inf).peak_device_bytes
    kept = sum(l.param_bytes * (1 + (not weights_plan.state_of(l.name).offloads("weights")))
               for l in weights_only.layers)
    fetches = out = into_s = updates = 0.0
    for l in timed.layers:
        where = plan.state_of(l.name)
        if l.param_bytes <= 0:
            continue
        if where.offloads("weights"):  # fetched for forward and for backward
            fetches += 2 * (link.latency_s + l.param_bytes / link.prefetch_bytes_per_s)
        if where.offloads("optimizer_state"):  # gradient out, update, new value in: the device's or the pool's
            out += link.latency_s + l.param_bytes / link.offload_bytes_per_s
            updates += l.param_bytes * update_s_per_param_byte
            into = link.offload_bytes_per_s if where.offloads("weights") else link.prefetch_bytes_per_s
            into_s += link.latency_s + l.param_bytes / into
    kept_s = _kept_update_s(timed, plan, link, device_update_s_per_param_byte)
    compute = float(result.compute_s)
    return StatePrediction(float(result.iteration_time_s) + kept_s, float(peak - kept),
                           float(result.exposed_virtualization_s), compute + fetches + out + into_s + updates + kept_s,
                           compute, updates, fetches, out, into_s, kept_s)


def _kept_update_s(workload: Workload, plan: Plan, link: PoolLink, seconds_per_byte: float) -> float:
    """``step()``'s updates of the optimizer state kept on the device, plus, when one of those modules has its
    weights offloaded, fetching every offloaded weight and writing the updated ones back (NOTE [predicting
    state])."""
    with_params = [l for l in workload.layers if l.param_bytes > 0]
    kept = [l for l in with_params if not plan.state_of(l.name).offloads("optimizer_state")]
    total = sum(l.param_bytes for l in kept) * seconds_per_byte
    if any(plan.state_of(l.name).offloads("weights") for l in kept):
        total += sum(link.latency_s + l.param_bytes / link.prefetch_bytes_per_s
                     for l in with_params if plan.state_of(l.name).offloads("weights"))
        total += sum(link.latency_s + l.param_bytes / link.offload_bytes_per_s
                     for l in kept if plan.state_of(l.name).offloads("weights"))
    return total
