"""Which layer owns the work running right now: module hooks that follow forward and backward.

NOTE [ownership]
A profiled model is cut into *units* at the chosen granularity (leaf modules, or blocks). At
any moment of the forward pass the work in flight belongs to one *owner*: the innermost unit on the module
stack; when no unit is on the stack (glue code in a parent's ``forward``, such as an activation function
called functionally), the innermost module on the stack, named by its qualified name (the root module is
``ROOT_NAME``); after the model returns (the loss), ``LOSS_NAME``. In backward, work belongs to the owner
whose forward created the autograd node being run (NOTE [backward owners] below). Owners that turn out to do
nothing countable (no FLOPs, no saved bytes) are not layers; their time is merged into the next layer in time
(see :mod:`mcdla.profile.profiler`). A storage saved by several owners counts for the first of them by
default, as in ``mcdla.runtime`` (NOTE [saved bytes] in :mod:`mcdla.profile.profiler`).

Every switch of owner is reported to a callback with the phase (``"fwd"`` or ``"bwd"``), so one pass can
time intervals and another can attribute FLOPs and saved tensors with the same rule.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import nn

__all__ = ["ROOT_NAME", "LOSS_NAME", "Granularity", "OwnerTracker", "units_of", "owner_names", "tensors_in"]

ROOT_NAME = "(model)"
"""Layer name for work done directly in the root module's ``forward`` (outside every submodule)."""
LOSS_NAME = "(loss)"
"""Layer name for the loss function (work after the model's forward returns)."""

Granularity = Literal["leaf", "block"]
_LISTS = (nn.ModuleList, nn.ModuleDict)


def units_of(model: nn.Module, granularity: Granularity) -> dict[nn.Module, str]:
    """The units of ``model`` at ``granularity``, mapped to their qualified names.

    ``leaf``: every module without children. ``block``: descend from the root through ``ModuleList`` and
    ``ModuleDict`` and through ``Sequential`` containers that are not themselves list elements; every other
    module met is a block (a transformer's ``blocks.3``, a CNN's ``features.7``, the embedding, the head; an
    element of a ModuleList is a block even when it is a Sequential). A model without children is one unit.
    """
    names = {m: n for n, m in model.named_modules()}
    if granularity == "leaf":
        leaves = {m: names[m] for m in model.modules() if next(m.children(), None) is None}
        return leaves or {model: ROOT_NAME}
    if granularity != "block":
        raise ValueError(f"granularity: got {granularity!r}; must be 'leaf' or 'block'")
    blocks: dict[nn.Module, str] = {}

    def visit(module: nn.Module) -> None:
        in_list = isinstance(module, _LISTS)
        for child in module.children():
            if isinstance(child, _LISTS) or (isinstance(child, nn.Sequential) and not in_list):
                visit(child)
            else:
                blocks.setdefault(child, names[child])

    visit(model)
    return blocks or {model: ROOT_NAME}


def owner_names(model: nn.Module, units: dict[nn.Module, str]) -> dict[nn.Module, str]:
    """For every module, the name of the owner of work done directly in it (its unit, or itself)."""
    owners: dict[nn.Module, str] = {}

    def visit(module: nn.Module, name: str, unit: str | None) -> None:
        if unit is None and module in units:
            unit = units[module]
        owners.setdefault(module, unit if unit is not None else (name or ROOT_NAME))
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, unit)

    visit(model, "", None)
    return owners


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) tuple, list or dict output."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


Phase = Literal["fwd", "bwd", "idle"]


def _next_sequence_nr() -> int | None:
    """The sequence number autograd gives the next node it creates (None if this torch lacks the API)."""
    getter = getattr(torch._C._autograd, "_get_sequence_nr", None)
    return int(getter()) if getter is not None else None


class OwnerTracker:
    """Follows the owner of the running work through training steps (see NOTE [ownership]).

    ``on_switch(owner, phase)`` is called whenever the owner changes (also to the same owner in another
    phase); phase ``"idle"`` marks the tracker's own bookkeeping between forward and backward, which a
    timer should leave out. ``on_output(owner, output)`` is called after every call of an owner's own module
    (a unit, or a module whose glue code owns work) with its output. Use as ``with tracker.attached(): ...``
    and call :meth:`begin_step`, :meth:`begin_backward` (with the loss) and :meth:`end_step` around each step.

    NOTE [backward owners]
    Autograd numbers the nodes it creates in forward in order (their *sequence number*), and on one device
    runs backward in decreasing sequence number as far as dependencies allow. The tracker notes the next
    sequence number at every forward switch, so every node of the step's graph has the owner that was
    running when it was created; before backward it puts a pre-hook on each node where the owner changes
    (in decreasing sequence order), which switches to that node's owner. Backward work is thus attributed
    to the layer whose forward created it, including glue code between modules.
    """

    def __init__(
        self,
        model: nn.Module,
        units: dict[nn.Module, str],
        on_switch: Callable[[str, Phase], None],
        on_output: Callable[[str, Any], None] | None = None,
    ) -> None:
        self._owners = owner_names(model, units)
        self._model = model
        self._on_switch = on_switch
        self._on_output = on_output
        self._stack: list[str] = []
        self._module_stack: list[str] = []
        self._current: tuple[str, Phase] | None = None
        self._marks_seq: list[int] = []
        self._marks_owner: list[str] = []
        self.unit_names = frozenset(units.values())
        self.qualified = {m: (n or ROOT_NAME) for n, m in model.named_modules()}

    # -- state -------------------------------------------------------------------------------------------
    @property
    def innermost_module(self) -> str | None:
        """Qualified name of the innermost module running forward now (for error messages)."""
        return self._module_stack[-1] if self._module_stack else None

    def _switch(self, owner: str, phase: Phase) -> None:
        if self._current == (owner, phase):
            return
        self._current = (owner, phase)
        if phase == "fwd":
            seq = _next_sequence_nr()
            if seq is not None:
                if self._marks_seq and self._marks_seq[-1] == seq:
                    self._marks_owner[-1] = owner
                else:
                    self._marks_seq.append(seq)
                    self._marks_owner.append(owner)
        self._on_switch(owner, phase)

    def begin_step(self) -> None:
        self._stack.clear()
        self._module_stack.clear()
        self._marks_seq.clear()
        self._marks_owner.clear()
        self._current = None
        self._switch(LOSS_NAME, "fwd")

    def begin_backward(self, loss: torch.Tensor) -> None:
        """Call after the loss is computed, before ``loss.backward()``: installs the backward switches."""
        self._switch(LOSS_NAME, "idle")
        end_seq = _next_sequence_nr()
        if end_seq is not None and self._marks_seq and loss.grad_fn is not None:
            self._hook_nodes(loss.grad_fn, end_seq)
        self._switch(LOSS_NAME, "bwd")

    def end_step(self) -> None:
        self._current = None

    def owner_of_sequence(self, seq: int) -> str:
        """The forward owner at the time autograd created the node numbered ``seq``."""
        i = bisect.bisect_right(self._marks_seq, seq) - 1
        return self._marks_owner[i] if i >= 0 else LOSS_NAME

    def _hook_nodes(self, root: Any, end_seq: int) -> None:
        start_seq = self._marks_seq[0]
        seen: set[Any] = set()
        stack = [root]
        nodes: list[tuple[int, Any]] = []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            seq = node._sequence_nr()
            if start_seq <= seq < end_seq:
                nodes.append((seq, node))
            stack.extend(next_node for next_node, _ in node.next_functions)
        nodes.sort(key=lambda pair: -pair[0])
        previous = LOSS_NAME
        for seq, node in nodes:
            owner = self.owner_of_sequence(seq)
            if owner != previous:
                node.register_prehook(self._node_hook(owner))
                previous = owner

    def _node_hook(self, owner: str) -> Callable[[Any], None]:
        def hook(grad_outputs: Any) -> None:
            self._switch(owner, "bwd")

        return hook

    # -- module hooks ------------------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: Any) -> None:
        owner = self._owners[module]
        self._stack.append(owner)
        self._module_stack.append(self.qualified[module])
        self._switch(owner, "fwd")

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        owner = self._stack.pop() if self._stack else self._owners[module]
        if self._module_stack:
            self._module_stack.pop()
        if self._on_output is not None and self.qualified[module] == owner:
            self._on_output(owner, output)
        self._switch(self._stack[-1] if self._stack else LOSS_NAME, "fwd")

    @contextmanager
    def attached(self) -> Iterator[OwnerTracker]:
        """Register the hooks on every module of the model; remove them on exit."""
        handles = []
        try:
            for module in self._model.modules():
                handles.append(module.register_forward_pre_hook(self._pre))
                handles.append(module.register_forward_hook(self._post))
            yield self
        finally:
            for h in handles:
                h.remove()
