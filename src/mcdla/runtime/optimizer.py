"""``mcdla.offload_optimizer``: optimizer state and master weights in the pool, the step on the CPU.

NOTE [optimizer offload]
    ZeRO-Offload's split on one device: the parameters and gradients stay on the training device, the
    optimizer state (Adam's two moments, SGD's momentum buffer) and, under mixed precision, the fp32 master
    weights live in a tier of the pool between steps, and the update runs on the CPU. Per parameter, as
    soon as autograd has accumulated its gradient (``register_post_accumulate_grad_hook``), the gradient
    (and, without a master, the parameter) is copied out and a worker thread reads the state from its tier,
    runs the wrapped optimizer's own update on that one parameter, writes the state back and keeps the new
    value; so the updates overlap the rest of backward. :meth:`OffloadedOptimizer.step` waits for them,
    starts those whose gradient came some other way, and copies the new values into the parameters.

    Exactness: the update is the wrapped optimizer's class with the wrapped group's hyperparameters, run
    on CPU tensors of the dtype it would see on the device (the parameter's, or fp32 masters with the
    gradient cast to fp32), so the result equals the same optimizer stepped normally on the CPU in those
    dtypes, bit for bit; every optimizer whose update is per parameter qualifies (Adam, AdamW, SGD,
    RMSprop, Adagrad, ...). Each parameter has an optimizer instance of its own over a one-parameter
    group, so one parameter can step while the others wait for their gradients.

    Gradient accumulation: a gradient is final only at the last micro-batch, so the backward passes before
    it run under :meth:`OffloadedOptimizer.no_step` (as with DDP's ``no_sync``). A gradient accumulated
    again after its update started, or changed in place before ``step()`` (clipping), raises OffloadError:
    the update would have used the wrong gradient. ``overlap=False`` updates only in ``step()``, from the
    gradients as they are then (gradient clipping works that way).

    DTensor parameters (FSDP2's ``fully_shard``): each rank updates its local shard, so the state in the
    pool and in ``state_dict()`` is the rank's shard, as a plain optimizer's state over DTensors holds.

    CUDA: the copies out run on a device-to-host side stream into pinned memory after the compute stream,
    the copies back on a host-to-device side stream that the compute stream then waits for; ``step()``
    returns once they landed, so the pinned sources can go.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from mcdla.errors import ConfigError, OffloadError, PlanError
from mcdla.runtime import _tensor_store as store
from mcdla.runtime._optimizer_slots import (
    LOW_PRECISION,
    MASTER_KEY,
    Copier,
    Slot,
    one_parameter_optimizer,
    param_sized,
)
from mcdla.runtime._state_plan import offloaded_modules, owner_names
from mcdla.runtime.parameters import ParameterOffloader
from mcdla.runtime.pool import Pool, Tier, as_pool

if TYPE_CHECKING:
    from mcdla.workload.plan import Plan

__all__ = ["OffloadedOptimizer", "offload_optimizer"]


class OffloadedOptimizer:
    """An optimizer whose state lives in a pool and whose update runs on the CPU (NOTE [optimizer offload]).

    Use it where the wrapped optimizer was used: ``backward()``, ``step()``, ``zero_grad()``,
    ``state_dict()``/``load_state_dict()``; hyperparameters stay in ``optimizer.param_groups`` (so changing
    ``lr`` there applies). Close it (or use it as a context manager) to free its blocks.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, pool: str | Pool | Tier | list[str | Tier],
                 master_dtype: torch.dtype, overlap: bool, model: torch.nn.Module | None,
                 parameters: ParameterOffloader | None, plan: Plan | None = None,
                 free_gradients: bool = False) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"offload_optimizer.optimizer: got {type(optimizer).__name__}; must be a torch.optim.Optimizer")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError("offload_optimizer.optimizer: got LBFGS; must update each parameter on its own "
                              "(Adam, AdamW, SGD, RMSprop, ...)")
        if not master_dtype.is_floating_point:
            raise ConfigError(f"offload_optimizer.master_dtype: got {master_dtype}; must be a floating dtype")
        if parameters is not None and not isinstance(parameters, ParameterOffloader):
            raise ConfigError(f"offload_optimizer.parameters: got {type(parameters).__name__}; "
                              "must be what offload_parameters returned")
        self.optimizer = optimizer
        self._parameters = parameters
        if plan is not None and model is None:
            raise ConfigError("offload_optimizer.plan: needs model= (plans name modules)")
        self.pool, self._owns_pool = as_pool(pool)
        self.overlap = bool(overlap)
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        offloaded, freed = (None, set()) if plan is None else _planned(plan, model, self.pool)  # type: ignore[arg-type]
        owners = {} if plan is None else owner_names(model)  # type: ignore[arg-type]
        if (free_gradients or freed) and not overlap:
            raise ConfigError("offload_optimizer.free_gradients: needs overlap=True (gradients are dropped once "
                              "their update has started in backward)")
        self._slots: list[Slot | None] = []  # in state_dict order; None: a parameter that is not trained
        self._by_param: dict[int, Slot] = {}
        self._deferring = False
        self._closed = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcdla-optimizer")
        self._copiers: dict[torch.device, Copier] = {}
        self.stepped_in_backward = 0  # updates of the last step() that had started during backward
        self._started_in_backward = 0
        self.step_wait_s = 0.0  # time the last step() waited for updates still running
        self.update_s = 0.0  # seconds the worker spent on the last step()'s updates (state in and out, the update)
        self._update_s_running = 0.0  # the same, for the step under way (written by the worker only)
        existing = optimizer.state_dict() if optimizer.state else None
        for g, group in enumerate(optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                if not p.requires_grad:
                    self._slots.append(None)
                    continue
                start = 0 if offloaded is None else offloaded.get(owners.get(id(p), ""))
                slot = self._new_slot(p, names.get(id(p), f"param_groups[{g}].params[{j}]"), g, master_dtype, start)
                slot.free_grad = not slot.kept and (free_gradients or owners.get(id(p)) in freed)
                self._slots.append(slot)
                self._by_param[id(p)] = slot
        self._hooks = [s.param.register_post_accumulate_grad_hook(self._on_grad) for s in self._by_param.values()]
        if existing is not None:
            self.load_state_dict(existing)
            optimizer.state.clear()

    def _new_slot(self, p: torch.Tensor, name: str, group_index: int, master_dtype: torch.dtype,
                  start_tier: int | None) -> Slot:
        if start_tier is None:  # kept by a plan: the wrapped class steps the parameter itself, in step()
            return Slot(param=p, name=name, group_index=group_index, master=p,
                         inner=one_parameter_optimizer(self.optimizer, p), mixed=False, start_tier=None)
        mixed = p.dtype in LOW_PRECISION and master_dtype.itemsize > p.dtype.itemsize
        master = torch.empty(store.local_tensor(p).shape, dtype=master_dtype if mixed else p.dtype)
        inner = one_parameter_optimizer(self.optimizer, master)
        slot = Slot(param=p, name=name, group_index=group_index, master=master, inner=inner, mixed=mixed,
                     start_tier=start_tier)
        if mixed:
            with torch.no_grad():
                master.copy_(self._parameters.read_value(p) if self._moved(p) else store.local_tensor(p).detach().cpu())
            slot.stored[MASTER_KEY] = store.put(self.pool, master, label=slot.label(MASTER_KEY))
        master.untyped_storage().resize_(0)
        return slot

    def __repr__(self) -> str:
        return f"OffloadedOptimizer({type(self.optimizer).__name__}, pool={self.pool.spec!r}, params={len(self._by_param)})"

    def __enter__(self) -> OffloadedOptimizer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's groups: change hyperparameters (``lr``) here."""
        return self.optimizer.param_groups

    # -- state --------------------------------------------------------------------------------------------
    @property
    def stored_bytes(self) -> int:
        """Bytes of optimizer state and master weights held in the pool's tiers (before compression)."""
        return sum(st.block.nbytes for s in self._by_param.values() for st in s.stored.values())

    @property
    def resident_state_bytes(self) -> int:
        """Bytes of optimizer state held in memory now (scalars such as Adam's ``step`` between steps)."""
        total = 0
        for s in self._by_param.values():
            total += 0 if s.kept else s.master.untyped_storage().nbytes()
            total += sum(v.nbytes for v in s.inner.state.get(s.master, {}).values() if isinstance(v, torch.Tensor))
        return total

    # -- the step ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_step(self) -> Iterator[None]:
        """Accumulate gradients without updating: wrap every micro-batch's backward but the last."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def _copier(self, device: torch.device) -> Copier:
        c = self._copiers.get(device)
        if c is None:
            c = self._copiers[device] = Copier(device)
        return c

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._deferring or not self.overlap or self._closed:
            return
        slot = self._by_param[id(p)]
        if slot.kept:
            return
        if slot.future is not None:
            raise OffloadError(
                f"parameter {slot.name!r}: gradient accumulated again after its update started in backward; "
                "run every backward but the last of a step under no_step()")
        self._launch(slot)
        self._started_in_backward += 1
        if slot.free_grad:  # its copy out is under way (CUDA: record_stream keeps the memory until it lands)
            slot.grad, slot.grad_version = None, -1
            p.grad = None

    def _launch(self, slot: Slot) -> None:
        """Copy the gradient (and the parameter, without a master) out and queue the update."""
        p, grad = slot.param, slot.param.grad
        assert grad is not None
        copier = self._copier(p.device)
        grad_host, grad_ready = copier.to_host(store.local_tensor(grad))
        param_host, param_ready = (None, None) if slot.mixed or self._moved(p) else copier.to_host(store.local_tensor(p))
        hyper = {k: v for k, v in self.param_groups[slot.group_index].items() if k != "params"}
        slot.grad, slot.grad_version = grad, store.local_tensor(grad)._version
        slot.future = self._worker.submit(self._update, slot, hyper, grad_host, param_host,
                                          [e for e in (grad_ready, param_ready) if e is not None], copier.cuda)

    def _moved(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s bytes live in a parameter offloader (read from and written to its blocks)."""
        return self._parameters is not None and self._parameters.manages(p)

    def _update(self, slot: Slot, hyper: dict[str, Any], grad_host: torch.Tensor, param_host: torch.Tensor | None,
                ready: list[Any], cuda: bool) -> torch.Tensor:
        """On the worker: the update of one parameter; returns its new value on the host."""
        t0 = time.perf_counter()
        try:
            return self._update_one(slot, hyper, grad_host, param_host, ready, cuda)
        finally:
            self._update_s_running += time.perf_counter() - t0

    def _update_one(self, slot: Slot, hyper: dict[str, Any], grad_host: torch.Tensor,
                    param_host: torch.Tensor | None, ready: list[Any], cuda: bool) -> torch.Tensor:
        for event in ready:
            event.synchronize()
        master = slot.master
        master.untyped_storage().resize_(slot.master_nbytes)
        try:
            if slot.mixed:
                store.read_into(slot.stored[MASTER_KEY], master)
            elif param_host is None:
                master.copy_(self._parameters.read_value(slot.param))  # type: ignore[union-attr]
            else:
                master.copy_(param_host)
            state = slot.inner.state[master]
            for key, st in slot.stored.items():
                if key != MASTER_KEY:
                    state[key] = store.get(st)
            master.grad = grad_host.to(master.dtype)
            slot.inner.param_groups[0].update(hyper)
            slot.inner.step()
            master.grad = None
            self._put_state(slot, state)
            if not slot.mixed and not cuda:
                return master  # copied into the parameter by step(), then its storage is emptied
            new_value = torch.empty(master.shape, dtype=slot.param.dtype, pin_memory=cuda)
            new_value.copy_(master)
        except BaseException:
            slot.inner.state[master] = {k: v for k, v in slot.inner.state[master].items() if not param_sized(v, master)}
            master.untyped_storage().resize_(0)
            raise
        if slot.mixed:
            self._replace(slot, MASTER_KEY, master)
        master.untyped_storage().resize_(0)
        return new_value

    def _put_state(self, slot: Slot, state: dict[str, Any]) -> None:
        """Move the per-element state entries of one parameter into the pool (writing new blocks)."""
        for key in [k for k, v in state.items() if param_sized(v, slot.master)]:
            self._replace(slot, key, state.pop(key))

    def _replace(self, slot: Slot, key: str, value: torch.Tensor) -> None:
        new = store.put(self.pool, value, label=slot.label(key), start=slot.start_tier or 0)
        store.free(slot.stored.get(key))
        slot.stored[key] = new

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Finish this step's updates (starting those not started in backward) and copy the new values in."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for slot in self._by_param.values():
            if slot.future is None and slot.param.grad is not None and not slot.kept:
                self._launch(slot)
        t0 = time.perf_counter()
        results = self._wait_all()
        self.step_wait_s = time.perf_counter() - t0
        self.update_s, self._update_s_running = self._update_s_running, 0.0
        for slot, new_value in results:
            g = slot.param.grad
            if slot.free_grad and slot.grad is None:
                continue  # released in backward: nothing on the device could have changed it
            if g is not slot.grad or g is None or store.local_tensor(g)._version != slot.grad_version:
                raise OffloadError(
                    f"parameter {slot.name!r}: gradient changed after its update started in backward "
                    "(clipping, DDP's all-reduce or another in-place change); use offload_optimizer(..., overlap=False)")
        with torch.no_grad():
            for slot, new_value in results:
                if self._moved(slot.param):
                    self._parameters.write_value(slot.param, new_value)  # type: ignore[union-attr]
                else:
                    self._copier(slot.param.device).to_device(store.local_tensor(slot.param.detach()), new_value)
            kept = [slot for slot in self._by_param.values() if slot.kept and slot.param.grad is not None]
            # a kept update of weights that live in the parameter offloader needs them on the device: gathered
            moved = self._parameters is not None and any(self._moved(slot.param) for slot in kept)
            with self._parameters.gathered() if moved else contextlib.nullcontext():  # type: ignore[union-attr]
                for slot in kept:
                    slot.inner.param_groups[0].update(
                        {k: v for k, v in self.param_groups[slot.group_index].items() if k != "params"})
                    slot.inner.step()
        for c in self._copiers.values():
            c.settle()
        for slot, _ in results:
            slot.master.untyped_storage().resize_(0)
            slot.grad = None
        self.stepped_in_backward, self._started_in_backward = self._started_in_backward, 0
        return loss

    def _wait_all(self) -> list[tuple[Slot, torch.Tensor]]:
        """Wait for every update in flight; the first failure is raised after all have finished."""
        results, error = [], None
        for slot in self._by_param.values():
            fut, slot.future = slot.future, None
            if fut is None:
                continue
            try:
                results.append((slot, fut.result()))
            except BaseException as exc:  # noqa: BLE001 - re-raised below once every update has settled
                slot.grad = None
                error = error or exc
        if error is not None:
            for slot, _ in results:
                slot.master.untyped_storage().resize_(0)
            raise error
        return results

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _check_open(self) -> None:
        if self._closed:
            raise OffloadError(f"{self!r}: closed")

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()`` format, read from the tiers; fp32 masters under mixed
        precision are the entry ``"master_param"``."""
        self._check_open()
        if any(s.future is not None for s in self._by_param.values()):
            raise OffloadError(f"{self!r}: state_dict() during a step; call step() first")
        out = {"state": {}, "param_groups": self.optimizer.state_dict()["param_groups"]}
        for i, slot in enumerate(self._slots):
            if slot is None:
                continue
            entries = {k: v.clone() for k, v in slot.inner.state.get(slot.master, {}).items()}
            entries.update({k: store.get(st) for k, st in slot.stored.items()})
            if entries.keys() - {MASTER_KEY}:
                out["state"][i] = entries
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` of this class or of the wrapped optimizer (per-element state goes to the pool)."""
        self._check_open()
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ConfigError("load_state_dict.state_dict: must be a dict with 'state' and 'param_groups'")
        try:
            self.optimizer.load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        except ValueError as exc:
            raise ConfigError(f"load_state_dict.param_groups: {exc}") from None
        for i, slot in enumerate(self._slots):
            if slot is None:
                continue
            entries = dict(state_dict["state"].get(i, {}))
            master = entries.pop(MASTER_KEY, None)
            if master is not None and slot.mixed:
                self._replace(slot, MASTER_KEY, master.detach().to("cpu", slot.master.dtype))
            for key in [k for k in slot.stored if k != MASTER_KEY]:
                store.free(slot.stored.pop(key))
            small = {}
            for key, value in entries.items():
                if slot.kept and isinstance(value, torch.Tensor) and key != "step":
                    small[key] = value.detach().to(slot.param.device, copy=True)
                elif param_sized(value, slot.master):
                    self._replace(slot, key, value.detach().to("cpu"))
                else:
                    small[key] = value.detach().clone().cpu() if isinstance(value, torch.Tensor) else value
            slot.inner.state[slot.master] = small

    def close(self) -> None:
        """Wait for updates in flight, remove the hooks and free every block (and the pool, if built here)."""
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        with contextlib.suppress(BaseException):
            self._wait_all()
        self._worker.shutdown(wait=True)
        for slot in self._by_param.values():
            for st in slot.stored.values():
                store.free(st)
            slot.stored.clear()
        if self._owns_pool:
            self.pool.close()


def _planned(plan: Plan, model: torch.nn.Module, pool: Pool) -> tuple[dict[str, int], set[str]]:
    """The plan's modules with offloaded optimizer state (name -> first tier) and those with offloaded gradients."""
    offloaded = offloaded_modules(plan, model, "optimizer_state", pool)
    freed = set(offloaded_modules(plan, model, "gradients", pool))
    if freed - set(offloaded):
        layer = sorted(freed - set(offloaded))[0]
        raise PlanError(f"plan state for {layer!r}.gradients: got 'offload' with optimizer_state 'device'; "
                        "gradients leave the device only for an update on the CPU, so both must be 'offload'")
    return offloaded, freed


def offload_optimizer(optimizer: torch.optim.Optimizer, pool: str | Pool | Tier | list[str | Tier] = "host", *,
                      master_dtype: torch.dtype = torch.float32, overlap: bool = True,
                      model: torch.nn.Module | None = None,
                      parameters: ParameterOffloader | None = None, plan: Plan | None = None,
                      free_gradients: bool = False) -> OffloadedOptimizer:
    """Keep ``optimizer``'s state (and fp32 master weights of bf16/fp16 parameters) in ``pool``; update on the CPU.

    Args:
        optimizer: a per-parameter ``torch.optim`` optimizer (Adam, AdamW, SGD, ...) over the model's
            parameters; its existing state moves into the pool. Call the returned object's ``step()``,
            ``zero_grad()`` and ``state_dict()`` instead of the optimizer's.
        pool: where the state goes: a pool spec string (``"host"``, ``"file:/scratch"``,
            ``"compress(file:/scratch)"``, ``"host@8GiB,file:/scratch"``), a ``Pool``, a tier or a list.
        master_dtype: dtype of the master weights kept for float16/bfloat16 parameters (none when the
            parameter is already at least this wide).
        overlap: update each parameter as its gradient is accumulated during backward (True), or only in
            ``step()`` (False: for gradient clipping or other changes to gradients after backward).
        model: names the parameters in errors (``"fc1.weight"``) when given.
        parameters: the :func:`~mcdla.runtime.offload_parameters` offloader of the same model: the update
            reads the weights from, and writes them back to, its blocks (no gathering, overlap works).
        plan: a ``mcdla.workload.plan.Plan`` whose ``state`` entries say which modules' optimizer state to
            offload (and to which tier), and whose gradients to drop once copied out (``gradients:
            offload``, only with ``optimizer_state: offload``); the others keep their state on the device and
            update there in ``step()``. Needs ``model``.
        free_gradients: drop every gradient from its parameter (``p.grad = None``) as soon as it is copied out
            for its update in backward, so gradients do not stay on the device (ZeRO-Offload's gradient
            offload); needs ``overlap=True``. Code that reads ``p.grad`` after backward sees None.

    Example::

        opt = mcdla.offload_optimizer(torch.optim.AdamW(model.parameters()), pool="file:/scratch")
        for x, y in data:
            loss_fn(model(x), y).backward()   # updates start as gradients arrive
            opt.step()                        # waits for them, copies the new weights in
            opt.zero_grad()
        opt.close()
    """
    return OffloadedOptimizer(optimizer, pool=pool, master_dtype=master_dtype, overlap=overlap, model=model,
                              parameters=parameters, plan=plan, free_gradients=free_gradients)
