"""The file tier: saved tensors in files on a local disk or NVMe, one file per block, each checksummed.

The runtime runs this tier's writes and reads on background I/O threads (``io_threads``), so on a CPU-only
machine the offload and prefetch overlap with compute exactly as device copies do on a GPU.

NOTE [file blocks]
    A block is one file ``mcdla-<pid>-<tier token>-<n>.blk`` in the tier's directory, written with plain
    ``os.write`` in ``chunk_bytes`` pieces straight from the tensor's memory (no intermediate copy), and read
    back with ``readinto`` into the destination tensor in pieces of the same size. The CRC-32 of the bytes (zlib, about 5 GB/s here) is
    computed chunk by chunk while writing and checked after reading; a wrong size or checksum raises
    OffloadError naming the tensor and the file, never returns the bytes. Files are not fsynced: they are
    scratch data that lives for one step, and the page cache is not counted in the process's resident
    memory. ENOSPC/EDQUOT raise TierFullError so the pool spills to the next tier; other OS errors raise
    RuntimeTierError. A failed write removes its partial file.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import secrets
import shutil
import zlib
from pathlib import Path

from mcdla.errors import ConfigError, OffloadError, RuntimeTierError
from mcdla.runtime.pool import Block, Tier, TierFullError

__all__ = ["FileTier"]

_DEFAULT_CHUNK_BYTES = 8 << 20  # per os.write/readinto: the CRC-32 runs on a chunk still in cache
_DEFAULT_DISK_FRACTION = 0.9  # default capacity: this fraction of the free space at construction
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class FileTier(Tier):
    """Saved tensors in block files under ``directory``.

    Args:
        directory: where block files go (created if missing; must be writable).
        capacity_bytes: most bytes held; None means 90% of the free space at construction.
        io_threads: background threads that write and read blocks.
        chunk_bytes: bytes per ``os.write``/``readinto`` call.
    """

    kind = "file"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        capacity_bytes: float | None = None,
        io_threads: int = 2,
        chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    ) -> None:
        path = Path(directory).expanduser().resolve()
        name = f"file:{path}"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"tier {name!r}: cannot create directory ({exc.strerror})") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"tier {name!r}: directory is not writable")
        if capacity_bytes is None:
            capacity_bytes = math.floor(shutil.disk_usage(path).free * _DEFAULT_DISK_FRACTION) or 1
        if chunk_bytes <= 0:
            raise ConfigError(f"tier {name!r}.chunk_bytes: got {chunk_bytes!r}; must be > 0")
        super().__init__(name=name, capacity_bytes=capacity_bytes, io_threads=io_threads)
        self.directory = path
        self.chunk_bytes = int(chunk_bytes)
        self._prefix = f"mcdla-{os.getpid()}-{secrets.token_hex(4)}-"
        self._counter = itertools.count()

    def block_paths(self) -> list[Path]:
        """Block files of this tier now on disk."""
        return sorted(self.directory.glob(self._prefix + "*.blk"))

    # -- the three block operations --------------------------------------------------------------------
    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        path = self.directory / f"{self._prefix}{next(self._counter)}.blk"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise self._os_error("creating", path, label, exc) from exc
        try:
            checksum = self._write_chunks(fd, data)
        except BaseException as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._os_error("writing", path, label, exc) from exc
            if isinstance(exc, Exception) and not isinstance(exc, RuntimeTierError):
                raise RuntimeTierError(
                    f"tier {self.name!r}: I/O thread failed writing {label} to {path.name}: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        os.close(fd)
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=path,
                     checksum=checksum)

    def _write_chunks(self, fd: int, data: memoryview) -> int:
        """Write ``data`` to ``fd``; return its CRC-32. (A seam for fault-injection tests.)"""
        crc = 0
        view = data.cast("B") if data.format != "B" else data
        for start in range(0, len(view), self.chunk_bytes):
            chunk = view[start : start + self.chunk_bytes]
            crc = zlib.crc32(chunk, crc)
            while chunk:
                written = os.write(fd, chunk)
                chunk = chunk[written:]
        return crc

    def _read_into(self, block: Block, out: memoryview) -> None:
        path: Path = block.payload
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise OffloadError(f"{block.label}: block file {path.name} of tier {self.name!r} is missing") from None
        except OSError as exc:
            raise self._os_error("opening", path, block.label, exc) from exc
        try:
            size = os.fstat(fd).st_size
            if size != block.nbytes:
                raise OffloadError(
                    f"{block.label}: block file {path.name} of tier {self.name!r} is truncated or resized: "
                    f"{size} B on disk, {block.nbytes} B written"
                )
            crc = self._read_chunks(fd, out, block)
        except OSError as exc:
            raise self._os_error("reading", path, block.label, exc) from exc
        finally:
            os.close(fd)
        if crc != block.checksum:
            raise OffloadError(
                f"{block.label}: block file {path.name} of tier {self.name!r} is corrupted "
                f"(CRC-32 {crc:#010x}, written {block.checksum:#010x})"
            )

    def _read_chunks(self, fd: int, out: memoryview, block: Block) -> int:
        crc, pos, n = 0, 0, len(out)
        view = out.cast("B") if out.format != "B" else out
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            while pos < n:
                got = f.readinto(view[pos : min(n, pos + self.chunk_bytes)])
                if not got:
                    raise OffloadError(
                        f"{block.label}: block file {block.payload.name} of tier {self.name!r} is truncated: "
                        f"read {pos} of {n} B"
                    )
                crc = zlib.crc32(view[pos : pos + got], crc)
                pos += got
        return crc

    def _discard(self, block: Block) -> None:
        path: Path = block.payload
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._os_error("removing", path, block.label, exc) from exc

    def _os_error(self, doing: str, path: Path, label: str, exc: OSError) -> RuntimeTierError:
        what = f"tier {self.name!r}: {doing} {path.name} for {label} failed: [Errno {exc.errno}] {exc.strerror}"
        if exc.errno in _FULL_ERRNOS:
            return TierFullError(what + " (disk full)")
        return RuntimeTierError(what)
