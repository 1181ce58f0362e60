"""The file tier: saved tensors in files on a local disk or NVMe, one file per block, each checksummed.

The runtime runs this tier's writes and reads on background I/O threads (``io_threads``), so on a CPU-only
machine the offload and prefetch overlap with compute exactly as device copies do on a GPU.

NOTE [file blocks]
    A block is one file ``mcdla-<host tag>-<pid>-<tier token>-<n>.blk`` in the tier's directory (NOTE [crash
    cleanup] says why the owner is in the name). Its CRC-32 (zlib; or a keyed BLAKE2b, NOTE [block digests])
    is computed while writing and checked after reading; a wrong size or checksum raises OffloadError naming
    the tensor and the file, never returns the bytes. Files are not fsynced: they are scratch data that
    lives for one step. ENOSPC/EDQUOT raise TierFullError so the pool spills to the next tier, and so do
    EROFS/EACCES/EPERM/EIO when creating or writing a block (TierUnwritableError, NOTE [unwritable tiers] in
    ``pool``); other OS errors raise RuntimeTierError. A failed write removes its partial file; a freed
    block's file is removed.
    A full mark expires once ``shutil.disk_usage`` shows room again (NOTE [full marks expire] in ``pool``).

NOTE [block digests]
    ``digest="crc32"`` (the default) detects accidental damage: a flipped bit, a torn or stale write, a
    truncated or swapped file, anything not made to fool it. It does not defend against someone who can
    write the directory: a CRC is linear, so an edit can be chosen that keeps it, and the tensor comes back
    wrong, silently. ``digest="blake2b"`` stores a BLAKE2b-128 keyed with 32 random bytes drawn for the tier
    when it is built (``secrets``; held in memory only, never in a file), a MAC: without the key no edit
    that keeps it can be computed, so any change of the bytes is an OffloadError. It costs more CPU per byte
    than CRC-32 (``benchmarks.bench_runtime_digest`` measures both on the same bytes). Neither is
    encryption: whoever can read the directory can read the tensors.

NOTE [untrusted directory]
    A directory the tier creates is made 0700 (an existing one is left as it is). Blocks are opened with
    O_NOFOLLOW and, for reading, O_NONBLOCK, and must be regular files: a FIFO planted under a block's name
    used to block backward forever in ``open`` (issue #9), a symbolic link could point anywhere. Either is
    an OffloadError naming the tensor and the file. O_NONBLOCK changes nothing for a regular file.

NOTE [crash cleanup]
    Block files of a process that dies without freeing them used to stay forever, and each new tier took
    90% of what was left (issue #9). The name carries the owner: a host tag (hash of the host name and the
    pid namespace, so a directory shared by hosts or containers never judges another's pids) and the pid.
    A new FileTier sweeps the blocks of its own host tag whose pid is dead (``os.kill(pid, 0)`` raises
    ProcessLookupError), and those with its own pid but a tier token this process never made (an earlier
    run that had the same pid, as after a container restart). A live process's blocks are never touched;
    a dead owner whose pid was reused by an unrelated process is kept until that pid is free again.
    On the way out the process removes its own blocks: at interpreter exit (``weakref.finalize``, which also
    covers Ctrl-C and ``sys.exit``), and on SIGTERM when SIGTERM had its default action: the handler,
    installed by the first FileTier built in the main thread, removes the files, restores the default and
    sends itself the signal again, so the exit status is unchanged. A SIGTERM handler of the program's own
    is left alone (it may keep the process running; if it exits, the exit cleanup runs). SIGKILL leaves the
    files for the next sweep.

NOTE [forked children]
    A child made by ``os.fork`` (``multiprocessing`` with fork, a DataLoader worker) inherits the parent's
    tiers, finalizers and SIGTERM handler, and its exit or SIGTERM would remove the parent's block files
    under a running step. Every cleanup path is tied to its process: the finalizer carries the pid that
    made the prefix and does nothing elsewhere, the SIGTERM handler removes only prefixes naming its own
    pid, and ``_discard`` removes only files named with the tier's current prefix. An
    ``os.register_at_fork`` hook gives each tier in the child a prefix of its own (a fresh token and the
    child's pid, so its block names never collide with the parent's), a fresh lock (a parent thread may
    have held the old one at the fork) and no I/O helper threads. The step itself is guarded the same way
    (NOTE [forked children] in ``_step``).

NOTE [direct I/O]
    A block larger than ``chunk_bytes`` (8 MiB) bypasses the page cache (``O_DIRECT``) by default; smaller
    ones go through it as before. Profiled on the 2-core VM this was built on, the page cache, not the
    disk, was the cost of big blocks: a buffered write or cold read of 64 MiB took 35-40 ms of CPU (pages
    allocated, faulted in and copied), about what the disk needed, and the CRC-32 (2-4 GB/s on one core
    here, less when the cores are shared) came on top, so the tier got 0.63-0.85 of a raw page-cache
    ``dd``; the same disk moved the bytes with O_DIRECT at 1.5-2.6 GB/s for 2 ms of CPU. A small block has
    nothing to pipeline, and its synchronous direct write would wait for the disk where the page cache
    returns at memory speed (and a read soon after may find it cached): a training step with 2 MiB saved
    tensors (the MLP of ``bench_runtime_overlap``, 4096 rows) took 10-33% longer with every block direct.

    O_DIRECT needs buffer address, file offset and length aligned (``fio.ALIGN``); tensors are only 64-byte
    aligned, so chunks go through bounce buffers. The I/O thread only issues ``pwrite``/``preadv`` calls
    back to back, as ``dd`` does, while one worker thread of that I/O thread copies chunks into or out of
    ``fio.BOUNCE_DEPTH`` bounce buffers and computes the CRC in order, 256 KiB at a time so that its second
    pass over the bytes hits the cache (zlib and numpy drop the GIL). A second worker splitting the
    checksums did not help on 2 cores. The first and last chunks are small (``fio.chunk_plan``), since the
    disk idles while the first is copied and the last checked. The bounce buffers are on transparent huge
    pages (4 KiB pages made each 8 MiB call 40% slower: more device requests) and cached on the tier,
    because freshly touched memory is slow to fault in on a VM; the worker lives as long as the I/O thread
    that made it (the runtime's I/O threads end with each step). The last chunk is padded to ``fio.ALIGN``
    and the file truncated to the true size afterwards, so the size check still catches truncation. Where
    the filesystem refuses O_DIRECT (tmpfs, some network filesystems: EINVAL) the tier falls back to the
    page cache for good; ``direct=False`` asks for it. Direct I/O also keeps offloaded bytes out of RAM
    (dirty page cache counts against a container's memory limit); the price is that a big block read soon
    after it was written comes from the disk, not from the page cache.

NOTE [freeing blocks]
    Removing a 64 MiB block file took 13-36 ms here (ext4 mounted with ``discard`` frees the extents
    synchronously), almost all of it waiting, and the runtime frees each block right after reading it, on
    the I/O thread. For a block larger than a chunk, ``_discard`` therefore opens the file, unlinks its
    name (0.1 ms: the name is gone when ``free`` returns) and hands the descriptor to a closer thread,
    where the last close frees the disk blocks; the thread ends 0.2 s after its last close. Until then the
    space is not yet free, so a nearly full disk may report ENOSPC a little earlier than it would have.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
import weakref
import zlib
from concurrent.futures import Future
from pathlib import Path
from typing import Literal

import numpy as np

from mcdla.errors import ConfigError, OffloadError, RuntimeTierError
from mcdla.runtime import _file_io as fio
from mcdla.runtime.pool import Block, Tier, TierFullError, TierUnwritableError

__all__ = ["FileTier", "default_io_threads", "sweep_dead_blocks"]

_DEFAULT_CHUNK_BYTES = 8 << 20  # per pwrite/preadv call; also the size of each bounce buffer
_DEFAULT_DISK_FRACTION = 0.9  # default capacity: this fraction of the free space at construction
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})  # NOTE [unwritable tiers]
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BLOCK_NAME = re.compile(r"mcdla-([0-9a-f]{8})-(\d{1,10})-([0-9a-f]{8})-\d+\.blk")


def _host_tag() -> str:
    """8 hex digits naming this host and pid namespace (NOTE [crash cleanup])."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{zlib.crc32(f'{socket.gethostname()}/{ns}'.encode()):08x}"


_HOST_TAG = _host_tag()
_OWN_TOKENS: set[str] = set()  # tier tokens made by this process (a fork's child has another pid)
_LIVE_PREFIXES: dict[str, Path] = {}  # prefix -> directory of every FileTier alive in this process
_LIVE_TIERS: weakref.WeakSet[FileTier] = weakref.WeakSet()  # every FileTier alive, renamed in a forked child
_sigterm_installed = False


def _remove_blocks(directory: Path, prefix: str) -> int:
    """Remove ``directory``'s block files whose names start with ``prefix``; return how many. Never raises."""
    removed = 0
    try:
        with os.scandir(directory) as it:
            names = [e.name for e in it if e.name.startswith(prefix) and e.name.endswith(".blk")]
    except OSError:
        return 0
    for n in names:
        try:
            os.unlink(directory / n)
            removed += 1
        except OSError:
            pass
    return removed


def _forget(prefix: str, directory: Path, owner_pid: int) -> None:
    """Finalizer of a FileTier (collected, or the interpreter exits): its block files go (NOTE [crash cleanup]).

    Only in the process that made them: a forked child inherits the finalizer, and its exit must leave the
    parent's blocks alone (NOTE [forked children]).
    """
    if os.getpid() != owner_pid:
        return
    _LIVE_PREFIXES.pop(prefix, None)
    _remove_blocks(directory, prefix)


def _after_fork_in_child() -> None:
    """``os.register_at_fork`` hook: the child drops the parent's prefixes and renames its tiers
    (NOTE [forked children])."""
    _OWN_TOKENS.clear()
    _LIVE_PREFIXES.clear()
    for tier in list(_LIVE_TIERS):
        tier._adopt_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _owner_gone(pid: int, token: str) -> bool:
    if pid == os.getpid():
        return token not in _OWN_TOKENS  # an earlier process that had this pid
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # EPERM: alive, another user's
        return False
    return False


def sweep_dead_blocks(directory: str | os.PathLike[str]) -> int:
    """Remove block files in ``directory`` left by dead processes of this host; return how many.

    FileTier does this when it is built (NOTE [crash cleanup]). Only regular files named like blocks, of this
    host tag and owned by this user, whose owner process is gone, are removed.
    """
    path = Path(directory)
    removed = 0
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        return 0
    uid = os.getuid() if hasattr(os, "getuid") else None
    for e in entries:
        m = _BLOCK_NAME.fullmatch(e.name)
        if m is None or m.group(1) != _HOST_TAG or not _owner_gone(int(m.group(2)), m.group(3)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
                continue
            os.unlink(path / e.name)
            removed += 1
        except OSError:
            pass
    return removed


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM with the default action: remove this process's block files, then die of SIGTERM as before."""
    pid = os.getpid()
    for prefix, directory in list(_LIVE_PREFIXES.items()):
        if prefix.split("-")[2] == str(pid):  # never a parent's blocks (NOTE [forked children])
            _remove_blocks(directory, prefix)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_cleanup() -> None:
    """Install ``_on_sigterm`` once, from the main thread, and only over the default action (NOTE [crash cleanup])."""
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigterm_installed = True
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no signals here (an embedded interpreter, say)
        pass


def default_io_threads(cpus: int | None = None) -> int:
    """I/O threads a file tier gets by default: 1 on a machine with at most 2 usable CPUs, else 2.

    ``cpus`` is the number of CPUs this process may run on (None: ``os.sched_getaffinity``, or
    ``os.cpu_count`` where that does not exist). One I/O thread keeps the disk busy on its own (NOTE
    [direct I/O]); on 2 CPUs a second one adds threads that compete with the compute thread for no gain in
    step time (measurements in docs/runtime.md, "I/O threads").
    """
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
    return 1 if cpus <= 2 else 2


class FileTier(Tier):
    """Saved tensors in block files under ``directory``.

    Args:
        directory: where block files go (created if missing; must be writable).
        capacity_bytes: most bytes held; None means 90% of the free space at construction.
        io_threads: background threads that write and read blocks; None means :func:`default_io_threads`.
        chunk_bytes: bytes per write/read call (rounded up to a multiple of 4 KiB with direct I/O); blocks
            larger than this use direct I/O.
        direct: let blocks larger than ``chunk_bytes`` bypass the page cache with O_DIRECT where the
            filesystem allows it (NOTE [direct I/O]).
        digest: ``"crc32"`` (zlib CRC-32: accidental damage) or ``"blake2b"`` (BLAKE2b-128 keyed with a
            random key of this tier, never written anywhere: also deliberate edits; NOTE [block digests]).
    """

    kind = "file"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        capacity_bytes: float | None = None,
        io_threads: int | None = None,
        chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
        direct: bool = True,
        digest: Literal["crc32", "blake2b"] = "crc32",
    ) -> None:
        path = Path(directory).expanduser().resolve()
        name = f"file:{path}"
        if digest not in fio.DIGESTS:
            raise ConfigError(f"tier {name!r}.digest: got {digest!r}; must be one of {', '.join(fio.DIGESTS)}")
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)  # NOTE [untrusted directory]
        except OSError as exc:
            raise ConfigError(f"tier {name!r}: cannot create directory ({exc.strerror})") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"tier {name!r}: directory is not writable")
        if capacity_bytes is None:
            capacity_bytes = math.floor(shutil.disk_usage(path).free * _DEFAULT_DISK_FRACTION) or 1
        if chunk_bytes <= 0:
            raise ConfigError(f"tier {name!r}.chunk_bytes: got {chunk_bytes!r}; must be > 0")
        super().__init__(name=name, capacity_bytes=capacity_bytes,
                         io_threads=default_io_threads() if io_threads is None else io_threads)
        self.directory = path
        self.chunk_bytes = int(chunk_bytes)
        self.direct = bool(direct and fio.O_DIRECT)
        self.digest = digest
        self._key = secrets.token_bytes(32) if digest == "blake2b" else b""  # NOTE [block digests]
        self._claim_prefix()
        self.swept_blocks = sweep_dead_blocks(path)  # NOTE [crash cleanup]
        _install_sigterm_cleanup()
        self._bounce: list[tuple[np.ndarray, ...]] = []  # idle sets of bounce buffers (NOTE [direct I/O])
        self._start_threads_state()
        _LIVE_TIERS.add(self)

    def _claim_prefix(self) -> None:
        """Name this process's block files with a fresh token and register their cleanup (NOTE [crash cleanup])."""
        token = secrets.token_hex(4)
        _OWN_TOKENS.add(token)
        self._prefix = f"mcdla-{_HOST_TAG}-{os.getpid()}-{token}-"
        self._counter = itertools.count()
        _LIVE_PREFIXES[self._prefix] = self.directory
        weakref.finalize(self, _forget, self._prefix, self.directory, os.getpid())

    def _start_threads_state(self) -> None:
        self._per_thread = threading.local()  # .worker: the calling thread's Worker
        self._workers: weakref.WeakSet[fio.Worker] = weakref.WeakSet()  # all of them, for close()
        self._closer = fio.Closer(f"mcdla-io-free {self.directory.name}")

    def _adopt_in_child(self) -> None:
        """In a forked child: blocks of its own from now on, no locks or threads of the parent
        (NOTE [forked children])."""
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        self._claim_prefix()
        self._start_threads_state()

    def block_paths(self) -> list[Path]:
        """Block files of this tier now on disk."""
        return sorted(self.directory.glob(self._prefix + "*.blk"))

    def close(self) -> None:
        super().close()
        with self._lock:
            self._bounce.clear()
            workers = list(self._workers)
        for w in workers:
            w.shutdown()
        self._closer.join()

    # -- the three block operations --------------------------------------------------------------------
    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        path = self.directory / f"{self._prefix}{next(self._counter)}.blk"
        while True:
            direct = self._direct_for(len(data))
            try:
                fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, direct)
            except OSError as exc:
                raise self._os_error("creating", path, label, exc) from exc
            try:
                checksum = self._write_chunks(fd, data)
            except BaseException as exc:
                os.close(fd)
                path.unlink(missing_ok=True)
                if direct and isinstance(exc, OSError) and exc.errno == errno.EINVAL:
                    self.direct = False  # O_DIRECT accepted at open but not for I/O here: write buffered
                    continue
                if isinstance(exc, OSError):
                    raise self._os_error("writing", path, label, exc) from exc
                if isinstance(exc, Exception) and not isinstance(exc, RuntimeTierError):
                    raise RuntimeTierError(
                        f"tier {self.name!r}: I/O thread failed writing {label} to {path.name}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                raise
            os.close(fd)
            return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=path,
                         checksum=checksum)

    def _read_into(self, block: Block, out: memoryview) -> None:
        path: Path = block.payload
        while True:
            direct = self._direct_for(block.nbytes)
            try:
                fd = self._open(path, os.O_RDONLY | _O_NONBLOCK | _O_NOFOLLOW, direct)  # NOTE [untrusted directory]
            except FileNotFoundError:
                raise OffloadError(f"{block.label}: block file {path.name} of tier {self.name!r} is missing") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._not_regular(block, "a symbolic link") from None
                raise self._os_error("opening", path, block.label, exc) from exc
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise self._not_regular(block, "not a regular file")
                size = st.st_size
                if size != block.nbytes:
                    raise OffloadError(
                        f"{block.label}: block file {path.name} of tier {self.name!r} is truncated or resized: "
                        f"{size} B on disk, {block.nbytes} B written"
                    )
                digest = self._read_chunks(fd, out, block)
            except OSError as exc:
                if direct and exc.errno == errno.EINVAL:
                    self.direct = False  # as in _write: read it again through the page cache
                    continue
                raise self._os_error("reading", path, block.label, exc) from exc
            finally:
                os.close(fd)
            break
        if digest != block.checksum:
            kind = self._digest()
            raise OffloadError(
                f"{block.label}: block file {path.name} of tier {self.name!r} is corrupted "
                f"({kind.name} {kind.show(digest)}, written {kind.show(block.checksum)})"
            )

    def _discard(self, block: Block) -> None:
        path: Path = block.payload
        if not path.name.startswith(self._prefix):  # a parent's block seen from a forked child: not ours to remove
            return
        fd = -1
        if block.nbytes > self.chunk_bytes:  # NOTE [freeing blocks]: the last close frees the disk blocks
            try:
                fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | _O_NOFOLLOW)  # NOTE [untrusted directory]
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    fd = -1
            except OSError:
                fd = -1  # missing (nothing to do) or not openable: plain unlink below
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            raise self._os_error("removing", path, block.label, exc) from exc
        if fd >= 0:
            self._closer.close_later(fd)

    # -- chunk loops (seams for fault-injection tests) -------------------------------------------------
    def _write_chunks(self, fd: int, data: memoryview) -> int:
        """Write ``data`` to ``fd``; return its digest (NOTE [block digests])."""
        view = data.cast("B") if data.format != "B" else data
        n = len(view)
        if not fio.is_direct(fd):  # NOTE [bytes that move] in pool: checksum and write a private copy
            src, snap = fio.bytes_array(view), self._snapshot_buffer(min(n, self.chunk_bytes))
            crc = self._digest()
            for start in range(0, n, self.chunk_bytes):
                m = min(self.chunk_bytes, n - start)
                for i in range(0, m, fio.SUB):  # the CRC reads what the copy just wrote, still in cache
                    j = min(m, i + fio.SUB)
                    np.copyto(snap[i:j], src[start + i : start + j])
                    crc.update(snap[i:j])
                chunk = memoryview(snap[:m])
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
            return crc.value()
        src = fio.bytes_array(view)
        step = fio.round_up(self.chunk_bytes)
        plan = fio.chunk_plan(n, step)
        bufs = self._acquire_bounce(step)
        crc = self._digest()

        def fill(k: int) -> None:  # chunk k into its bounce buffer, zero-padded, and into the CRC (in order)
            (start, m), buf = plan[k], bufs[k % len(bufs)]
            for i in range(0, m, fio.SUB):  # the CRC reads what the copy just wrote, still in cache
                j = min(m, i + fio.SUB)
                np.copyto(buf[i:j], src[start + i : start + j])
                crc.update(buf[i:j])
            buf[m : fio.round_up(m)] = 0

        try:
            with self._worker_for(len(plan) > 1) as worker:
                fills = [fio.start(worker, fill, k) for k in range(min(len(bufs), len(plan)))]
                for k, (start, m) in enumerate(plan):
                    fills[k].result()
                    fio.pwrite_all(fd, bufs[k % len(bufs)][: fio.round_up(m)], start)
                    if k + len(bufs) < len(plan):  # refill the buffer just written
                        fills.append(fio.start(worker, fill, k + len(bufs)))
        finally:
            self._release_bounce(bufs)
        if n % fio.ALIGN:
            os.ftruncate(fd, n)  # drop the last chunk's padding
        return crc.value()

    def _read_chunks(self, fd: int, out: memoryview, block: Block) -> int:
        """Read ``len(out)`` bytes of ``fd`` into ``out``; return their digest (NOTE [block digests])."""
        view = out.cast("B") if out.format != "B" else out
        n = len(view)
        if not fio.is_direct(fd):
            crc, pos = self._digest(), 0
            while pos < n:
                got = os.readv(fd, [view[pos : min(n, pos + self.chunk_bytes)]])
                if not got:
                    raise self._truncated(block, pos, n)
                crc.update(view[pos : pos + got])
                pos += got
            return crc.value()
        dst = fio.bytes_array(view)
        step = fio.round_up(self.chunk_bytes)
        plan = fio.chunk_plan(n, step)
        bufs = self._acquire_bounce(step)
        crc = self._digest()

        def empty(k: int) -> None:  # chunk k into the CRC (in order) and out of its bounce buffer
            (start, m), buf = plan[k], bufs[k % len(bufs)]
            for i in range(0, m, fio.SUB):  # the copy reads what the CRC just read, still in cache
                j = min(m, i + fio.SUB)
                crc.update(buf[i:j])
                np.copyto(dst[start + i : start + j], buf[i:j])

        try:
            with self._worker_for(len(plan) > 1) as worker:
                empties: list[Future] = []
                for k, (start, m) in enumerate(plan):
                    if k >= len(bufs):
                        empties[k - len(bufs)].result()  # that buffer is checked and copied out: free
                    got = os.preadv(fd, [bufs[k % len(bufs)][: fio.round_up(m)]], start)
                    if got < m:
                        raise self._truncated(block, start + got, n)
                    empties.append(fio.start(worker, empty, k))
                for e in empties:
                    e.result()
        finally:
            self._release_bounce(bufs)
        return crc.value()

    # -- helpers ---------------------------------------------------------------------------------------
    def _digest(self) -> fio.Crc32 | fio.KeyedBlake2b:
        """A fresh digest of the tier's kind (NOTE [block digests])."""
        return fio.KeyedBlake2b(self._key) if self._key else fio.Crc32()

    def _direct_for(self, nbytes: int) -> bool:
        """Whether a block of ``nbytes`` goes around the page cache: only blocks of several chunks do."""
        return self.direct and nbytes > self.chunk_bytes

    def _open(self, path: Path, flags: int, direct: bool) -> int:
        if direct:
            try:
                return os.open(path, flags | fio.O_DIRECT, 0o600)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False  # this filesystem has no O_DIRECT: buffered from now on
        return os.open(path, flags, 0o600)

    def _worker_for(self, wanted: bool) -> fio.Worker | fio.Inline:
        """The calling thread's worker (made at its first block of several chunks), or inline work."""
        if not wanted or self._closed:
            return fio.Inline()
        worker = getattr(self._per_thread, "worker", None)
        if worker is None or worker.closed:
            worker = self._per_thread.worker = fio.Worker()
            with self._lock:
                self._workers.add(worker)
        return worker

    def _snapshot_buffer(self, nbytes: int) -> np.ndarray:
        """The calling thread's buffer for copies of buffered writes, at least ``nbytes`` long (kept, reused)."""
        buf = getattr(self._per_thread, "snap", None)
        if buf is None or len(buf) < nbytes:
            buf = self._per_thread.snap = np.empty(nbytes, dtype=np.uint8)
        return buf

    def _acquire_bounce(self, nbytes: int) -> tuple[np.ndarray, ...]:
        with self._lock:
            while self._bounce:
                bufs = self._bounce.pop()
                if len(bufs[0]) == nbytes:
                    return bufs
        return fio.bounce_buffers(nbytes, fio.BOUNCE_DEPTH)

    def _release_bounce(self, bufs: tuple[np.ndarray, ...]) -> None:
        with self._lock:
            if not self._closed and len(self._bounce) < max(2, self.io_threads):
                self._bounce.append(bufs)

    def _room_returned(self, need: int) -> bool:
        """After ENOSPC: whether the disk shows room for ``need`` bytes (NOTE [full marks expire] in ``pool``)."""
        try:
            return shutil.disk_usage(self.directory).free >= need
        except OSError:
            return True  # cannot tell: let the next write find out

    def _not_regular(self, block: Block, what: str) -> OffloadError:
        return OffloadError(
            f"{block.label}: block file {block.payload.name} of tier {self.name!r} is {what}; refusing to read it"
        )

    def _truncated(self, block: Block, pos: int, n: int) -> OffloadError:
        return OffloadError(
            f"{block.label}: block file {block.payload.name} of tier {self.name!r} is truncated: read {pos} of {n} B"
        )

    def _os_error(self, doing: str, path: Path, label: str, exc: OSError) -> RuntimeTierError:
        what = f"tier {self.name!r}: {doing} {path.name} for {label} failed: [Errno {exc.errno}] {exc.strerror}"
        if exc.errno in _FULL_ERRNOS:
            return TierFullError(what + " (disk full)")
        if doing in ("creating", "writing") and exc.errno in _UNWRITABLE_ERRNOS:
            return TierUnwritableError(what)
        return RuntimeTierError(what)
