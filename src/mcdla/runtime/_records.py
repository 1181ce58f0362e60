"""Per-step bookkeeping: one record per saved storage, one handle per saved tensor (a view of a record).

NOTE [storages, not tensors]
    Autograd saves tensors, but memory belongs to storages: a layer's q, k and v are views of one qkv
    output, an in-place ReLU returns its input, a linear layer saves the same activation its ReLU saved.
    The runtime therefore moves whole storages and gives each saved tensor back as a view with its
    original dtype, size, stride and storage offset into the restored storage. Two saves share a record
    only while their bytes provably have not changed in between (NOTE [one version counter]).

NOTE [one version counter]
    The only evidence autograd keeps that a tensor's bytes have not changed is its version counter, and a
    counter belongs to a tensor and the autograd views of it (they share their base's counter), not to a
    storage. Several tensors with *separate* counters can alias one storage: ``unsafe_chunk`` and
    ``unsafe_split`` (used by the CPU GRU and LSTM cells: ``gates.unsafe_chunk(4, 1)``, then ``sigmoid_``
    on each chunk), ``.data``, ``set_``. Keying sharing on (storage, version) made a later save of chunk 1
    reuse the record (and the bytes copied out) of chunk 0 whenever the two counters happened to read the
    same number, after chunk 1 had been rewritten in place: the wrong bytes came back and the gradients
    were garbage, silently (``nn.GRU``, ``nn.GRUCell``, ``nn.LSTMCell``). So a record belongs to
    one *view root* (``t._base`` or ``t`` itself, which carries the counter): a save shares a record only
    when it has the same storage, the same root object (held by a weak reference, so a freed and reused
    address or object id never matches) and the root's counter has not moved. Aliases with other roots get
    records of their own (more bytes moved, never wrong bytes), and the unpack check watches the root's
    counter, so an in-place change through any view of the saved tensor is caught even after the saved
    tensor object itself died (PyTorch skips its own version check for tensors saved through hooks).
"""

from __future__ import annotations

import sys
import weakref
from concurrent.futures import Future
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from mcdla.runtime.pool import Block

if TYPE_CHECKING:
    from mcdla.runtime._step import _Step

__all__: list[str] = []

_Tensor, _STRIDED = torch.Tensor, torch.strided
_current_autograd_node = torch._C._current_autograd_node
_is_finalizing = sys.is_finalizing


def managed_storage(t: torch.Tensor, base: torch.Tensor | None, min_bytes: int, param_ptrs: set[int]) -> Any:
    """The storage of a saved tensor ``t`` (whose ``_base`` is ``base``, read once by the caller, which
    needs it too) if the runtime may move it, else None.

    Not moved: parameters and views of them (leaves that require grad, and any ``nn.Parameter``: a frozen
    one, such as a LoRA base weight, lives as long as the model, so moving it frees nothing and fetches it
    every step), storages of the model's parameters and buffers (``param_ptrs``), storages under
    ``min_bytes``, tensors saved during backward (checkpoint recomputation), and anything but plain strided
    CPU/CUDA tensors without conjugate or negative bits.
    """
    if type(t) is not _Tensor or t.layout is not _STRIDED or not (t.is_cpu or t.is_cuda):
        return None
    if t.is_quantized or t.is_conj() or t.is_neg() or _current_autograd_node() is not None:
        return None
    if t.requires_grad and t.is_leaf:
        return None  # a parameter (or another leaf that is trained)
    if base is not None and ((base.requires_grad and base.is_leaf) or isinstance(base, torch.nn.Parameter)):
        return None  # a view of one, e.g. weight.t() (a Parameter itself is not a plain Tensor: refused above)
    storage = t.untyped_storage()
    if storage.nbytes() < min_bytes or (param_ptrs and storage.data_ptr() in param_ptrs):
        return None
    return storage


class _State(Enum):
    """Where a record's bytes are."""

    RESIDENT = "resident"  # only on the device (we hold the source storage)
    OFFLOADING = "offloading"  # being copied to a tier; the source is still held
    OFFLOADED = "offloaded"  # only in a tier
    FETCHING = "fetching"  # being copied back
    READY = "ready"  # back on the device (or the source was reused), waiting for its unpacks
    CONSUMED = "consumed"  # every handle unpacked; bytes kept for another unpack (NOTE [backward twice] in _step)
    RELEASED = "released"  # every handle gone; the record left the tracker
    FAILED = "failed"  # a transfer failed; ``error`` says how


def storage_bytes(storage: Any) -> torch.Tensor:
    """A storage's bytes as a 1-D uint8 tensor (no copy), the form the tiers copy from."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _Record:
    """One managed storage of one step.

    NOTE [cheap records]
        A record is made at every save of a new storage, so it computes only what every record needs: the
        storage object (held, which keeps the bytes alive while the record holds them), its view root (held
        weakly) and version, and ``alias``, a detached alias of the first saved tensor, which the first
        handle's unpack returns while the record holds the bytes (building a view with ``set_`` costs five
        times a ``detach``; autograd gives the unpacked tensor a fresh version counter either way, as
        ``make_variable`` shallow-copies a tensor someone else holds), and whose stride and offset the first
        handle uses (kept on the record when the alias goes); the alias shares the saved tensor's version
        counter, so the unpack's in-place check reads it there. The weak reference to the storage is made
        when the record lets go of it (an offload landed), the device when first asked or before that, the
        bytes as a uint8 tensor when an offload starts, and the label when a message or a trace names the
        tensor.
    """

    __slots__ = (
        "id", "key", "step", "_device", "nbytes", "storage_ref", "root_ref", "version", "saved_seq", "layer", "dtype",
        "shape", "start_tier",
        "prefetch_at", "_label",
        "offload_now", "state", "source", "alias", "first_stride", "first_offset", "restored", "event", "block",
        "tier_name", "offload_future", "fetch_future", "handles_live", "pending", "error", "counted_resident",
        "counted_window", "held",
    )

    def __init__(self, rid: int, key: Any, step: _Step, storage: Any, alias: torch.Tensor, nbytes: int,
                 root: torch.Tensor, version: int, dtype: torch.dtype, shape: Any, layer: str, place: Any,
                 saved_seq: int, /) -> None:
        """Positional arguments: a record is made per new saved storage, and binding keywords costs more
        than the rest of this constructor (NOTE [hot path] in ``_step``). ``place``: the policy's
        ``_Placement`` (offload now?, first tier, module that triggers the fetch)."""
        self.id = rid
        self.key = key
        self.step = step
        self._device: torch.device | None = None  # read from the storage when first asked (``device``)
        self.nbytes = nbytes
        self.storage_ref: weakref.ref | None = None  # set when ``source`` is dropped
        self.root_ref = weakref.ref(root)
        self.version = version
        self.saved_seq = saved_seq  # autograd's counter when saved; -1: final when saved (NOTE [bytes final] in _step)
        self.layer = layer
        self.dtype = dtype
        self.shape = shape
        self._label: str | None = None
        self.start_tier = place.start_tier
        self.prefetch_at = place.prefetch_at
        self.offload_now = place.offload_now
        self.state = _State.RESIDENT
        self.source: Any = storage  # the storage object: held while resident, dropped once offloaded
        self.alias: torch.Tensor | None = alias  # the first save, detached: held and dropped with ``source``
        self.first_stride: tuple[int, ...] = ()  # the first save's stride and offset, kept when ``alias`` goes
        self.first_offset = 0
        self.restored: torch.Tensor | None = None  # fetched bytes (1-D uint8 on the device)
        self.event: Any = None  # CUDA event after which ``restored`` is valid
        self.block: Block | None = None
        self.tier_name = ""
        self.offload_future: Future | None = None
        self.fetch_future: Future | None = None
        self.handles_live = 1  # the first save's handle (which does not count itself)
        self.pending = 1  # handles not yet unpacked
        self.error: BaseException | None = None
        self.counted_resident = True  # a new record is resident, counted by the step
        self.counted_window = False
        self.held = False  # consumed, its bytes counted by ``_Lingering.hold`` (NOTE [memory honesty] in _liveness)

    @property
    def device(self) -> torch.device:
        """The storage's device (``storage.device`` costs a tenth of a record, so it is read on first use, and
        before the record lets go of the storage)."""
        device = self._device
        if device is None:
            held = self.source
            assert held is not None, "a record's device is read while it holds its storage"
            device = self._device = held.device
        return device

    @property
    def label(self) -> str:
        """How errors and traces name this tensor: id, module, dtype and shape of its first save."""
        if self._label is None:
            where = f"module {self.layer!r}" if self.layer else "no module"
            shape = "x".join(str(s) for s in self.shape)
            self._label = f"saved tensor #{self.id} ({where}, {str(self.dtype).removeprefix('torch.')}[{shape}])"
        return self._label

    def drop_source(self) -> Any:
        """Let go of the held storage object (keeping a weak reference to it, and the first save's geometry
        for the first handle's view of restored bytes); return it."""
        alias = self.alias
        if alias is not None:
            self.first_stride, self.first_offset = alias.stride(), alias.storage_offset()
        if self._device is None and self.source is not None:
            self._device = self.source.device
        storage, self.source, self.alias = self.source, None, None
        if storage is not None and self.storage_ref is None:
            self.storage_ref = weakref.ref(storage)
        return storage

    def storage_alive(self) -> bool:
        """Whether the original storage is still alive (held by the record or by anyone else)."""
        return self.source is not None or (self.storage_ref is not None and self.storage_ref() is not None)

    def same_storage(self, storage: Any, root: torch.Tensor, version: int) -> bool:
        """Whether a tensor with ``storage``, view root ``root`` and version ``version`` is a view of this
        record's root, unchanged since it was saved.

        Same storage is not enough: aliases with their own version counters may have rewritten the bytes
        (NOTE [one version counter]).
        """
        held = self.source
        if held is None:
            held = self.storage_ref() if self.storage_ref is not None else None
        return held is storage and self.root_ref() is root and self.version == version

    def current_version(self) -> int:
        """The version counter of the saved tensors now, which any in-place change through any view of the
        root bumps: read from ``alias`` while held (a ``detach`` shares its tensor's counter, and a view its
        base's), else from the root; the saved version when neither is alive (nothing can change it then)."""
        alias = self.alias
        if alias is not None:
            return alias._version
        root = self.root_ref()
        return self.version if root is None else root._version

    def bytes_now(self) -> Any:
        """The device storage available without a fetch (the source, or the restored bytes), if any."""
        if self.source is not None:
            return self.source
        restored = self.restored
        return None if restored is None else restored.untyped_storage()


class _Handle:
    """What autograd stores in place of a managed saved tensor: a view description plus its record.

    Its root and version are the record's: a handle is made only for a tensor with the record's view root
    at the record's version (``_Record.same_storage``). The first handle of a record (``first``) describes
    the record's ``alias``, so it stores no stride or offset of its own.
    """

    __slots__ = ("record", "dtype", "size", "stride", "offset", "unpacked", "first")

    def __init__(self, record: _Record, dtype: torch.dtype, size: Any, stride: Any, offset: int, first: bool,
                 /) -> None:
        """Positional arguments, as for ``_Record`` (NOTE [hot path] in ``_step``)."""
        self.record = record
        self.first = first  # the save that made the record: ``record.alias`` is this tensor, with its geometry
        self.dtype = dtype
        self.size = size
        self.stride = stride
        self.offset = offset
        self.unpacked = False
        if not first:  # the record counts its first handle from the start
            record.handles_live += 1
            record.pending += 1

    def view_of(self, storage: Any) -> torch.Tensor:
        """This saved tensor as a view into ``storage`` (the record's storage, original or restored)."""
        stride, offset = self.stride, self.offset
        if self.first:
            rec = self.record
            alias = rec.alias
            if alias is None:
                stride, offset = rec.first_stride, rec.first_offset
            elif storage is rec.source:
                return alias
            else:
                stride, offset = alias.stride(), alias.storage_offset()
        out = torch.empty(0, dtype=self.dtype, device=self.record.device)
        return out.set_(storage, offset, self.size, stride)

    def __del__(self) -> None:
        """Tell the record's step, under its lock (at once when the lock is free, NOTE [locking] in ``_sync``)."""
        if _is_finalizing():
            return
        rec = self.record
        step = rec.step
        if not step.foreign:  # NOTE [forked children] in ``_step``
            step._lock.call(step._on_handle_dead, rec, self.unpacked)
