"""Which module saved a tensor, and what a plan says about it.

NOTE [attribution and plan execution]
    With ``model=``, forward pre/post hooks on every submodule keep a per-thread stack of the qualified
    names (``model.named_modules()``) of the modules running forward; a saved tensor belongs to the
    innermost one ("" when none runs). A storage saved by several modules belongs to the *first*: its record
    is made at its first save, and later saves of the same storage share it (the profiler's default rule,
    NOTE [saved bytes] in ``mcdla.profile.profiler``, so a plan made from a profile decides each storage
    under the same module; ``tests/profile/test_shared_owner.py``). A plan decision applies to the saved tensors of its module and of
    its submodules, the innermost decided module winning:
      1. ``offload``: offloaded as soon as saved, starting at the decision's tier (spilling down the pool).
      2. ``keep`` (or no decision): kept on the device.
      3. ``recompute``: executed: the module's forward runs under non-reentrant
         ``torch.utils.checkpoint`` while the context is active, so it saves only its inputs (which are
         kept) and reruns in backward. Modules that change state in forward (BatchNorm running stats)
         update it twice, as with any checkpointing.
    ``prefetch_at`` names the module whose backward start triggers the prefetch: a forward hook on that
    module registers an autograd-node pre-hook on the ``grad_fn`` of each of its outputs, which fires when
    the gradient for the output arrives, i.e. when the module's backward begins. (Full module backward
    hooks would do the same but wrap outputs in identity Functions that break in-place ops downstream.)
    Tensors without ``prefetch_at`` are prefetched in reverse forward order (the default schedule).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

from mcdla.errors import ConfigError, PlanError
from mcdla.runtime._tensor_store import local_tensor
from mcdla.runtime.pool import Pool

if TYPE_CHECKING:  # the plan module is imported only when a plan is given (NOTE in virtualize.py)
    from mcdla.workload.plan import Plan

__all__: list[str] = []


class _Decided:
    """A plan decision resolved against the pool: offload or keep, start tier, prefetch trigger."""

    __slots__ = ("layer", "offload", "start_tier", "prefetch_at")

    def __init__(self, layer: str, offload: bool, start_tier: int, prefetch_at: str | None) -> None:
        self.layer, self.offload, self.start_tier, self.prefetch_at = layer, offload, start_tier, prefetch_at


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


class _Attribution:
    """Module hooks for one virtualizer: the module stack, plan decisions and prefetch triggers."""

    def __init__(self, model: torch.nn.Module | None, plan: Plan | None, pool: Pool) -> None:
        if plan is not None and model is None:
            raise PlanError("virtualize(plan=...): a plan names modules, so model= must be given too")
        self.model = _unwrap(model) if model is not None else None
        if self.model is not None and not isinstance(self.model, torch.nn.Module):
            raise ConfigError(f"virtualize(model=...): got {type(model).__name__}; must be a torch.nn.Module")
        self.plan = plan
        self._names: dict[int, str] = {}
        self._modules: dict[str, torch.nn.Module] = {}
        if self.model is not None:
            for name, module in self.model.named_modules():
                self._names.setdefault(id(module), name)
                self._modules.setdefault(name, module)
        self._decided: dict[str, _Decided] = {}
        self._recompute: list[str] = []
        if plan is not None:
            self._resolve(plan, pool)
        self._triggers = {d.prefetch_at for d in self._decided.values() if d.prefetch_at is not None}
        self._local = threading.local()
        self._handles: list[Any] = []
        self._patched: list[tuple[torch.nn.Module, Any]] = []

    def _resolve(self, plan: Plan, pool: Pool) -> None:
        from mcdla.workload.plan import Action

        plan.check_matches(list(self._modules), workload=type(self.model).__name__)
        for d in plan.decisions:
            if d.action is Action.RECOMPUTE:
                self._recompute.append(d.layer)
                self._decided[d.layer] = _Decided(d.layer, False, 0, None)
                continue
            start = 0
            if d.action is Action.OFFLOAD:
                try:
                    start = pool.tier_index(d.tier or "pool")
                except ConfigError:
                    raise PlanError(
                        f"plan decision for {d.layer!r}.tier: got {d.tier!r}; pool {pool.spec!r} has tiers "
                        f"{', '.join(pool.names)} (or 'pool')"
                    ) from None
                if d.prefetch_at is not None and d.prefetch_at not in self._modules:
                    raise PlanError(
                        f"plan decision for {d.layer!r}.prefetch_at: got {d.prefetch_at!r}; not a module of the model"
                    )
            self._decided[d.layer] = _Decided(d.layer, d.action is Action.OFFLOAD, start, d.prefetch_at)

    @property
    def active(self) -> bool:
        return self.model is not None

    # -- the stack -------------------------------------------------------------------------------------
    def _stack(self) -> list[str]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> tuple[str, _Decided | None]:
        """(innermost running module, the plan decision that applies to it or None)."""
        stack = self._stack()
        layer = stack[-1] if stack else ""
        for name in reversed(stack):
            d = self._decided.get(name)
            if d is not None:
                return layer, d
        return layer, None

    def param_storage_ptrs(self) -> set[int]:
        """Data pointers of the storages of the model's parameters and buffers (never offloaded)."""
        if self.model is None:
            return set()
        ptrs = {local_tensor(p).untyped_storage().data_ptr() for p in self.model.parameters()}
        ptrs |= {local_tensor(b).untyped_storage().data_ptr() for b in self.model.buffers()}
        return ptrs

    # -- hooks -----------------------------------------------------------------------------------------
    def install(self, on_backward_start: Callable[[str], None], on_boundary: Callable[[], None]) -> None:
        """Register the module hooks (and recompute wrappers) for one step; ``on_boundary`` runs in every
        forward pre- and post-hook (NOTE [bytes final] in ``_step``)."""
        if self.model is None:
            return
        for name, module in self._modules.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(name, on_boundary)))
            self._handles.append(module.register_forward_hook(self._post_hook(name, on_backward_start, on_boundary),
                                                              always_call=True))
        for name in self._recompute:
            module = self._modules[name]
            previous = module.__dict__.get("forward")
            original = module.forward

            def run(*args: Any, _fwd: Any = original, **kwargs: Any) -> Any:
                return checkpoint(_fwd, *args, use_reentrant=False, **kwargs)

            module.forward = run  # type: ignore[method-assign]
            self._patched.append((module, previous))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for module, previous in self._patched:
            if previous is None:
                del module.forward
            else:
                module.forward = previous  # type: ignore[method-assign]
        self._patched.clear()
        self._stack().clear()

    def _pre_hook(self, name: str, on_boundary: Callable[[], None]) -> Callable[..., None]:
        def pre(_module: torch.nn.Module, _args: Any) -> None:
            on_boundary()
            self._stack().append(name)

        return pre

    def _post_hook(self, name: str, on_backward_start: Callable[[str], None],
                   on_boundary: Callable[[], None]) -> Callable[..., None]:
        trigger = name in self._triggers

        def post(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            on_boundary()
            stack = self._stack()
            if stack and stack[-1] == name:
                stack.pop()
            if trigger:
                for t in _tensors(output):
                    if t.grad_fn is not None:
                        t.grad_fn.register_prehook(lambda _grads, _n=name: on_backward_start(_n))

        return post


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
