"""Plans: what happens to each layer's saved tensor (keep, offload to a tier, recompute) and when
each prefetch starts, and where each module's own weights, gradients and optimizer state live.

A plan is plain data shared by the simulator (which predicts it), the planners (which make it) and the
runtime (which executes it). It lives beside the workload because it is a statement about one workload at
one budget; it names layers by name (qualified module names for profiled models) so a plan made from a
profile can be executed on the real model. Semantics: ``docs/timing-model.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from mcdla._io_safety import read_document
from mcdla.errors import PlanError, brief
from mcdla.workload._plan_file import check_plan_document

__all__ = ["Action", "Decision", "Placement", "StateDecision", "Plan"]


class Action(str, Enum):
    """What happens to a layer's saved tensor between its forward and its backward."""

    KEEP = "keep"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The plan for one layer's saved tensor.

    Attributes:
        layer: layer name.
        action: keep, offload or recompute.
        tier: for offload, the pool tier it goes to (``"pool"`` = the system's default pool, or a runtime tier
            name such as ``"host"``); None otherwise.
        prefetch_at: for offload, the layer whose *backward* start issues the prefetch (the prefetch then
            waits for the copy stream and for free memory). None means the default: at the start of the
            backward of the next layer after this one (one layer of look-ahead, as vDNN does).
    """

    layer: str
    action: Action
    tier: str | None = None
    prefetch_at: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.action, Action):
            try:
                object.__setattr__(self, "action", Action(self.action))
            except ValueError:
                allowed = ", ".join(a.value for a in Action)
                raise PlanError(
                    f"plan decision for {self.layer!r}.action: got {self.action!r}; must be one of {allowed}"
                ) from None
        if self.action is not Action.OFFLOAD and (self.tier is not None or self.prefetch_at is not None):
            raise PlanError(
                f"plan decision for {self.layer!r}: tier/prefetch_at given for action {self.action.value!r}; "
                "only offload takes them"
            )
        if self.action is Action.OFFLOAD and self.tier is None:
            object.__setattr__(self, "tier", "pool")


class Placement(str, Enum):
    """Where one class of a module's own state lives between its uses."""

    DEVICE = "device"
    OFFLOAD = "offload"


_STATE_CLASSES = ("weights", "gradients", "optimizer_state")


@dataclass(frozen=True, slots=True, kw_only=True)
class StateDecision:
    """Where one module's own weights, gradients and optimizer state live (NOTE [four classes]).

    Attributes:
        layer: module name (the module that owns the parameters directly).
        weights, gradients, optimizer_state: device, or offload to ``tier`` between uses.
        tier: the pool tier offloaded state goes to (``"pool"`` = the first, or a runtime tier name).
        prefetch: with offloaded weights, how many offloaded-weight modules after this one (in forward order,
            and in backward order in backward) start fetching when this one is fetched for use: 0 fetches
            each on demand. The simulator and ``offload_parameters`` both read it.
    """

    layer: str
    weights: Placement = Placement.DEVICE
    gradients: Placement = Placement.DEVICE
    optimizer_state: Placement = Placement.DEVICE
    tier: str = "pool"
    prefetch: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise PlanError(f"plan state for {self.layer!r}.prefetch: got {self.prefetch!r}; must be an integer >= 0 "
                            "(offloaded-weight layers fetched ahead)")
        for name in _STATE_CLASSES:
            value = getattr(self, name)
            if not isinstance(value, Placement):
                try:
                    object.__setattr__(self, name, Placement(value))
                except ValueError:
                    allowed = ", ".join(p.value for p in Placement)
                    raise PlanError(
                        f"plan state for {self.layer!r}.{name}: got {value!r}; must be one of {allowed}"
                    ) from None

    def offloads(self, state_class: str) -> bool:
        """Whether ``state_class`` ("weights", "gradients" or "optimizer_state") is offloaded."""
        return getattr(self, state_class) is Placement.OFFLOAD


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A plan for one workload at one budget: one decision per layer that saves bytes.

    Layers without a decision are kept; ``planner`` names what made the plan.

    NOTE [four classes]
        ``decisions`` say what happens to each layer's saved tensors (activations); ``state`` says, per
        module owning parameters, whether its weights, gradients and optimizer state stay on the device or
        live in a tier between uses (modules without an entry keep all three on the device). The runtime
        executes weights (``offload_parameters(plan=...)``), optimizer state and gradients
        (``offload_optimizer(plan=...)``; a gradient leaves the device only for an update on the CPU, so it
        needs the optimizer state offloaded too). ``mcdla.plan.make_plan(..., states=True)`` writes these
        entries and the simulator predicts them (NOTE [state in the program] in ``mcdla.sim.program``).

    NOTE [plan budgets]: two bytes
    fields, one meaning each (``math.inf`` for none):
      - ``budget_bytes``: the *device* budget the plan was made and simulated for: static bytes (weights,
        gradients, optimizer state) + resident saved tensors + transients (outputs, workspace) at every
        engine event. Planners, ``mcdla.plan.evaluate`` and the simulator read this one.
      - ``saved_cap_bytes``: the cap on *resident saved-tensor* bytes, the only device bytes the runtime
        manages and the one it enforces (NOTE [plan budget] in ``mcdla.runtime._policy``). Planners set it to
        ``budget_bytes`` less the workload's static bytes (at least 0): the plan's simulation keeps static +
        saved + transients within the budget, so its saved bytes never exceed that (and reach it only at
        moments without transients).
    Migration: a plan without ``saved_cap_bytes`` (a file written before the field existed, or a plan built
    with ``budget_bytes`` alone) gets ``saved_cap_bytes = budget_bytes``, which is what the runtime enforced
    before; it is the only bound known without the workload (for a planner's old file it is loose by the
    static bytes: make the plan again, or let ``mcdla validate`` tighten it to budget less static bytes).
    """

    workload: str
    batch: int
    budget_bytes: float
    decisions: tuple[Decision, ...]
    saved_cap_bytes: float | None = None
    planner: str = "manual"
    layer_names: tuple[str, ...] = ()
    notes: str = ""
    state: tuple[StateDecision, ...] = ()
    _by_layer: dict[str, Decision] = field(default_factory=dict, init=False, repr=False, compare=False)
    _state_by_layer: dict[str, StateDecision] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", tuple(self.decisions))
        object.__setattr__(self, "layer_names", tuple(self.layer_names))
        if not (self.budget_bytes > 0):
            raise PlanError(f"plan.budget_bytes: got {self.budget_bytes!r}; must be > 0")
        if self.saved_cap_bytes is None:  # NOTE [plan budgets]: the migration rule
            object.__setattr__(self, "saved_cap_bytes", self.budget_bytes)
        elif not (0 <= self.saved_cap_bytes <= self.budget_bytes):
            raise PlanError(
                f"plan.saved_cap_bytes: got {self.saved_cap_bytes!r}; must be between 0 and budget_bytes "
                f"({self.budget_bytes!r}): saved tensors are part of the device budget"
            )
        by_layer: dict[str, Decision] = {}
        for d in self.decisions:
            if d.layer in by_layer:
                raise PlanError(f"plan.decisions: layer {d.layer!r} appears twice")
            by_layer[d.layer] = d
        if self.layer_names:
            known = set(self.layer_names)
            for d in self.decisions:
                if d.layer not in known:
                    raise PlanError(f"plan.decisions: layer {d.layer!r} is not a layer of {self.workload!r}")
                if d.prefetch_at is not None and d.prefetch_at not in known:
                    raise PlanError(
                        f"plan decision for {d.layer!r}.prefetch_at: got {d.prefetch_at!r}; not a layer of "
                        f"{self.workload!r}"
                    )
        object.__setattr__(self, "_by_layer", by_layer)
        object.__setattr__(self, "state", tuple(self.state))
        state_by_layer: dict[str, StateDecision] = {}
        for sd in self.state:
            if sd.layer in state_by_layer:
                raise PlanError(f"plan.state: layer {sd.layer!r} appears twice")
            if self.layer_names and sd.layer not in self.layer_names:
                raise PlanError(f"plan.state: layer {sd.layer!r} is not a layer of {self.workload!r}")
            state_by_layer[sd.layer] = sd
        object.__setattr__(self, "_state_by_layer", state_by_layer)

    # -- queries -------------------------------------------------------------------------------------------
    def decision(self, layer: str) -> Decision:
        """The decision for ``layer`` (keep when the plan does not mention it)."""
        return self._by_layer.get(layer) or Decision(layer=layer, action=Action.KEEP)

    def state_of(self, layer: str) -> StateDecision:
        """Where ``layer``'s weights, gradients and optimizer state live (all on the device when not mentioned)."""
        return self._state_by_layer.get(layer) or StateDecision(layer=layer)

    def action(self, layer: str) -> Action:
        return self.decision(layer).action

    def layers_with(self, action: Action) -> tuple[str, ...]:
        return tuple(d.layer for d in self.decisions if d.action is action)

    def check_matches(self, layer_names: Sequence[str], workload: str | None = None) -> None:
        """Raise PlanError if this plan names a layer that is not in ``layer_names`` (a different model)."""
        known = set(layer_names)
        unknown = [d.layer for d in self.decisions if d.layer not in known]
        if unknown:
            target = f" {workload!r}" if workload else ""
            raise PlanError(
                f"plan for {self.workload!r} does not match model{target}: layer {unknown[0]!r} "
                f"({len(unknown)} unknown in all) is not among its {len(known)} layers"
            )

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_actions(
        cls,
        *,
        workload: str,
        batch: int,
        layer_names: Sequence[str],
        actions: Mapping[str, Action | str],
        budget_bytes: float = math.inf,
        planner: str = "manual",
        prefetch_at: Mapping[str, str] | None = None,
        saved_cap_bytes: float | None = None,
    ) -> Plan:
        """Build a plan from ``{layer: action}``; layers not in ``actions`` are kept (budgets: NOTE [plan
        budgets])."""
        prefetch_at = prefetch_at or {}
        decisions = []
        for name in layer_names:
            act = Action(actions.get(name, Action.KEEP))
            if act is Action.KEEP:
                continue
            decisions.append(
                Decision(layer=name, action=act, prefetch_at=prefetch_at.get(name) if act is Action.OFFLOAD else None)
            )
        return cls(
            workload=workload,
            batch=batch,
            budget_bytes=budget_bytes,
            saved_cap_bytes=saved_cap_bytes,
            decisions=tuple(decisions),
            planner=planner,
            layer_names=tuple(layer_names),
        )

    # -- JSON ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "mcdla-plan/1",
            "workload": self.workload,
            "batch": self.batch,
            "budget_bytes": None if math.isinf(self.budget_bytes) else self.budget_bytes,
            "saved_cap_bytes": None if math.isinf(self.saved_cap_bytes) else self.saved_cap_bytes,
            "planner": self.planner,
            "notes": self.notes,
            "layer_names": list(self.layer_names),
            "decisions": [
                {
                    "layer": d.layer,
                    "action": d.action.value,
                    **({"tier": d.tier} if d.tier is not None else {}),
                    **({"prefetch_at": d.prefetch_at} if d.prefetch_at is not None else {}),
                }
                for d in self.decisions
            ],
            **({"state": [
                {"layer": sd.layer, **{c: getattr(sd, c).value for c in _STATE_CLASSES}, "tier": sd.tier,
                 "prefetch": sd.prefetch}
                for sd in self.state
            ]} if self.state else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping) or data.get("format") != "mcdla-plan/1":
            got = brief(data.get("format")) if isinstance(data, Mapping) else f"a {type(data).__name__}"
            raise PlanError(f"plan.format: got {got}; must be 'mcdla-plan/1'")
        check_plan_document(data)  # field types, one-line errors (mcdla.workload._plan_file)
        try:
            budget = data.get("budget_bytes")
            return cls(
                workload=str(data["workload"]),
                batch=int(data["batch"]),
                budget_bytes=math.inf if budget is None else float(budget),
                saved_cap_bytes=(None if "saved_cap_bytes" not in data  # absent: NOTE [plan budgets]
                                 else math.inf if data["saved_cap_bytes"] is None else float(data["saved_cap_bytes"])),
                planner=str(data.get("planner", "manual")),
                notes=str(data.get("notes", "")),
                layer_names=tuple(data.get("layer_names", ())),
                decisions=tuple(
                    Decision(
                        layer=str(d["layer"]),
                        action=d["action"],
                        tier=d.get("tier"),
                        prefetch_at=d.get("prefetch_at"),
                    )
                    for d in data["decisions"]
                ),
                state=tuple(
                    StateDecision(layer=str(sd["layer"]), tier=str(sd.get("tier", "pool")),
                                  prefetch=sd.get("prefetch", 1),
                                  **{c: sd.get(c, "device") for c in _STATE_CLASSES})
                    for sd in data.get("state", ())
                ),
            )
        except KeyError as exc:
            raise PlanError(f"plan: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise PlanError(f"plan: malformed ({exc})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        # A regular UTF-8 file of bounded size, strict JSON (no NaN/Infinity), bounded nesting.
        return cls.from_dict(read_document(path, what="plan file", error=PlanError, json_format=True))
