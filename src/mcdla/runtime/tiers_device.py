"""The device tier: another GPU's memory used as a memory node (``device:N``).

NOTE [peer copies]
    Blocks are uint8 tensors on ``cuda:N``. Copies from and to the training device run on a side stream of
    device N that first waits for an event recorded on the producer's stream, and record an event when
    done; the runtime holds the source tensor until that event completes, so the caching allocator cannot
    hand its memory out while the copy still reads it. With peer access enabled the copy goes over
    NVLink/PCIe directly, otherwise CUDA stages it through host memory. Not exercised on the CPU-only CI
    machine (the tests skip without two GPUs).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from mcdla.errors import ConfigError, RuntimeTierError
from mcdla.runtime.pool import Block, Tier, TierFullError

__all__ = ["DeviceTier"]

_DEFAULT_DEVICE_FRACTION = 0.9  # default capacity: this fraction of the device's free memory at construction


class DeviceTier(Tier):
    """Saved tensors in the memory of ``cuda:index``.

    Args:
        index: CUDA device index of the memory node.
        capacity_bytes: most bytes held; None means 90% of that device's free memory at construction.
    """

    kind = "device"

    def __init__(self, index: int, *, capacity_bytes: float | None = None) -> None:
        name = f"device:{index}"
        if not torch.cuda.is_available():
            raise ConfigError(f"tier {name!r}: CUDA is not available; use host or file tiers on this machine")
        if not 0 <= index < torch.cuda.device_count():
            raise ConfigError(f"tier {name!r}: got device {index}; this machine has {torch.cuda.device_count()} GPUs")
        if capacity_bytes is None:
            free, _total = torch.cuda.mem_get_info(index)
            capacity_bytes = math.floor(free * _DEFAULT_DEVICE_FRACTION)
        super().__init__(name=name, capacity_bytes=capacity_bytes, io_threads=0)
        self.device = torch.device("cuda", index)
        self._streams = threading.local()

    def _stream(self) -> torch.cuda.Stream:
        s = getattr(self._streams, "s", None)
        if s is None:
            s = self._streams.s = torch.cuda.Stream(device=self.device)
        return s

    # -- tensor interface (used for CUDA sources) -------------------------------------------------------
    def store_tensor(
        self, src: torch.Tensor, *, ready: torch.cuda.Event | None, reserved_bytes: int, label: str
    ) -> tuple[Block, torch.cuda.Event]:
        """Start copying ``src`` (uint8, any device) to this device; return the block and a done event."""
        stream = self._stream()
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            if ready is not None:
                stream.wait_event(ready)
            try:
                dst = torch.empty(src.numel(), dtype=torch.uint8, device=self.device)
            except torch.OutOfMemoryError as exc:
                raise TierFullError(f"tier {self.name!r}: out of memory storing {label}") from exc
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        block = Block(tier=self, nbytes=src.numel(), reserved_bytes=reserved_bytes, label=label, payload=dst)
        with self._lock:
            self._block_count += 1
        return block, done

    def load_tensor(self, block: Block, *, device: torch.device, stream: torch.cuda.Stream) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Start copying ``block`` to ``device`` on ``stream``; return the destination and a done event."""
        if block.freed:
            raise RuntimeTierError(f"{block.label}: block in tier {self.name!r} was already released")
        src: torch.Tensor = block.payload
        with torch.cuda.device(device), torch.cuda.stream(stream):
            dst = torch.empty(block.nbytes, dtype=torch.uint8, device=device)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        return dst, done

    # -- byte interface (host sources) ------------------------------------------------------------------
    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        host = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        try:
            dst = host.to(self.device)
        except torch.OutOfMemoryError as exc:
            raise TierFullError(f"tier {self.name!r}: out of memory storing {label}") from exc
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=dst)

    def _read_into(self, block: Block, out: memoryview) -> None:
        np.copyto(np.frombuffer(out, dtype=np.uint8), block.payload.cpu().numpy())

    def _discard(self, block: Block) -> None:
        block.payload = None
