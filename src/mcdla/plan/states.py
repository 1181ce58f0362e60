"""State-aware planning: which layers' weights, gradients and optimizer state leave the device.

NOTE [state greedy]
    A layer of ``P`` parameter bytes holds ``P`` of weights, ``P`` of gradients and ``r * P`` of optimizer
    state on the device (``r = optimizer_bytes_per_param_byte``). Two offload steps exist per layer:

    1. optimizer state and gradients together (ZeRO-Offload): saves ``(1 + r) * P``; the gradient leaves the
       device only for an update on the CPU (NOTE [four classes]), so the two go as one step. Each gradient is
       on the device only during its layer's backward (``P`` transient) and crosses the link once; the
       updated parameter crosses back once: ``2 * P`` of traffic per step, overlapped with backward.
    2. weights (FSDP-style on one device): saves ``P`` but fetches the weights before the forward and the
       backward, ``prefetch`` layers ahead: ``2 * P`` of traffic per step on the critical path's link.

    Step 1 moves at most as many bytes per byte saved as step 2 (``2 / (1 + r) <= 2``) and is hidden behind
    backward, so the greedy takes every layer's step 1 (largest layers first) before any step 2 (largest first),
    and stops at the shortest prefix of that order after which the activation planner fits the remaining room.

    Device bytes of the state under a choice (:func:`state_device_bytes`): the classes kept on the device, plus
    the weights window (the largest sum of ``prefetch + 1`` consecutive offloaded-weight layers in forward order:
    the running one and those fetched ahead, as ``mcdla.offload_parameters`` holds them) plus the two largest
    offloaded gradients (the one being computed and the one still leaving: a bound when each copy out lands
    within the next layer's backward; :func:`mcdla.plan.api.make_plan` checks the plan on the engine besides).
    Offloading everything minimises these bytes (keeping a layer's
    weights adds ``P`` and can shrink a window by at most ``P``), so the greedy finds a choice whenever any
    choice fits; ``tests/plan/test_states.py`` checks that against brute force.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from mcdla.errors import PlanError
from mcdla.workload.model import Workload
from mcdla.workload.plan import Placement, StateDecision

__all__ = ["OPTIMIZER_STEP", "WEIGHTS_STEP", "StateStep", "state_steps", "state_device_bytes", "state_decisions",
           "check_prefetch"]

OPTIMIZER_STEP = "optimizer_state+gradients"
WEIGHTS_STEP = "weights"


@dataclasses.dataclass(frozen=True, slots=True)
class StateStep:
    """One greedy step: offload ``what`` (:data:`OPTIMIZER_STEP` or :data:`WEIGHTS_STEP`) of layer ``layer``."""

    layer: int
    what: str


def check_prefetch(prefetch: object) -> int:
    """``prefetch`` as an int >= 0, or PlanError naming it."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise PlanError(f"state_prefetch: got {prefetch!r}; must be an int >= 0 (layers of weights fetched ahead)")
    return prefetch


def state_steps(workload: Workload) -> tuple[StateStep, ...]:
    """The greedy order (NOTE [state greedy]): optimizer+gradients of every layer with parameters, largest first,
    then weights, largest first (ties in layer order)."""
    owners = sorted((i for i, layer in enumerate(workload.layers) if layer.param_bytes > 0),
                    key=lambda i: (-workload.layers[i].param_bytes, i))
    return tuple(StateStep(i, OPTIMIZER_STEP) for i in owners) + tuple(StateStep(i, WEIGHTS_STEP) for i in owners)


def _weights_window_bytes(param_bytes: Sequence[float], offloaded: Sequence[int], prefetch: int) -> float:
    """Largest sum of ``prefetch + 1`` consecutive offloaded-weight layers (forward order), bytes."""
    sizes = [param_bytes[i] for i in sorted(offloaded)]
    width = prefetch + 1
    if len(sizes) <= width:
        return float(sum(sizes))
    return float(max(sum(sizes[k:k + width]) for k in range(len(sizes) - width + 1)))


def state_device_bytes(workload: Workload, steps: Iterable[StateStep], prefetch: int) -> float:
    """Device bytes the state needs at most under ``steps`` (NOTE [state greedy]): kept classes + weights window
    + the two largest offloaded gradients."""
    r = workload.optimizer_bytes_per_param_byte
    param = [layer.param_bytes for layer in workload.layers]
    steps = tuple(steps)
    opt = {s.layer for s in steps if s.what == OPTIMIZER_STEP}
    weights = {s.layer for s in steps if s.what == WEIGHTS_STEP}
    kept = sum(p * ((0.0 if i in weights else 1.0) + (0.0 if i in opt else 1.0 + r)) for i, p in enumerate(param))
    grad_in_flight = sum(sorted((param[i] for i in opt), reverse=True)[:2])
    return kept + _weights_window_bytes(param, tuple(weights), prefetch) + grad_in_flight


def state_decisions(workload: Workload, steps: Iterable[StateStep], tier: str = "pool", *,
                    prefetch: int = 1) -> tuple[StateDecision, ...]:
    """The plan's ``state`` entries for ``steps`` (layers in workload order; untouched layers have none), each with
    prefetch depth ``prefetch``."""
    opt = set()
    weights = set()
    for s in steps:
        (opt if s.what == OPTIMIZER_STEP else weights).add(s.layer)
    out = []
    for i in sorted(opt | weights):
        moved = Placement.OFFLOAD if i in opt else Placement.DEVICE
        out.append(StateDecision(layer=workload.layers[i].name, optimizer_state=moved, gradients=moved,
                                 weights=Placement.OFFLOAD if i in weights else Placement.DEVICE, tier=tier,
                                 prefetch=prefetch))
    return tuple(out)
