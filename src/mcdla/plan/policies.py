"""The fixed vDNN policies as plans: ``none``, ``all`` (offload every layer's saved tensor) and ``conv``.

vDNN (Rhu et al., MICRO 2016) offloads each layer's input feature map during forward and prefetches it one
layer ahead in backward; ``conv`` restricts this to convolution layers. Layers that save nothing are left
alone. These are the published baselines every budgeted planner is compared with.
"""

from __future__ import annotations

import math
from typing import Literal

from mcdla.errors import PlanError
from mcdla.plan.chain import saved_cap
from mcdla.workload.model import LayerKind, Workload
from mcdla.workload.plan import Action, Plan

__all__ = ["Policy", "POLICIES", "policy_plan"]

Policy = Literal["none", "all", "conv"]
POLICIES: tuple[str, ...] = ("none", "all", "conv")


def policy_plan(workload: Workload, policy: str, budget_bytes: float = math.inf) -> Plan:
    """The plan a fixed vDNN policy makes for ``workload``."""
    if policy not in POLICIES:
        raise PlanError(f"policy: got {policy!r}; must be one of {', '.join(POLICIES)}")
    actions = {}
    for layer in workload.layers:
        if layer.saved_bytes <= 0 or policy == "none":
            continue
        if policy == "all" or layer.kind is LayerKind.CONV:
            actions[layer.name] = Action.OFFLOAD
    return Plan.from_actions(
        workload=workload.name,
        batch=workload.batch,
        layer_names=workload.layer_names,
        actions=actions,
        budget_bytes=budget_bytes,
        saved_cap_bytes=saved_cap(budget_bytes, workload.static_bytes),
        planner=f"vdnn-{policy}",
    )
