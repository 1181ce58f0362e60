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
    were garbage, silently (issue #9: ``nn.GRU``, ``nn.GRUCell``, ``nn.LSTMCell``). So a record belongs to
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


def managed_storage(t: torch.Tensor, min_bytes: int, param_ptrs: set[int]) -> Any:
    """The storage of a saved tensor if the runtime may move it, else None.

    Not moved: parameters and views of them (leaves that require grad, and any ``nn.Parameter``: a frozen
    one, such as a LoRA base weight, lives as long as the model, so moving it frees nothing and fetches it
    every step), storages of the model's parameters and buffers (``param_ptrs``), storages under
    ``min_bytes``, tensors saved during backward (checkpoint recomputation), and anything but plain strided
    CPU/CUDA tensors without conjugate or negative bits.
    """
    if type(t) is not torch.Tensor or t.layout is not torch.strided or t.device.type not in ("cpu", "cuda"):
        return None
    if t.is_quantized or t.is_conj() or t.is_neg() or torch._C._current_autograd_node() is not None:
        return None
    if t.requires_grad and t.is_leaf:
        return None  # a parameter (or another leaf that is trained)
    base = t._base
    if base is not None and ((base.requires_grad and base.is_leaf) or isinstance(base, torch.nn.Parameter)):
        return None  # a view of one, e.g. weight.t() (a Parameter itself is not a plain Tensor: refused above)
    storage = t.untyped_storage()
    if storage.nbytes() < min_bytes or storage.data_ptr() in param_ptrs:
        return None
    return storage


def view_root(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose version counter ``t`` uses: its autograd base, or itself (NOTE [one version counter])."""
    base = t._base
    return t if base is None else base


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



class _Record:
    """One managed storage of one step."""

    __slots__ = (
        "id", "key", "step", "device", "nbytes", "storage_ref", "root_ref", "version", "saved_seq", "layer", "dtype",
        "shape", "start_tier",
        "prefetch_at", "_label",
        "offload_now", "state", "source", "restored", "event", "block", "tier_name", "offload_future",
        "fetch_future", "handles_live", "pending", "error", "counted_resident", "counted_window",
    )

    def __init__(self, *, rid: int, key: tuple[Any, ...], step: _Step, tensor: torch.Tensor, layer: str,
                 start_tier: int, prefetch_at: str | None, offload_now: bool, saved_seq: int) -> None:
        storage = tensor.untyped_storage()
        self.id = rid
        self.key = key
        self.step = step
        self.device = tensor.device
        self.nbytes = storage.nbytes()
        self.storage_ref = weakref.ref(storage)
        self.root_ref = weakref.ref(view_root(tensor))
        self.version = tensor._version
        self.saved_seq = saved_seq  # autograd's counter when saved; -1: final when saved (NOTE [bytes final] in _step)
        self.layer = layer
        self.dtype = tensor.dtype
        self.shape = tensor.shape
        self._label: str | None = None
        self.start_tier = start_tier
        self.prefetch_at = prefetch_at
        self.offload_now = offload_now
        self.state = _State.RESIDENT
        # the storage's bytes as a 1-D uint8 tensor: held while resident, dropped once offloaded
        self.source: torch.Tensor | None = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
        self.restored: torch.Tensor | None = None  # fetched bytes (1-D uint8 on the device)
        self.event: Any = None  # CUDA event after which ``restored`` is valid
        self.block: Block | None = None
        self.tier_name = ""
        self.offload_future: Future | None = None
        self.fetch_future: Future | None = None
        self.handles_live = 0
        self.pending = 0  # handles not yet unpacked
        self.error: BaseException | None = None
        self.counted_resident = False
        self.counted_window = False

    @property
    def label(self) -> str:
        """How errors and traces name this tensor: id, module, dtype and shape of its first save."""
        if self._label is None:
            where = f"module {self.layer!r}" if self.layer else "no module"
            shape = "x".join(str(s) for s in self.shape)
            self._label = f"saved tensor #{self.id} ({where}, {str(self.dtype).removeprefix('torch.')}[{shape}])"
        return self._label

    def same_storage(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a view of this record's root, unchanged since it was saved.

        Same storage is not enough: aliases with their own version counters may have rewritten the bytes
        (NOTE [one version counter]).
        """
        return (self.storage_ref() is tensor.untyped_storage() and self.root_ref() is view_root(tensor)
                and self.version == tensor._version)

    def bytes_now(self) -> torch.Tensor | None:
        """The device bytes available without a fetch (source or restored), if any."""
        return self.source if self.source is not None else self.restored


class _Handle:
    """What autograd stores in place of a managed saved tensor: a view description plus its record."""

    __slots__ = ("record", "dtype", "size", "stride", "offset", "origin", "version", "unpacked")

    def __init__(self, record: _Record, tensor: torch.Tensor) -> None:
        self.record = record
        self.dtype = tensor.dtype
        self.size = tensor.size()
        self.stride = tensor.stride()
        self.offset = tensor.storage_offset()
        self.origin = weakref.ref(view_root(tensor))  # the counter's owner lives as long as any view of it
        self.version = tensor._version
        self.unpacked = False
        record.handles_live += 1
        record.pending += 1

    def view_of(self, storage_bytes: torch.Tensor) -> torch.Tensor:
        """This saved tensor as a view into ``storage_bytes`` (the record's restored storage)."""
        out = torch.empty(0, dtype=self.dtype, device=storage_bytes.device)
        return out.set_(storage_bytes.untyped_storage(), self.offset, self.size, self.stride)

    def modified_version(self) -> int | None:
        """The saved tensor's current version if it was modified in place (through any view) since it was saved."""
        origin = self.origin()
        if origin is not None and origin._version != self.version:
            return origin._version
        return None

    def __del__(self) -> None:
        if sys.is_finalizing():
            return
        self.record.step._handle_dead(self.record, self.unpacked)
