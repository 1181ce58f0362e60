"""The compress tier: lossless zstd compression in front of another tier.

NOTE [codec]
    zstd (the ``zstandard`` binding of the reference C library) at level -1 by default. Measured on this
    project's 2-core CI machine on 64 MiB of float32: level -1 compresses random floats at ~5 GB/s (ratio
    ~1.0, i.e. it gives up quickly on incompressible data) and ReLU outputs at ~0.6 GB/s to 59%; level 1
    reaches 56% on ReLU outputs but only at ~0.17 GB/s. Frames carry zstd's own content checksum and size,
    so a damaged block fails decompression (OffloadError) even when the inner tier keeps no checksum.
    Capacity: a capacity on this tier counts uncompressed bytes; the inner tier's counts the compressed
    bytes it stores, checked after compressing (a full inner tier makes the pool spill).

NOTE [incompressible blocks]
    Dense float activations (random mantissas) do not compress: zstd stored 100.002% of them, and running
    it cost the tier 0.14 GB/s against the plain file tier's 0.46 GB/s. So before compressing a block the
    tier compresses a sample, its first ``_SAMPLE_BYTES``, and stores the block raw in the inner tier when
    the sample does not shrink below ``_RAW_RATIO``; a block whose whole frame comes out no smaller than
    the block is stored raw too. A raw block costs one sample's compression (tens of microseconds) on top
    of the inner tier's write, and its integrity is the inner tier's (the file tier's CRC; the host tier
    keeps none), since it has no zstd frame checksum. Measured in ``benchmarks.bench_runtime_compress``.
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcdla.errors import OffloadError, RuntimeTierError
from mcdla.runtime.pool import Block, Tier, TierFullError

__all__ = ["CompressTier"]

_PIECE = 1 << 20  # bytes copied and fed to the compressor at a time (stays in L2)
_SAMPLE_BYTES = 64 << 10  # NOTE [incompressible blocks]: the part of a block compressed to decide
_RAW_RATIO = 0.97  # a sample that compresses to more than this fraction of itself: the block is stored raw


@dataclass(slots=True, kw_only=True, eq=False)
class _CompressedBlock(Block):
    """A block of this tier; ``raw``: stored uncompressed (NOTE [incompressible blocks])."""

    raw: bool = False


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
        stored = data if self._incompressible(data) else self._compress(data)
        if stored is not data and len(stored) >= len(data):
            stored = data  # the frame did not shrink: store the bytes as they are (NOTE [incompressible blocks])
        inner_reserved = self.inner.try_reserve(len(stored))
        if inner_reserved is None:
            raise TierFullError(f"tier {self.inner.name!r} (inside {self.name!r}) is full: no room for {label}")
        try:
            inner_block = self.inner.write(memoryview(stored), reserved_bytes=inner_reserved, label=label)
        except BaseException:
            self.inner.unreserve(inner_reserved)
            raise
        return _CompressedBlock(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label,
                                payload=inner_block, raw=stored is data)

    def _incompressible(self, data: memoryview) -> bool:
        """Whether ``data``'s first ``_SAMPLE_BYTES`` do not shrink (NOTE [incompressible blocks]); a block no
        larger than the sample is always compressed whole."""
        n = len(data)
        if n <= _SAMPLE_BYTES:
            return False
        snap = self._snapshot()
        np.copyto(snap[:_SAMPLE_BYTES], np.frombuffer(data, dtype=np.uint8, count=_SAMPLE_BYTES))
        return len(self._compressor().compress(snap[:_SAMPLE_BYTES])) > _RAW_RATIO * _SAMPLE_BYTES

    def _snapshot(self) -> np.ndarray:
        """The calling thread's private copy buffer (NOTE [bytes that move] in ``pool``)."""
        snap = getattr(self._codecs, "snap", None)
        if snap is None:
            snap = self._codecs.snap = np.empty(_PIECE, dtype=np.uint8)
        return snap

    def _compress(self, data: memoryview) -> memoryview:
        """One zstd frame of ``data``, compressed from private copies of 1 MiB pieces.

        Not ``compress(data)`` in one call: zstd reads its input more than once (hash, match, checksum),
        and bytes of ``data`` may change meanwhile (NOTE [bytes that move] in ``pool``); a frame built from
        two versions of a byte fails its own checksum. The stream copies each piece before it returns.
        """
        src = np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, dtype=np.uint8)
        n = len(src)
        snap = self._snapshot()
        out = io.BytesIO()
        with self._compressor().stream_writer(out, size=n, closefd=False) as stream:  # faster than compressobj
            for start in range(0, n, _PIECE):
                m = min(_PIECE, n - start)
                np.copyto(snap[:m], src[start : start + m])
                stream.write(memoryview(snap[:m]))
        return out.getbuffer()

    def _read_into(self, block: Block, out: memoryview) -> None:
        inner_block: Block = block.payload
        if isinstance(block, _CompressedBlock) and block.raw:
            self.inner.read_into(inner_block, out)
            return
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
