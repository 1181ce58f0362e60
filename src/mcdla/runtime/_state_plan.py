"""Reading a plan's ``state`` entries (NOTE [four classes] in ``mcdla.workload.plan``) for the state offloaders."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from mcdla.errors import PlanError
from mcdla.runtime.pool import Pool

if TYPE_CHECKING:
    from mcdla.workload.plan import Plan

__all__: list[str] = []


def offloaded_modules(plan: Plan, model: nn.Module, state_class: str, pool: Pool) -> dict[str, int]:
    """Module name -> index of its first tier in ``pool``, for the modules whose ``state_class`` ("weights",
    "gradients" or "optimizer_state") the plan offloads; raises PlanError for a module the model lacks."""
    names = {n for n, _ in model.named_modules()}
    unknown = [sd.layer for sd in plan.state if sd.layer not in names]
    if unknown:
        raise PlanError(f"plan.state: layer {unknown[0]!r} is not a module of the model ({len(unknown)} unknown "
                        "in all)")
    return {sd.layer: pool.tier_index(sd.tier) for sd in plan.state if sd.offloads(state_class)}


def weight_prefetch(plan: Plan) -> dict[str, int]:
    """Module name -> prefetch depth of its weights, for the modules whose weights the plan offloads."""
    return {sd.layer: sd.prefetch for sd in plan.state if sd.offloads("weights")}


def owner_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> name of the module owning it directly (the first, for a shared one)."""
    owners: dict[int, str] = {}
    for name, m in model.named_modules():
        for p in m._parameters.values():
            if p is not None:
                owners.setdefault(id(p), name)
    return owners
