"""The host tier: saved tensors in host memory, from a buffer pool that reuses buffers by size class.

With CUDA the buffers are page-locked (pinned) so device<->host copies run asynchronously on side streams;
on a CPU-only machine the tier keeps a pooled host copy (it frees no memory there, but runs the same
bookkeeping, which the tests and the overhead benchmark use).

NOTE [size classes]
    Buffers are reused only by exact class, and classes are spaced 1/8 of an octave apart (sizes between
    2^k and 2^(k+1) round up to a multiple of 2^(k-3)), so a buffer is at most 12.5% larger than asked for,
    not the up-to-2x of power-of-two rounding. Pinned buffers are registered with ``cudaHostRegister`` on
    ordinary host allocations for the same reason (torch's pinned allocator rounds to powers of two); if
    registering fails the pool falls back to ``pin_memory=True``. Free buffers stay cached for reuse until
    :meth:`HostBufferPool.trim`, which the runtime calls when a step aborts and when it closes.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict

import numpy as np
import psutil
import torch

from mcdla.errors import RuntimeTierError
from mcdla.runtime.pool import Block, Tier, TierFullError

__all__ = ["size_class_bytes", "HostBufferPool", "HostTier"]

_MIN_CLASS_BYTES = 4096
_CLASS_STEPS_PER_OCTAVE_LOG2 = 3  # 8 classes per power of two
_DEFAULT_HOST_FRACTION = 0.5  # default host capacity: this fraction of physical RAM


def size_class_bytes(nbytes: int) -> int:
    """The buffer size used for a request of ``nbytes`` (>= nbytes, at most 12.5% more above 4 KiB)."""
    if nbytes <= _MIN_CLASS_BYTES:
        return _MIN_CLASS_BYTES
    step = 1 << max(0, nbytes.bit_length() - 1 - _CLASS_STEPS_PER_OCTAVE_LOG2)
    return -(-nbytes // step) * step


class _HostBuffer:
    """A host byte buffer of one size class; unregisters its page lock when it dies."""

    __slots__ = ("tensor", "class_bytes", "registered")

    def __init__(self, class_bytes: int, pinned: bool) -> None:
        self.class_bytes = class_bytes
        self.registered = False
        if not pinned:
            self.tensor = torch.empty(class_bytes, dtype=torch.uint8)
            return
        tensor = torch.empty(class_bytes, dtype=torch.uint8)
        rc = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), class_bytes, 1))  # 1 = portable
        if rc == 0:
            self.tensor, self.registered = tensor, True
        else:
            self.tensor = torch.empty(class_bytes, dtype=torch.uint8, pin_memory=True)

    def __del__(self) -> None:
        if self.registered:
            self.registered = False
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())


class HostBufferPool:
    """Host byte buffers handed out by size class and cached for reuse (pinned when CUDA is available).

    Thread-safe. ``acquire`` returns a 1-D uint8 tensor of the class size (callers slice it);
    ``release`` returns it; with CUDA, ``release_after`` returns it once an event (a copy still reading or
    writing it) has completed.
    """

    def __init__(self, *, pinned: bool | None = None) -> None:
        self.pinned = torch.cuda.is_available() if pinned is None else bool(pinned)
        self._lock = threading.Lock()
        self._free: dict[int, list[_HostBuffer]] = defaultdict(list)  # class bytes -> cached buffers
        self._in_use: dict[int, _HostBuffer] = {}  # id(buffer tensor) -> buffer
        self._pending: list[tuple[_HostBuffer, object]] = []  # (buffer, CUDA event) awaiting completion
        self._in_use_bytes = 0
        self._cached_bytes = 0

    @property
    def in_use_bytes(self) -> int:
        """Bytes of buffers handed out and not yet returned (class sizes)."""
        return self._in_use_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes of free buffers kept for reuse."""
        return self._cached_bytes

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``nbytes``: a cached one of the same class, or a new one."""
        self._reap()
        cls = size_class_bytes(nbytes)
        with self._lock:
            free = self._free.get(cls)
            buf = free.pop() if free else None
            if buf is not None:
                self._cached_bytes -= cls
        if buf is None:
            buf = _HostBuffer(cls, self.pinned)
        with self._lock:
            self._in_use[id(buf.tensor)] = buf
            self._in_use_bytes += cls
        return buf.tensor

    def release(self, tensor: torch.Tensor) -> None:
        """Return a buffer from :meth:`acquire` to the cache."""
        with self._lock:
            buf = self._in_use.pop(id(tensor))
            self._in_use_bytes -= buf.class_bytes
            self._free[buf.class_bytes].append(buf)
            self._cached_bytes += buf.class_bytes

    def release_after(self, tensor: torch.Tensor, event: object) -> None:
        """Return a buffer once ``event`` (a ``torch.cuda.Event`` recorded after its last copy) completes."""
        with self._lock:
            buf = self._in_use[id(tensor)]
            self._pending.append((buf, event))
        self._reap()

    def _reap(self) -> None:
        with self._lock:
            if not self._pending:
                return
            done, waiting = [], []
            for buf, event in self._pending:
                (done if event.query() else waiting).append(buf)  # type: ignore[attr-defined]
            self._pending = [(b, e) for b, e in self._pending if b in waiting]
        for buf in done:
            self.release(buf.tensor)

    def trim(self) -> None:
        """Drop every cached buffer (waiting for pending copies first)."""
        with self._lock:
            pending = list(self._pending)
        for _, event in pending:
            event.synchronize()  # type: ignore[attr-defined]
        self._reap()
        with self._lock:
            self._free.clear()
            self._cached_bytes = 0


class HostTier(Tier):
    """Saved tensors in (pinned) host memory.

    Args:
        capacity_bytes: most bytes (size classes) held; None means half of physical RAM, since host
            memory, not device memory, is what offload runs out of first.
        buffers: the buffer pool to draw from (one per tier by default).
        name: tier name (default ``"host"``).
    """

    kind = "host"

    def __init__(
        self, *, capacity_bytes: float | None = None, buffers: HostBufferPool | None = None, name: str = "host"
    ) -> None:
        if capacity_bytes is None:
            capacity_bytes = math.floor(psutil.virtual_memory().total * _DEFAULT_HOST_FRACTION)
        super().__init__(name=name, capacity_bytes=capacity_bytes, io_threads=0)
        self.buffers = buffers if buffers is not None else HostBufferPool()

    def reservation_bytes(self, nbytes: int) -> int:
        return size_class_bytes(nbytes)

    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        n = len(data)
        try:
            buf = self.buffers.acquire(n)
        except RuntimeError as exc:  # allocation failure: out of (pinnable) host memory
            raise TierFullError(f"tier {self.name!r}: cannot allocate {n} B for {label}: {exc}") from exc
        np.copyto(buf.numpy()[:n], np.frombuffer(data, dtype=np.uint8))
        return Block(tier=self, nbytes=n, reserved_bytes=reserved_bytes, label=label, payload=buf)

    def adopt(self, buffer: torch.Tensor, *, nbytes: int, reserved_bytes: int, label: str) -> Block:
        """Make a buffer from :attr:`buffers` (already filled, e.g. by a device-to-host copy) a block."""
        block = Block(tier=self, nbytes=nbytes, reserved_bytes=reserved_bytes, label=label, payload=buffer)
        with self._lock:
            self._block_count += 1
        return block

    def host_tensor(self, block: Block) -> torch.Tensor:
        """The block's bytes as a host uint8 tensor (no copy), e.g. as the source of a host-to-device copy."""
        if block.freed:
            raise RuntimeTierError(f"{block.label}: block in tier {self.name!r} was already released")
        return block.payload[: block.nbytes]

    def _read_into(self, block: Block, out: memoryview) -> None:
        np.copyto(np.frombuffer(out, dtype=np.uint8), block.payload.numpy()[: block.nbytes])

    def _discard(self, block: Block) -> None:
        self.buffers.release(block.payload)
        block.payload = None

    def close(self) -> None:
        super().close()
        self.buffers.trim()
