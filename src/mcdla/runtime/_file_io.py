"""Pieces of the file tier's direct I/O: chunk plans, bounce buffers, the per-I/O-thread worker, the closer.

Package-internal (the module is private; its names are what :mod:`mcdla.runtime.tiers_file` uses). See NOTE
[direct I/O] and NOTE [freeing blocks] there.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["ALIGN", "BOUNCE_DEPTH", "DIGESTS", "HUGE_PAGE", "O_DIRECT", "SUB", "Closer", "Crc32", "Inline",
           "KeyedBlake2b", "Worker", "bounce_buffers", "bytes_array", "chunk_plan", "is_direct", "pwrite_all", "round_up", "start"]

O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none (macOS): buffered I/O only
ALIGN = 4096  # O_DIRECT alignment of buffers, offsets and lengths (covers 512 B and 4 KiB sectors)
HUGE_PAGE = 2 << 20  # bounce buffers start on this boundary (transparent huge pages)
SUB = 256 << 10  # bytes the worker checksums and copies at a time: the second pass finds them in L2
BOUNCE_DEPTH = 3  # bounce buffers per block in flight: one on the disk, one with the worker, one spare


def round_up(n: int) -> int:
    """``n`` bytes rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def chunk_plan(n: int, step: int) -> list[tuple[int, int]]:
    """(offset, bytes) of each system call for a block of ``n`` bytes with direct I/O.

    ``step`` bytes each, except that a block of at least three steps starts and ends with smaller calls
    (1/8, 1/8, 1/4, 1/2 of a step, and the reverse): a write cannot start before its first chunk is copied
    and a read is not done before its last chunk is, so small first and last chunks shorten the part of
    the pipeline the disk does not overlap. Every offset, and every length but the last, is a multiple of
    ``ALIGN`` (``step`` must be one); the last call holds the unaligned rest.
    """
    assert step > 0 and step % ALIGN == 0, step
    if n < 3 * step or step % (8 * ALIGN):
        sizes = [step] * (n // step) + ([n % step] if n % step else [])
    else:
        ramp = [step // 8, step // 8, step // 4, step // 2]
        q, rest = divmod(n - 2 * step, step)
        aligned_rest = rest - rest % ALIGN
        sizes = ramp + [step] * q + ([aligned_rest] if aligned_rest else []) + ramp[::-1]
        sizes[-1] += rest % ALIGN
    return list(zip(itertools.accumulate([0, *sizes[:-1]]), sizes))


def bounce_buffers(nbytes: int, count: int) -> tuple[np.ndarray, ...]:
    """``count`` zeroed uint8 arrays of ``nbytes`` each, on transparent huge pages where the kernel gives them.

    One private anonymous mapping, cut at a 2 MiB boundary. O_DIRECT on buffers of 4 KiB pages took 40%
    longer per 8 MiB call here: a device request carries only so many segments (254 on this virtio disk),
    so the kernel split each call into more requests.
    """
    mem = mmap.mmap(-1, nbytes * count + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mem.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # no THP here: 4 KiB pages still work
        pass
    whole = np.frombuffer(mem, dtype=np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    whole[:] = 0  # fault it in now, once: the buffers are reused
    return tuple(whole[skip + i * nbytes : skip + (i + 1) * nbytes] for i in range(count))


def bytes_array(view: memoryview) -> np.ndarray:
    """``view`` (bytes) as a uint8 array without a copy."""
    return np.frombuffer(view, dtype=np.uint8) if len(view) else np.zeros(0, dtype=np.uint8)


def is_direct(fd: int) -> bool:
    """Whether ``fd`` was opened with O_DIRECT."""
    if not O_DIRECT:
        return False
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)


def pwrite_all(fd: int, buf: np.ndarray, offset: int) -> None:
    """Write all of ``buf`` at ``offset``."""
    done = 0
    while done < len(buf):
        done += os.pwrite(fd, buf[done:], offset + done)


def start(ex: ThreadPoolExecutor | None, fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn(*args)`` on ``ex``, or now in this thread when ``ex`` is None; a future either way."""
    if ex is not None:
        return ex.submit(fn, *args)
    fut: Future = Future()
    try:
        fut.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - delivered through the future, like the executor would
        fut.set_exception(exc)
    return fut


class Worker:
    """The worker thread of one I/O thread: copies chunks through bounce buffers and computes their CRC.

    Used as a context around one block (it gives its executor): on leaving with an error it waits until the
    worker no longer touches the block's buffers. The thread ends when the owning I/O thread ends (the
    thread-local reference goes, the executor is collected and its idle thread exits) or at ``shutdown``.
    """

    def __init__(self) -> None:
        self._ex = ThreadPoolExecutor(1, thread_name_prefix="mcdla-io-chunk")
        self.closed = False

    def __enter__(self) -> ThreadPoolExecutor:
        return self._ex

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None and not self.closed:  # drain: queued work still uses this block's buffers
            self._ex.submit(int).result()

    def shutdown(self) -> None:
        self.closed = True
        self._ex.shutdown(wait=True, cancel_futures=True)


class Inline:
    """Stands in for :class:`Worker` when a block is one chunk: everything runs in the calling thread."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Closer:
    """Closes file descriptors on a thread of its own, which ends once it has had nothing to do for a while."""

    LINGER_S = 0.2  # idle seconds before the thread ends (a step frees blocks every few milliseconds)

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._fds: list[int] = []
        self._thread: threading.Thread | None = None

    def close_later(self, fd: int) -> None:
        with self._cond:
            self._fds.append(fd)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name)
                self._thread.start()

    def join(self) -> None:
        """Wait until every descriptor handed over so far is closed."""
        with self._cond:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._fds:
                    self._cond.wait(self.LINGER_S)
                if not self._fds:
                    self._thread = None
                    return
                fds, self._fds = self._fds, []
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:  # the name is gone already; nothing anyone could do about it
                    pass


class Crc32:
    """CRC-32 (zlib) of the bytes fed in order: catches accidental damage (NOTE [block digests] in ``tiers_file``)."""

    name = "CRC-32"

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: Any) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return self._crc

    @staticmethod
    def show(value: Any) -> str:
        return f"{value:#010x}"


class KeyedBlake2b:
    """BLAKE2b-128 keyed with ``key`` (a MAC): catches deliberate edits that keep a CRC (NOTE [block digests])."""

    name = "keyed BLAKE2b"

    def __init__(self, key: bytes) -> None:
        self._h = hashlib.blake2b(key=key, digest_size=16)

    def update(self, data: Any) -> None:
        self._h.update(data)

    def value(self) -> bytes:
        return self._h.digest()

    @staticmethod
    def show(value: Any) -> str:
        return value.hex()


DIGESTS = ("crc32", "blake2b")  # FileTier(digest=...) choices
