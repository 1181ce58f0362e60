"""Honest accounting: which managed storages are really alive, not only those the runtime holds.

NOTE [memory honesty]
    The runtime counts as resident the storages it holds (``_Step._resident``). Letting go of a storage frees
    memory only if nothing else holds it, and two cases are common:
      - offloaded but still referenced: the model's input ``x`` (saved by the first Linear) and its output
        (saved by a final Tanh/Sigmoid) are held by the caller; offloading them frees nothing, and fetching
        them in backward makes a second copy;
      - handed back to autograd: after the last unpack of a storage the runtime lets go, but the node that
        unpacked it holds it until its backward has run (a compiled graph's backward unpacks all its saved
        tensors at once and holds them all).
    ``_Lingering`` watches every storage the runtime lets go of with a weak reference to its Python storage
    object (torch keeps one such object per storage alive exactly as long as the storage, whoever holds it:
    a tensor, autograd, a compiled graph) and counts its bytes until it dies. resident + lingering is then
    the bytes of managed storages alive in memory, which the report's ``peak_alive_saved_bytes`` tracks.

    A storage handed back to autograd is still referenced by its record until the record's handles die (NOTE
    [backward twice] in ``_step``). When the record's own references (the storage object and the alias of
    the first save) are the only ones at that moment (``torch._C._storage_Use_Count``), nothing else can
    start holding it except through the tensor autograd was handed, so it is counted with a plain counter
    (``hold``) instead of a weak reference, and looked at again when the record lets go (``unhold``): a
    weak reference is made then only if something else holds it. The counts are the same as with a weak
    reference from the start; a weak reference and its callback cost more than the rest of the unpack.

    Two more effects the runtime cannot undo are reported with a reason (``StepReport.not_freed``):
      - one autograd node saving several storages (a ``torch.compile`` graph saves every activation of its
        forward at its end, CPU ``nn.LSTM``'s mkldnn layer saves input, output and workspace at once): they
        are all in memory before the pack hook sees the first, so the peak inside that node stays;
      - pages never written (CPU): ``mkldnn_rnn_layer`` allocates a workspace much larger than it touches
        (489 MiB of which 160 MiB written, for a 512-wide LSTM over 256x64); untouched pages take no RAM,
        but offloading copies them and fetching writes them, so they become resident in backward.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import weakref
from typing import Any

import torch

__all__: list[str] = []

_PAGE = mmap.PAGESIZE
# Storages below this are not checked: the system call and its page vector cost ~8 us, a tenth of a small
# saved tensor's whole bookkeeping, and untouched pages matter in big workspaces (hundreds of MiB).
_MIN_CHECKED_BYTES = 4 << 20


def _load_mincore() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_mincore = _load_mincore()
# references to a storage (its C++ use count; private, present in the pinned torch). Without it every
# storage handed back is watched with a weak reference (NOTE [memory honesty]).
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def untouched_bytes(storage: Any) -> int:
    """Bytes of a CPU storage whose pages are not in RAM (never written, or swapped out); 0 if unknown."""
    if _mincore is None or storage.device.type != "cpu":
        return 0
    ptr, n = storage.data_ptr(), storage.nbytes()
    if n < _MIN_CHECKED_BYTES:
        return 0
    start = ptr - ptr % _PAGE
    pages = (ptr + n - start + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    if _mincore(start, pages * _PAGE, vec) != 0:
        return 0
    # whole pages inside the storage only; the partial first and last page are counted as touched
    missing = bytes(vec).count(0) - (vec[0] == 0) - (pages > 1 and vec[pages - 1] == 0)
    return max(0, missing) * _PAGE


class _Watch(weakref.ref):
    """A weak reference to a let-go storage that carries what its death un-counts (no closure per storage)."""

    __slots__ = ("key", "nbytes", "kind")


class _Lingering:
    """Storages the runtime let go of that are still alive elsewhere (NOTE [memory honesty]).

    Thread-safe; the weak-reference callbacks run in whichever thread drops a storage's last reference
    and only touch this object's counters (never the step's or the report's locks). ``held`` (``hold``,
    ``unhold``) is changed only under the step's lock, so it takes no lock of its own.
    """

    KINDS = ("offloaded", "returned")

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._watched: dict[int, _Watch] = {}  # id(storage object) -> weak reference with callback
        self.bytes = 0  # watched bytes
        self.held = 0  # bytes counted by ``hold`` ("returned"); alive in all: ``bytes + held``
        self.by_kind = dict.fromkeys(self.KINDS, 0)
        self._on_gone = self._gone

    def let_go(self, storage: Any, nbytes: int, kind: str) -> None:
        """The runtime is about to drop ``storage`` (a managed storage object): count it while it lives.

        Call it before dropping the reference; if nothing else holds the storage, it dies when the caller
        drops it and the count goes back down at once.
        """
        if storage is None:
            return
        key = id(storage)
        with self._mu:
            if key in self._watched:  # another record let go of the same storage already
                return
            ref = self._watched[key] = _Watch(storage, self._on_gone)
            ref.key, ref.nbytes, ref.kind = key, nbytes, kind
            self.bytes += nbytes
            self.by_kind[kind] += nbytes

    def hold(self, storage: Any, nbytes: int, own: int) -> bool:
        """Count ``storage`` ("returned"), still referenced by its record through ``own`` references, without
        a weak reference if nothing else references it (NOTE [memory honesty]); False (nothing counted):
        something else does, ``let_go`` it instead."""
        if _use_count is None or _use_count(storage._cdata) != own or id(storage) in self._watched:
            return False
        self.held += nbytes
        return True

    def unhold(self, storage: Any, nbytes: int, own: int) -> None:
        """The record let go of a ``hold``-counted storage, of whose references the caller accounts for
        ``own`` (as in ``hold``: 1 for the storage object alone, 2 with the alias of its first save):
        un-count it, and watch it if something else references it now."""
        self.held -= nbytes
        if _use_count(storage._cdata) > own:
            self.let_go(storage, nbytes, "returned")

    def _gone(self, ref: _Watch) -> None:
        with self._mu:
            if self._watched.get(ref.key) is ref:
                del self._watched[ref.key]
                self.bytes -= ref.nbytes
                self.by_kind[ref.kind] -= ref.nbytes

    def still_alive(self, kind: str) -> int:
        with self._mu:
            return self.by_kind[kind] + (self.held if kind == "returned" else 0)
