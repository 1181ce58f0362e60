"""``mcdla.offload_parameters``: layer weights live in the pool between uses and come back ahead of them.

NOTE [parameter offload]
    FSDP2's CPU offload and ZeRO-Infinity's parameter offload on one device. A *unit* is a module that
    owns parameters directly (a Linear, a LayerNorm, an Embedding); between uses its parameters' storages
    are emptied (``untyped_storage().resize_(0)``, as FSDP frees unsharded parameters) and their bytes
    live in a tier. The parameter objects, shapes, strides and version counters stay what they were, so
    optimizers, hooks and tensors autograd saved (``weight.t()`` views share the storage) see the same
    tensors; a storage that is filled again holds the same bytes, hence bit-identical losses and gradients.

    When a unit's bytes are on the device:
    - forward: a forward pre-hook fetches the unit (waiting for a prefetch already running) and starts
      fetching the next ``prefetch`` units in forward order; the forward hook empties it again. A forward
      that runs inside backward (checkpoint recomputation) prefetches nothing (backward has passed the
      units after it) and leaves its units resident: backward needs them next.
    - backward: the forward hook registers a pre-hook on the ``grad_fn`` of each output, which fetches the
      unit before backward reaches its ops and prefetches the next ``prefetch`` units in backward order;
      the unit is emptied once autograd has accumulated every trained parameter's gradient
      (post-accumulate-grad hooks) or, for a unit without trained parameters (frozen base weights), once
      the gradients of its inputs are computed (``register_multi_grad_hook``, as FSDP2 does); every unit
      still resident is emptied when backward ends.
    So at most ``prefetch + 1`` consecutive units are resident at a time in a chain of layers (with a plan,
    each unit fetches as many ahead as its ``StateDecision.prefetch`` says). The forward order is the one the
    first forward ran; until then nothing is prefetched. Under FSDP2 a unit is a ``fully_shard`` group's
    shards, fetched and emptied around its all-gather instead of its module's hooks (NOTE [sharded units] in
    ``_fsdp_units``).

    Bytes go back to the tier only when they changed: a fetch leaves the block valid, and emptying writes
    a new block only if the parameter's version counter moved since (an optimizer step inside
    :meth:`ParameterOffloader.gathered`). Parameters shared by several modules (tied embeddings) are not
    moved: they may be used outside their module's forward.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from mcdla.errors import ConfigError, OffloadError
from mcdla.runtime import _fsdp_units as fsdp
from mcdla.runtime import _tensor_store as store
from mcdla.runtime._param_units import Unit, build_units
from mcdla.runtime._state_plan import offloaded_modules, weight_prefetch
from mcdla.runtime.pool import Pool, Tier, as_pool

if TYPE_CHECKING:
    from mcdla.workload.plan import Plan

__all__ = ["ParameterOffloader", "offload_parameters"]


class ParameterOffloader:
    """Hooks that keep ``model``'s layer weights in a pool between uses (NOTE [parameter offload]).

    Attributes give the device bytes the parameters take over time (``timeline``: (seconds since
    construction or :meth:`reset_report`, resident parameter bytes) at each change), their peak and the
    fetches that were prefetched or waited for.
    """

    def __init__(self, model: nn.Module, *, pool: str | Pool | Tier | list[str | Tier], prefetch: int | None,
                 plan: Plan | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"offload_parameters.model: got {type(model).__name__}; must be a torch.nn.Module")
        if plan is not None and prefetch is not None:
            raise ConfigError(f"offload_parameters.prefetch: got {prefetch!r} with plan=; the plan's state entries "
                              "carry each module's depth (leave prefetch unset)")
        prefetch = 1 if prefetch is None else prefetch
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ConfigError(f"offload_parameters.prefetch: got {prefetch!r}; must be an int >= 0")
        self.model = model
        self.prefetch = prefetch
        self.pool, self._owns_pool = as_pool(pool)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcdla-params")
        self._streams: dict[torch.device, Any] = {}  # CUDA device -> its host-to-device stream
        self._order: list[Unit] = []  # forward order of the first forward
        self._order_frozen = False
        self._position: dict[int, int] = {}  # id(unit) -> index in _order
        self._in_backward = False
        self._closed = False
        self._t0 = time.perf_counter()
        self.timeline: list[tuple[float, int]] = []
        self.peak_resident_bytes = 0
        self.fetches_ahead = 0
        self.fetches_on_demand = 0
        self.fetch_s = 0.0  # seconds the worker spent reading units from their tiers
        self.wait_s = 0.0  # seconds the hooks' thread waited for fetches in flight
        only = None if plan is None else offloaded_modules(plan, model, "weights", self.pool)
        depth = {} if plan is None else weight_prefetch(plan)
        self._units, self._where = build_units(model, only, depth, prefetch)
        self._handles: list[Any] = []
        for module, unit in self._units:
            if unit.group is not None:
                fsdp.wrap_unshard(unit.group, self._make_unshard(unit))
                continue
            self._handles.append(module.register_forward_pre_hook(self._make_pre_forward(unit)))
            self._handles.append(module.register_forward_hook(self._make_post_forward(unit)))
            for p in unit.params:
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._make_grad_done(unit)))
        self.resident_bytes = self.offloadable_bytes  # parameter bytes on the device now; every unit starts there
        for _, unit in self._units:
            self._release(unit)
        self.reset_report()

    def __repr__(self) -> str:
        return f"ParameterOffloader(units={len(self._units)}, pool={self.pool.spec!r}, prefetch={self.prefetch})"

    def __enter__(self) -> ParameterOffloader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- report -----------------------------------------------------------------------------------------
    def reset_report(self) -> None:
        """Start the timeline, peak and fetch counts again from now (e.g. at the start of a step)."""
        with self._lock:
            self._t0 = time.perf_counter()
            self.timeline = [(0.0, self.resident_bytes)]
            self.peak_resident_bytes = self.resident_bytes
            self.fetches_ahead = self.fetches_on_demand = 0
            self.fetch_s = self.wait_s = 0.0

    def _account(self, delta: int) -> None:
        with self._lock:
            self.resident_bytes += delta
            self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
            self.timeline.append((time.perf_counter() - self._t0, self.resident_bytes))

    @property
    def offloadable_bytes(self) -> int:
        """Bytes of the parameters this offloader moves (shared parameters excluded)."""
        return sum(u.nbytes for _, u in self._units)

    # -- moving units ---------------------------------------------------------------------------------
    def _start_fetch(self, unit: Unit) -> None:
        """Make ``unit``'s storages full size and start reading its bytes into them."""
        if unit.resident or self._closed:
            return
        storages = [p.untyped_storage() for p in unit.params]
        sizes = [st.block.nbytes for st in unit.stored]  # type: ignore[union-attr]
        device = unit.params[0].device
        for s, n in zip(storages, sizes):
            s.resize_(n)
        unit.resident = True
        self._account(unit.nbytes)
        ready = None
        if device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(device))
        unit.fetch = self._worker.submit(self._read_unit, unit, storages, ready)

    def _read_unit(self, unit: Unit, storages: list[torch.UntypedStorage], ready: Any) -> Any:
        """On the worker: the unit's blocks into its storages (CPU), or through pinned memory (CUDA)."""
        t0 = time.perf_counter()
        try:
            return self._read_blocks(unit, storages, ready)
        finally:
            with self._lock:
                self.fetch_s += time.perf_counter() - t0

    def _read_blocks(self, unit: Unit, storages: list[torch.UntypedStorage], ready: Any) -> Any:
        done = None
        for st, s in zip(unit.stored, storages):
            assert st is not None
            dst = store.storage_bytes(s)
            if ready is None:
                st.block.tier.read_into(st.block, store.byte_view(dst))
                continue
            staging = torch.empty(st.block.nbytes, dtype=torch.uint8, pin_memory=True)
            st.block.tier.read_into(st.block, store.byte_view(staging))
            stream = self._h2d_stream(dst.device)
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                dst.copy_(staging, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            done.synchronize()  # the staging buffer may go once its copy landed
        return done

    def _h2d_stream(self, device: torch.device) -> Any:
        with self._lock:
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device=device)
            return self._streams[device]

    def _wait(self, unit: Unit) -> None:
        """Wait until ``unit``'s bytes are in place (fetching them now if no fetch is running)."""
        if not unit.resident:
            self._start_fetch(unit)
            self.fetches_on_demand += 1
        elif unit.fetch is not None and not unit.fetch.done():
            self.fetches_on_demand += 1
        self._settle(unit)

    def _settle(self, unit: Unit) -> None:
        """Wait for ``unit``'s fetch in flight, if any; a failed one leaves the unit empty and raises."""
        fut, unit.fetch = unit.fetch, None
        if fut is not None:
            t0 = time.perf_counter()
            try:
                fut.result()
            except BaseException:
                self._empty(unit)  # no half-read weights: the unit is absent until a fetch succeeds
                raise
            finally:
                self.wait_s += time.perf_counter() - t0
            unit.versions = [p._version for p in unit.params]

    def _empty(self, unit: Unit) -> None:
        """Free ``unit``'s storages on the device (its bytes stay in the tier)."""
        for p in unit.params:
            p.untyped_storage().resize_(0)
        unit.resident = False
        self._account(-unit.nbytes)

    def _prefetch_from(self, unit: Unit, step: int) -> None:
        """Start fetching the ``prefetch`` units after ``unit`` in forward (step 1) or backward (step -1) order."""
        i = self._position.get(id(unit))
        if i is None:
            return
        for k in range(1, unit.prefetch + 1):
            j = i + step * k
            if 0 <= j < len(self._order) and not self._order[j].resident:
                self._start_fetch(self._order[j])
                self.fetches_ahead += 1

    def _release(self, unit: Unit) -> None:
        """Store ``unit``'s bytes if they changed since they were stored, then empty its storages."""
        if not unit.resident:
            return
        self._settle(unit)
        for i, p in enumerate(unit.params):
            if unit.stored[i] is None or p._version != unit.versions[i]:
                data = p.detach().cpu() if p.device.type != "cpu" else store.storage_bytes(p.untyped_storage())
                new = store.put(self.pool, data, label=unit.labels[i], start=unit.start_tiers[i])
                store.free(unit.stored[i])
                unit.stored[i], unit.versions[i] = new, p._version
        self._empty(unit)

    # -- hooks -----------------------------------------------------------------------------------------
    def _make_pre_forward(self, unit: Unit):
        def pre_forward(module: nn.Module, args: Any) -> None:
            if self._closed:
                return
            if not self._order_frozen:
                if id(unit) in self._position and torch._C._current_autograd_node() is None:
                    self._order_frozen = True  # a second forward: the first one's order is complete
                elif id(unit) not in self._position:
                    self._position[id(unit)] = len(self._order)
                    self._order.append(unit)
            self._wait(unit)
            if torch._C._current_autograd_node() is None:  # not a checkpoint's recomputation in backward
                self._prefetch_from(unit, 1)

        return pre_forward

    def _make_post_forward(self, unit: Unit):
        def post_forward(module: nn.Module, args: Any, output: Any) -> None:
            if self._closed:
                return
            if torch.is_grad_enabled():
                for t in tree_flatten(output)[0]:
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                        t.grad_fn.register_prehook(self._make_pre_backward(unit))
                if not any(p.requires_grad for p in unit.params):
                    inputs = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
                    if inputs:  # its backward is over once its inputs' gradients are computed
                        torch.autograd.graph.register_multi_grad_hook(
                            inputs, lambda grads: self._frozen_backward_done(unit), mode="all")
            if torch._C._current_autograd_node() is None:
                self._release(unit)

        return post_forward

    def _make_pre_backward(self, unit: Unit):
        def pre_backward(grad_outputs: Any) -> None:
            if self._closed:
                return
            if not self._in_backward:
                self._in_backward = True
                self._order_frozen = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            if unit.awaiting_grads == 0:
                unit.awaiting_grads = sum(1 for p in unit.params if p.requires_grad)
            self._wait(unit)
            self._prefetch_from(unit, -1)

        return pre_backward

    def _make_unshard(self, unit: Unit):
        """The wrapper of an FSDP2 group's ``unshard`` (NOTE [sharded units])."""
        def around(original: Any, args: tuple, kwargs: dict) -> Any:
            group = unit.group
            if self._closed or not fsdp.gathers(group):
                return original(*args, **kwargs)
            backward = fsdp.in_backward(group)
            if not self._order_frozen:
                if backward or id(unit) in self._position:
                    self._order_frozen = True
                else:
                    self._position[id(unit)] = len(self._order)
                    self._order.append(unit)
            self._wait(unit)
            self._prefetch_from(unit, -1 if backward else 1)
            try:
                return original(*args, **kwargs)
            finally:
                fsdp.copy_in_done(group)
                self._release(unit)

        return around

    def _make_grad_done(self, unit: Unit):
        def grad_done(p: torch.Tensor) -> None:
            if unit.awaiting_grads > 0:
                unit.awaiting_grads -= 1
                if unit.awaiting_grads == 0:
                    self._release(unit)

        return grad_done

    def _frozen_backward_done(self, unit: Unit) -> None:
        if self._in_backward:
            self._release(unit)

    def _backward_done(self) -> None:
        self._in_backward = False
        for _, unit in self._units:
            unit.awaiting_grads = 0
            self._release(unit)

    # -- values for an offloaded optimizer ------------------------------------------------------------
    def manages(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is one of the parameters this offloader moves."""
        return id(p) in self._where

    def read_value(self, p: torch.Tensor) -> torch.Tensor:
        """A CPU copy of managed parameter ``p``'s current value, read from its block (any thread).

        Between a step's updates the block is current: bytes change only in place through ``p``, which
        moves its version counter, and then the device copy is the current one.
        """
        unit, i = self._where[id(p)]
        st, local = unit.stored[i], store.local_tensor(p.detach())
        if unit.resident and (st is None or unit.params[i]._version != unit.versions[i]):
            return local.to("cpu", copy=True)
        assert st is not None
        return store.get(st).reshape(-1).view(torch.uint8).view(local.dtype)[:local.numel()].view(local.shape)

    def write_value(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Make ``value`` (CPU, ``p``'s dtype and shape) managed parameter ``p``'s value, wherever it is now."""
        unit, i = self._where[id(p)]
        if unit.resident:
            with torch.no_grad():
                store.local_tensor(p.detach()).copy_(value)  # moves the storage's version: stored again when released
            return
        data = value.detach().reshape(-1).view(torch.uint8)
        st = unit.stored[i]
        assert st is not None
        if data.numel() != st.block.nbytes:  # an FSDP2 shard's padding: zeros, as fully_shard pads
            data = torch.cat([data, data.new_zeros(st.block.nbytes - data.numel())])
        new = store.put(self.pool, data, label=unit.labels[i], start=unit.start_tiers[i])
        store.free(unit.stored[i])
        unit.stored[i], unit.versions[i] = new, p._version

    # -- whole model ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter on the device inside the block (an optimizer step, ``state_dict()``); parameters
        changed inside are stored again on exit."""
        if self._closed:
            raise OffloadError(f"{self!r}: closed")
        for _, unit in self._units:
            self._start_fetch(unit)
        for _, unit in self._units:
            self._wait(unit)
        try:
            yield
        finally:
            for _, unit in self._units:
                if unit.group is not None:  # in-place ops on a DTensor do not move its shard's version counter
                    unit.versions = [-1] * len(unit.params)
                self._release(unit)

    def close(self) -> None:
        """Bring every parameter back to the device for good, remove the hooks and free the blocks.

        A block that cannot be read back (OffloadError: corrupted, truncated, missing) leaves its parameters
        empty; every other unit is restored and everything is freed before the first such error is raised.
        """
        if self._closed:
            return
        error: BaseException | None = None
        for _, unit in self._units:
            self._start_fetch(unit)
        for _, unit in self._units:
            try:
                self._wait(unit)
            except OffloadError as exc:
                error = error or exc
        self._closed = True
        for h in self._handles:
            h.remove()
        for _, unit in self._units:
            if unit.group is not None:
                fsdp.unwrap_unshard(unit.group)
        self._worker.shutdown(wait=True)
        for _, unit in self._units:
            for st in unit.stored:
                store.free(st)
            unit.stored = [None] * len(unit.params)
        if self._owns_pool:
            self.pool.close()
        if error is not None:
            raise error


def offload_parameters(model: nn.Module, pool: str | Pool | Tier | list[str | Tier] = "host", *,
                       prefetch: int | None = None, plan: Plan | None = None) -> ParameterOffloader:
    """Keep ``model``'s layer weights in ``pool`` between uses, fetched ``prefetch`` layers ahead.

    Args:
        model: the model; every module owning parameters is a unit moved on its own (parameters shared by
            several modules stay in place). Its parameters are emptied on return.
        pool: a pool spec string (``"host"``, ``"file:/scratch"``, ``"compress(file:/scratch)"``), a
            ``Pool``, a tier or a list.
        prefetch: units fetched ahead of the one running, in forward and in backward order (0: each is
            fetched when needed; default 1). Not with ``plan``, whose entries carry each module's depth.
        plan: a ``mcdla.workload.plan.Plan`` whose ``state`` entries say which modules' weights to move (to
            which tier, fetched how many units ahead: ``StateDecision.prefetch``); without it every module
            owning parameters is moved.

    Between uses a moved parameter's storage is empty: read it (a plain optimizer's ``step()``,
    ``model.state_dict()``, comparisons) only inside :meth:`ParameterOffloader.gathered` or after
    :meth:`ParameterOffloader.close`, which puts the weights back on the device; some ops (``torch.equal``)
    do not check and crash on an empty storage. ``offload_optimizer(..., parameters=...)`` needs no gathering.
    """
    return ParameterOffloader(model, pool=pool, prefetch=prefetch, plan=plan)
