"""The compress tier: lossless zstd compression in front of another tier.

NOTE [codec]
    zstd (the ``zstandard`` binding of the reference C library) at level -1 by default. Measured on this
    project's 2-core CI machine on 64 MiB of float32: level -1 compresses random floats at ~5 GB/s (ratio
    ~1.0, i.e. it gives up quickly on incompressible data) and ReLU outputs at ~0.6 GB/s to 59%; level 1
    reaches 56% on ReLU outputs but only at ~0.17 GB/s. Frames carry zstd's own content checksum and size,
    so a damaged block fails decompression (OffloadError) even when the inner tier keeps no checksum.
    Capacity: a capacity on this tier counts uncompressed bytes; the inner tier's counts the compressed
    bytes it stores, checked after compressing (a full inner tier makes the pool spill).
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any

import numpy as np

from mcdla.errors import OffloadError, RuntimeTierError
from mcdla.runtime.pool import Block, Tier, TierFullError

__all__ = ["CompressTier"]

_PIECE = 1 << 20  # bytes copied and fed to the compressor at a time (stays in L2)


class CompressTier(Tier):
    """Compress blocks with zstd, then store them in ``inner``.

    Args:
        inner: the tier that stores the compressed bytes.
        level: zstd level (negative = faster, less compression).
        capacity_bytes: most uncompressed bytes held; None means no limit beyond the inner tier's.
        io_threads: background threads that compress/decompress (and call the inner tier).
    """

    kind = "compress"

    def __init__(self, inner: Tier, *, level: int = -1, capacity_bytes: float | None = None, io_threads: int = 2) -> None:
        super().__init__(
            name=f"compress({inner.name})",
            capacity_bytes=math.inf if capacity_bytes is None else capacity_bytes,
            io_threads=max(io_threads, inner.io_threads),
        )
        import zstandard  # here, not at import: only pools with a compress tier need it

        self._zstd = zstandard
        self.inner = inner
        self.level = int(level)
        self._codecs = threading.local()  # per thread: zstd contexts are not thread-safe

    @property
    def stored_bytes(self) -> int:
        """Bytes the inner tier holds for this tier's blocks (compressed)."""
        return self.inner.used_bytes

    def stored_bytes_of(self, block: Block) -> int:
        return self.inner.stored_bytes_of(block.payload)

    def _compressor(self) -> Any:
        c = getattr(self._codecs, "c", None)
        if c is None:
            c = self._codecs.c = self._zstd.ZstdCompressor(level=self.level, write_checksum=True,
                                                           write_content_size=True)
        return c

    def _decompressor(self) -> Any:
        d = getattr(self._codecs, "d", None)
        if d is None:
            d = self._codecs.d = self._zstd.ZstdDecompressor()
        return d

    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        packed = self._compress(data)
        inner_reserved = self.inner.try_reserve(len(packed))
        if inner_reserved is None:
            raise TierFullError(f"tier {self.inner.name!r} (inside {self.name!r}) is full: no room for {label}")
        try:
            inner_block = self.inner.write(memoryview(packed), reserved_bytes=inner_reserved, label=label)
        except BaseException:
            self.inner.unreserve(inner_reserved)
            raise
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=inner_block)

    def _compress(self, data: memoryview) -> memoryview:
        """One zstd frame of ``data``, compressed from private copies of 1 MiB pieces.

        Not ``compress(data)`` in one call: zstd reads its input more than once (hash, match, checksum),
        and bytes of ``data`` may change meanwhile (NOTE [bytes that move] in ``pool``); a frame built from
        two versions of a byte fails its own checksum. The stream copies each piece before it returns.
        """
        src = np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, dtype=np.uint8)
        n = len(src)
        snap = getattr(self._codecs, "snap", None)
        if snap is None:
            snap = self._codecs.snap = np.empty(_PIECE, dtype=np.uint8)
        out = io.BytesIO()
        with self._compressor().stream_writer(out, size=n, closefd=False) as stream:  # faster than compressobj
            for start in range(0, n, _PIECE):
                m = min(_PIECE, n - start)
                np.copyto(snap[:m], src[start : start + m])
                stream.write(memoryview(snap[:m]))
        return out.getbuffer()

    def _read_into(self, block: Block, out: memoryview) -> None:
        inner_block: Block = block.payload
        packed = bytearray(inner_block.nbytes)
        self.inner.read_into(inner_block, memoryview(packed))
        try:
            raw = self._decompressor().decompress(packed, max_output_size=block.nbytes)
        except self._zstd.ZstdError as exc:
            raise OffloadError(f"{block.label}: block in tier {self.name!r} does not decompress: {exc}") from None
        if len(raw) != block.nbytes:
            raise OffloadError(
                f"{block.label}: block in tier {self.name!r} decompressed to {len(raw)} B, {block.nbytes} B written"
            )
        out[:] = raw

    def _discard(self, block: Block) -> None:
        failure = self.inner.free(block.payload)
        if failure is not None:  # NOTE [freeing never fails] in ``pool``: Tier.free reports it
            raise RuntimeTierError(failure)

    def close(self) -> None:
        super().close()
        self.inner.close()
