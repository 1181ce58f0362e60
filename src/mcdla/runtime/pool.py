"""Memory pools: an ordered chain of tiers that hold offloaded saved tensors, and the pool spec grammar.

A tier stores byte strings (blocks) and gives them back once: ``write`` returns a :class:`Block`,
``read_into`` copies it out and ``free`` releases it. A :class:`Pool` is a chain of tiers with capacities;
a tensor goes to the first tier with room and spills to the next when a tier is full (capacity reached, or
the disk reports ENOSPC while writing) or refuses the block (NOTE [unwritable tiers]).

NOTE [pool spec grammar]
    pool  := tier ("," tier)*
    tier  := base ["@" SIZE]
    base  := "host" | "device:" INT | "file:" PATH | "compress(" tier ")"
SIZE is anything :func:`mcdla.units.parse_bytes` reads ("64GiB", "512MB", "inf"); it caps the bytes the
tier holds. PATH may not contain ``,``, ``@``, ``(`` or ``)``. Examples: ``"host"``,
``"host@8GiB,file:/scratch"``, ``"compress(file:/scratch@100GiB)"``. For ``compress(...)`` a capacity
outside the parentheses counts uncompressed bytes, one inside counts what the inner tier stores.
Tier names are the spec without capacities (``"compress(file:/scratch)"``); a plan's ``Decision.tier``
names a tier by that name or by its kind (``"host"``, ``"file"``, ``"compress"``, ``"device"``).

NOTE [full marks expire]
    A tier whose medium reports full while writing (ENOSPC, EDQUOT, out of device memory) is marked full:
    its capacity drops to what it holds, so the pool spills to the next tier at once instead of failing
    one write per tensor. The mark used to be permanent, so one transient ENOSPC (a checkpoint being
    written next to the scratch files, say) made the tier full for the life of the pool (issue #9). Now
    the configured capacity comes back once the mark is ``full_retry_s`` (1 s) old and the tier says there
    is room again (``_room_returned``: always for tiers that cannot tell, free disk space for the file
    tier); until then its own frees still make room below the lowered capacity. A medium that stays full
    costs at most one failed write per ``full_retry_s``, and none where the tier can see it is still full.

NOTE [unwritable tiers]
    A medium can refuse new blocks without being full: the filesystem remounted read-only (EROFS), the
    directory's permissions changed (EACCES, EPERM), the disk failing (EIO). Such a refusal at create or
    write raises TierUnwritableError, a TierFullError, so the tier is marked full (NOTE [full marks expire])
    and the block goes to the next tier, and the step's report carries a warning naming the tier and the
    error; with no tier left the step fails as for a full pool. Only the write path spills: a read that
    fails is the tensor's failure (its bytes are in that tier and nowhere else).

NOTE [freeing never fails]
    Freeing runs when bytes are no longer needed: a fetch has read them, a handle died, a step is aborted.
    If removing them fails (a read-only remount, EACCES, EBUSY, EIO), nothing the step computes is wrong,
    so ``Tier.free`` releases the capacity, returns a one-line description instead of raising, and the
    runtime puts it in the report's ``warnings``; a fetch whose read succeeded is never failed by its free,
    and an abort frees every block, settles, stops the I/O threads and finishes whatever a free does.

NOTE [bytes that move]
    ``write`` may be handed bytes that change while it runs. A record offloads its whole storage, but only
    the bytes under its saved views are final (NOTE [bytes final] in ``_step``); the rest may belong to an
    alias with its own version counter that is still being written (the CPU LSTM cell's ``unsafe_chunk``,
    then ``sigmoid_`` on the next chunk while the previous one is offloaded). A tier must therefore check
    what it stored, not what it was handed: it copies a chunk somewhere private first and checksums or
    compresses the copy. Checksumming the source and then writing it made the file and compress tiers
    report "corrupted" for bytes nobody would read (a CI failure; 29 of 30 writes in a stress test).
    The copy costs the file tier's buffered writes (blocks up to ``chunk_bytes``) 12-33% of their time here
    (2 cores, page cache, 256 KiB-8 MiB blocks); direct I/O copied into bounce buffers already.
"""

from __future__ import annotations

import abc
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mcdla.errors import ConfigError, OffloadError, RuntimeTierError
from mcdla.units import format_bytes, parse_bytes

__all__ = ["Block", "Tier", "TierFullError", "TierUnwritableError", "Pool", "parse_pool", "as_pool"]


class TierFullError(RuntimeTierError):
    """A tier has no room for a block (capacity reached or the disk reported ENOSPC); the pool spills."""


class TierUnwritableError(TierFullError):
    """A tier's medium refused a new block (read-only, no permission, I/O error); the pool spills as when full.

    A subclass of TierFullError so that a spill treats both alike; the report warns about this one
    (NOTE [unwritable tiers]).
    """


@dataclass(slots=True, kw_only=True, eq=False)
class Block:
    """One byte string held by a tier.

    Attributes:
        tier: the tier that holds it.
        nbytes: bytes the caller wrote (before any compression).
        reserved_bytes: capacity the block holds in its tier (bytes; a size class, or compressed size).
        label: what the bytes are, for error messages (the saved tensor's id, module, dtype and shape).
        payload: tier-specific handle (host buffer, file path, inner block, device tensor).
        checksum: CRC-32 of the stored bytes where the tier keeps one.
        freed: set once the block is released; reading it again is an error.
    """

    tier: Tier
    nbytes: int
    reserved_bytes: int
    label: str
    payload: Any = None
    checksum: int | None = None
    freed: bool = False


class Tier(abc.ABC):
    """A place that holds blocks, with a capacity in bytes.

    Subclasses implement ``_write``, ``_read_into`` and ``_discard``; this base keeps the capacity
    accounting, the once-only read rule and the thread safety of that accounting. ``io_threads`` is how many
    background threads the runtime gives the tier (0: it works in the caller's thread).
    """

    kind: ClassVar[str] = "tier"
    full_retry_s: ClassVar[float] = 1.0  # NOTE [full marks expire]

    def __init__(self, *, name: str, capacity_bytes: float, io_threads: int) -> None:
        if not (capacity_bytes > 0):
            raise ConfigError(f"tier {name!r}.capacity_bytes: got {capacity_bytes!r}; must be > 0")
        if io_threads < 0:
            raise ConfigError(f"tier {name!r}.io_threads: got {io_threads!r}; must be >= 0")
        self.name = name
        self.capacity_bytes = float(capacity_bytes)
        self.io_threads = int(io_threads)
        self._lock = threading.Lock()
        self._used_bytes = 0
        self._block_count = 0
        self._closed = False
        self._nominal_capacity: float | None = None  # the configured capacity while marked full
        self._full_since = 0.0  # time.monotonic() of the last full mark (or of the last check that kept it)

    def __repr__(self) -> str:
        cap = "inf" if math.isinf(self.capacity_bytes) else format_bytes(self.capacity_bytes)
        return f"{type(self).__name__}({self.name!r}, capacity={cap}, used={format_bytes(self._used_bytes)})"

    # -- accounting ------------------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        """Bytes of capacity held by live blocks and reservations."""
        return self._used_bytes

    @property
    def block_count(self) -> int:
        """Live blocks in this tier."""
        return self._block_count

    @property
    def free_bytes(self) -> float:
        return max(0.0, self.capacity_bytes - self._used_bytes)

    def reservation_bytes(self, nbytes: int) -> int:
        """Capacity a block of ``nbytes`` takes here (host buffers round up to a size class)."""
        return nbytes

    def stored_bytes_of(self, block: Block) -> int:
        """Bytes the block occupies on its medium (compressed size for ``compress(...)``)."""
        return block.nbytes

    def try_reserve(self, nbytes: int) -> int | None:
        """Reserve room for ``nbytes``; return the bytes reserved, or None when the tier is full."""
        need = self.reservation_bytes(nbytes)
        with self._lock:
            if self._closed:
                raise RuntimeTierError(f"tier {self.name!r}: closed; cannot store more blocks")
            if self._used_bytes + need > self.capacity_bytes and not self._unmark_full(need):
                return None
            self._used_bytes += need
        return need

    def unreserve(self, reserved_bytes: int) -> None:
        """Give back a reservation that did not become a block."""
        with self._lock:
            self._used_bytes -= reserved_bytes
            assert self._used_bytes >= 0, (self.name, self._used_bytes)

    @property
    def marked_full(self) -> bool:
        """Whether the medium reported full and the configured capacity is not back yet (NOTE [full marks expire])."""
        return self._nominal_capacity is not None

    def mark_full(self) -> None:
        """Lower the capacity to what is in use now (the medium said it is full), for a while
        (NOTE [full marks expire])."""
        with self._lock:
            if self._nominal_capacity is None:
                self._nominal_capacity = self.capacity_bytes
            self.capacity_bytes = float(self._used_bytes)
            self._full_since = time.monotonic()

    def _unmark_full(self, need: int) -> bool:
        """Under the lock, for a reservation that does not fit: whether the full mark was lifted and now it fits."""
        if self._nominal_capacity is None:
            return False
        now = time.monotonic()
        if now - self._full_since < self.full_retry_s:
            return False
        if not self._room_returned(need):
            self._full_since = now  # still full: look again in full_retry_s
            return False
        self.capacity_bytes, self._nominal_capacity = self._nominal_capacity, None
        return self._used_bytes + need <= self.capacity_bytes

    def _room_returned(self, need: int) -> bool:
        """Whether the medium may take ``need`` more bytes after it reported full (called under the lock).

        The base cannot tell and says yes: the next write tries, and marks the tier full again if it fails.
        """
        return True

    # -- blocks ----------------------------------------------------------------------------------------
    def write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        """Store ``data`` (bytes) under a reservation from :meth:`try_reserve`; return its block.

        ``data`` may change while this runs (NOTE [bytes that move]): what is checked on reading is what
        was stored.

        Raises TierFullError when the medium is full (the pool spills), RuntimeTierError on other failures.
        The reservation stays with the caller when this raises.
        """
        block = self._write(data, reserved_bytes=reserved_bytes, label=label)
        with self._lock:
            self._block_count += 1
        return block

    def read_into(self, block: Block, out: memoryview) -> None:
        """Copy ``block``'s bytes into ``out`` (exactly ``block.nbytes`` long), checking their integrity."""
        if block.freed:
            raise OffloadError(f"{block.label}: fetched twice from tier {self.name!r} (its block was already released)")
        if len(out) != block.nbytes:
            raise OffloadError(f"{block.label}: read buffer of {len(out)} B for a {block.nbytes} B block in tier {self.name!r}")
        self._read_into(block, out)

    def free(self, block: Block) -> str | None:
        """Release ``block`` and its capacity; a second call does nothing.

        Never raises for the medium (NOTE [freeing never fails]): if the bytes cannot be removed (a read-only
        remount, EACCES, EBUSY, EIO), the capacity is released anyway and a one-line description of the
        failure is returned for the caller's report; None when the block went cleanly.
        """
        with self._lock:
            if block.freed:
                return None
            block.freed = True
            self._block_count -= 1
            self._used_bytes -= block.reserved_bytes
        try:
            self._discard(block)
        except Exception as exc:  # noqa: BLE001 - NOTE [freeing never fails]
            return f"{block.label}: tier {self.name!r} could not remove its block ({type(exc).__name__}: {exc})"
        return None

    def close(self) -> None:
        """Refuse new blocks; subclasses release what they cache."""
        with self._lock:
            self._closed = True

    @abc.abstractmethod
    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block: ...

    @abc.abstractmethod
    def _read_into(self, block: Block, out: memoryview) -> None: ...

    @abc.abstractmethod
    def _discard(self, block: Block) -> None: ...


class Pool:
    """An ordered chain of tiers; a block goes to the first tier from ``start`` on that has room."""

    def __init__(self, tiers: Sequence[Tier], *, spec: str | None = None) -> None:
        tiers = tuple(tiers)
        if not tiers:
            raise ConfigError("pool: got no tiers; must have at least one")
        names = [t.name for t in tiers]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ConfigError(f"pool: tier {dup!r} appears twice; each tier may appear once")
        self.tiers = tiers
        self.spec = spec if spec is not None else ",".join(names)

    def __repr__(self) -> str:
        return f"Pool({self.spec!r})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    @property
    def used_bytes(self) -> int:
        return sum(t.used_bytes for t in self.tiers)

    @property
    def block_count(self) -> int:
        return sum(t.block_count for t in self.tiers)

    def tier_index(self, name: str) -> int:
        """Index of the tier called ``name`` (exact name, or the first tier of that kind; "pool" is 0)."""
        if name == "pool":
            return 0
        for i, t in enumerate(self.tiers):
            if t.name == name:
                return i
        for i, t in enumerate(self.tiers):
            if t.kind == name:
                return i
        raise ConfigError(f"tier {name!r}: not in pool {self.spec!r}; tiers are {', '.join(self.names)}")

    def reserve(self, nbytes: int, *, start: int = 0, label: str) -> tuple[int, int]:
        """Reserve room for ``nbytes`` in the first tier from ``start`` with room: (tier index, bytes)."""
        for i in range(start, len(self.tiers)):
            got = self.tiers[i].try_reserve(nbytes)
            if got is not None:
                return i, got
        free = ", ".join(f"{t.name} {format_bytes(t.free_bytes)}" for t in self.tiers[start:])
        raise TierFullError(f"pool {self.spec!r} is full: no room for {label} ({format_bytes(nbytes)}); free: {free}")

    def write(self, data: memoryview, *, index: int, reserved_bytes: int, label: str,
              on_warning: Callable[[str], None] | None = None) -> Block:
        """Write into tier ``index`` under its reservation, spilling down the chain when a tier is full or
        refuses the block (NOTE [unwritable tiers]); ``on_warning`` gets one line per refusal."""
        while True:
            tier = self.tiers[index]
            try:
                return tier.write(data, reserved_bytes=reserved_bytes, label=label)
            except TierFullError as exc:
                tier.unreserve(reserved_bytes)
                tier.mark_full()
                last = index + 1 >= len(self.tiers)
                if on_warning is not None and isinstance(exc, TierUnwritableError):
                    then = "no tier left" if last else "spilling to the next tier"
                    on_warning(f"{str(exc).splitlines()[0]}; {then}")
                if last:
                    raise
                index, reserved_bytes = self.reserve(len(data), start=index + 1, label=label)
            except BaseException:
                tier.unreserve(reserved_bytes)
                raise

    def close(self) -> None:
        for t in self.tiers:
            t.close()


# -- spec parsing ----------------------------------------------------------------------------------------
def _split_top(spec: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in spec:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"pool spec {spec!r}: unbalanced ')'; see the pool spec grammar")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ConfigError(f"pool spec {spec!r}: unbalanced '('; see the pool spec grammar")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _split_capacity(item: str, spec: str) -> tuple[str, float | None]:
    close = item.rfind(")")
    at = item.rfind("@")
    if at <= close:
        return item, None
    base, size = item[:at].strip(), item[at + 1 :].strip()
    return base, parse_bytes(size, field=f"pool spec {spec!r} capacity of {base!r}")


def _parse_tier(item: str, spec: str) -> Tier:
    from mcdla.runtime.tiers_compress import CompressTier
    from mcdla.runtime.tiers_device import DeviceTier
    from mcdla.runtime.tiers_file import FileTier
    from mcdla.runtime.tiers_host import HostTier

    base, capacity = _split_capacity(item, spec)
    if base.startswith("compress(") and base.endswith(")"):
        inner = _parse_tier(base[len("compress(") : -1].strip(), spec)
        return CompressTier(inner, capacity_bytes=capacity)
    if base == "host":
        return HostTier(capacity_bytes=capacity)
    if base.startswith("device:"):
        idx = base[len("device:") :]
        if not idx.isdigit():
            raise ConfigError(f"pool spec {spec!r}: tier {base!r}; device index must be an integer like 'device:1'")
        return DeviceTier(int(idx), capacity_bytes=capacity)
    if base.startswith("file:"):
        path = base[len("file:") :]
        if not path or any(c in path for c in ",@()"):
            raise ConfigError(f"pool spec {spec!r}: tier {base!r}; file path must be non-empty without , @ ( )")
        return FileTier(path, capacity_bytes=capacity)
    raise ConfigError(
        f"pool spec {spec!r}: unknown tier {item!r}; must be host, device:N, file:DIR or compress(TIER), "
        "each optionally with @SIZE"
    )


def parse_pool(spec: str) -> Pool:
    """Build a pool from a spec string such as ``"host@8GiB,file:/scratch"`` (grammar in the module doc)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"pool spec: got {spec!r}; must be a non-empty string like 'host,file:/scratch'")
    return Pool([_parse_tier(item, spec) for item in _split_top(spec.strip())], spec=spec.strip())


def as_pool(pool: str | Pool | Tier | Sequence[str | Tier]) -> tuple[Pool, bool]:
    """Turn what the user passed into a pool; the flag says whether the caller built it (and must close it)."""
    if isinstance(pool, Pool):
        return pool, False
    if isinstance(pool, Tier):
        return Pool([pool]), False
    if isinstance(pool, str):
        return parse_pool(pool), True
    if isinstance(pool, Sequence) and pool:
        tiers: list[Tier] = []
        for item in pool:
            if isinstance(item, Tier):
                tiers.append(item)
            elif isinstance(item, str):
                tiers.extend(parse_pool(item).tiers)
            else:
                raise ConfigError(f"pool: got element {item!r}; must be a tier or a spec string")
        return Pool(tiers), all(isinstance(item, str) for item in pool)
    raise ConfigError(f"pool: got {pool!r}; must be a spec string like 'host,file:/scratch', a Pool or tiers")
