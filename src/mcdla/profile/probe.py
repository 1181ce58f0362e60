"""Measure this machine's tiers and compute into the hardware model the simulator and planners accept.

``probe_pool(spec)`` times the runtime's own tier code (:mod:`mcdla.runtime.pool`) writing and reading
blocks of a few sizes and fits ``time = latency + bytes / bandwidth`` separately for offload (write) and
prefetch (read): a :class:`~mcdla.hardware.PoolLink`. ``probe_tiers(directory)`` does it for the host copy,
the file tier and the compressing file tier. ``probe_machine`` adds the compute side (matmul FLOP/s and
memory copy bandwidth of the device the model runs on) and ``probe_system`` packs it all into a
:class:`~mcdla.hardware.System` whose one device reaches its pool through a link with the measured
bandwidth; ``mcdla probe --out machine.yaml`` writes that file.

NOTE [probe data]
Blocks are ReLU'd normal float32 values (half zeros): what a typical saved activation looks
like, which matters only for the compressing tier (its throughput and ratio depend on the data). Sizes span
the runtime's smallest managed storages to large activations. Each size is written and read ``repeats`` times
after one untimed warm-up round; the median time per size is fitted by least squares. Probing runs in the
calling thread, one transfer at a time, as one runtime I/O stream does.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psutil
import torch

from mcdla.errors import ConfigError, ProfileError
from mcdla.hardware import LinkKind, MemoryKind, PoolLink, System
from mcdla.hardware.cluster import cluster_from_dict
from mcdla.profile.progress import OnProgress, notify
from mcdla.runtime.pool import Pool, Tier, as_pool

__all__ = [
    "DEFAULT_SIZES_BYTES",
    "TierProbe",
    "MachineProbe",
    "probe_pool",
    "probe_tiers",
    "probe_compute",
    "probe_machine",
    "probe_system",
]

DEFAULT_SIZES_BYTES: tuple[int, ...] = (64 << 10, 1 << 20, 16 << 20)


@dataclass(frozen=True, slots=True, kw_only=True)
class TierProbe:
    """Measured transfers of one tier.

    Attributes:
        tier: the tier's name (its pool spec without capacity).
        link: the fitted link (offload = write, prefetch = read; bytes/s, latency in s).
        samples: (bytes, median write s, median read s) per probed size.
        compression_ratio: stored / written bytes (1.0 for tiers that store bytes as they are).
    """

    tier: str
    link: PoolLink
    samples: tuple[tuple[int, float, float], ...]
    compression_ratio: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineProbe:
    """This machine measured: compute, memory and tiers.

    Attributes:
        host: host name; device: ``"cpu"`` or ``"cuda:0"``.
        flops_per_s: achieved matmul rate per precision (FLOP/s).
        memory_bytes: device memory capacity (physical RAM on a CPU), bytes.
        memory_bytes_per_s: device memory copy bandwidth (bytes read + written per second).
        tiers: tier kind -> probe.
        measured_at: ISO time (UTC).
    """

    host: str
    device: str
    flops_per_s: dict[str, float]
    memory_bytes: float
    memory_bytes_per_s: float
    tiers: dict[str, TierProbe] = field(default_factory=dict)
    measured_at: str = ""

    @property
    def source(self) -> str:
        return f"measured on {self.host} ({self.device}) at {self.measured_at} by mcdla.profile.probe"


def _fit(sizes: Sequence[int], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``time = latency + bytes / bandwidth``; (bandwidth bytes/s, latency s)."""
    n = len(sizes)
    if n >= 2:
        mx, my = sum(sizes) / n, sum(times) / n
        sxx = sum((x - mx) ** 2 for x in sizes)
        sxy = sum((x - mx) * (y - my) for x, y in zip(sizes, times))
        if sxx > 0 and sxy > 0:
            slope = sxy / sxx
            latency = my - slope * mx
            if latency >= 0:
                return 1.0 / slope, latency
    total_t = sum(times)
    return (sum(sizes) / total_t if total_t > 0 else math.inf), 0.0


def _probe_data(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(max(1, nbytes // 4), generator=g).relu_()
    return values.view(torch.uint8)[:nbytes].contiguous()


def _time_tier(pool: Pool, index: int, nbytes: int, repeats: int) -> tuple[float, float, float]:
    """Median write and read seconds of ``nbytes`` through tier ``index``, and the stored/written ratio."""
    tier: Tier = pool.tiers[index]
    data = _probe_data(nbytes, seed=nbytes)
    src = memoryview(data.numpy())
    out = torch.empty_like(data)
    dst = memoryview(out.numpy())
    writes, reads, ratios = [], [], []
    for rep in range(repeats + 1):
        got = tier.try_reserve(nbytes)
        if got is None:
            raise ProfileError(f"probe: tier {tier.name!r} has no room for a {nbytes} B probe block")
        stored_before = _stored(tier)
        t0 = time.perf_counter()
        try:
            block = tier.write(src, reserved_bytes=got, label=f"probe block of {nbytes} B")
        except BaseException:
            tier.unreserve(got)
            raise
        t1 = time.perf_counter()
        tier.read_into(block, dst)
        t2 = time.perf_counter()
        stored = _stored(tier) - stored_before
        tier.free(block)
        if rep == 0:
            if not torch.equal(out, data):
                raise ProfileError(f"probe: tier {tier.name!r} returned different bytes than were written")
            continue
        writes.append(t1 - t0)
        reads.append(t2 - t1)
        ratios.append(stored / nbytes if stored > 0 else 1.0)
    return statistics.median(writes), statistics.median(reads), statistics.median(ratios)


def _time_tier_cuda(pool: Pool, index: int, nbytes: int, repeats: int, dev: torch.device) -> tuple[float, float, float]:
    """As :func:`_time_tier` for a CUDA model: device-to-host copy into pinned memory on a side stream, then
    the tier's write (none for the host tier, which adopts the pinned buffer), and the reverse for reads."""
    tier: Tier = pool.tiers[index]
    host_tier = tier.kind == "host"
    src = _probe_data(nbytes, seed=nbytes).to(dev)
    staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    back = torch.empty_like(src)
    stream = torch.cuda.Stream(dev)
    view = memoryview(staging.numpy())
    writes, reads = [], []
    for rep in range(repeats + 1):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            staging.copy_(src, non_blocking=True)
        stream.synchronize()
        block = None
        if not host_tier:
            got = tier.try_reserve(nbytes)
            if got is None:
                raise ProfileError(f"probe: tier {tier.name!r} has no room for a {nbytes} B probe block")
            block = tier.write(view, reserved_bytes=got, label=f"probe block of {nbytes} B")
        t1 = time.perf_counter()
        if block is not None:
            tier.read_into(block, view)
            tier.free(block)
        with torch.cuda.stream(stream):
            back.copy_(staging, non_blocking=True)
        stream.synchronize()
        t2 = time.perf_counter()
        if rep == 0:
            if not torch.equal(back, src):
                raise ProfileError(f"probe: tier {tier.name!r} returned different bytes than were written")
            continue
        writes.append(t1 - t0)
        reads.append(t2 - t1)
    return statistics.median(writes), statistics.median(reads), 1.0


def _stored(tier: Tier) -> int:
    inner = getattr(tier, "inner", None)
    return inner.used_bytes if inner is not None else 0


def probe_pool(
    pool: str | Pool | Tier,
    *,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 3,
    tier: int = 0,
    device: str | torch.device = "cpu",
) -> TierProbe:
    """Measure the write (offload) and read (prefetch) throughput of one tier of ``pool``.

    For a CUDA ``device`` an offload is the device-to-host copy plus the tier's write, a prefetch the tier's
    read plus the host-to-device copy, as the runtime moves tensors of a CUDA model.

    Args:
        pool: a pool spec (``"file:/scratch"``), a Pool or a Tier; a spec's pool is closed afterwards.
        sizes_bytes: block sizes to time (bytes); at least two distinct sizes give a latency.
        repeats: timed repetitions per size (the median is kept).
        tier: index of the tier in the pool.
        device: where the tensors live (``"cpu"`` or ``"cuda:0"``).
    """
    sizes = sorted({int(s) for s in sizes_bytes})
    if not sizes or sizes[0] <= 0:
        raise ConfigError(f"probe sizes: got {list(sizes_bytes)!r}; must be one or more sizes > 0 bytes")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"probe repeats: got {repeats!r}; must be an integer >= 1")
    the_pool, owned = as_pool(pool)
    try:
        if not 0 <= tier < len(the_pool.tiers):
            raise ConfigError(f"probe tier: got {tier}; pool {the_pool.spec!r} has {len(the_pool.tiers)} tier(s)")
        dev = torch.device(device)
        samples = []
        for n in sizes:
            if dev.type == "cuda":
                w, r, ratio = _time_tier_cuda(the_pool, tier, n, repeats, dev)
            else:
                w, r, ratio = _time_tier(the_pool, tier, n, repeats)
            samples.append((n, w, r, ratio))
        name = the_pool.tiers[tier].name
    finally:
        if owned:
            the_pool.close()
    write_bw, write_lat = _fit([s[0] for s in samples], [s[1] for s in samples])
    read_bw, read_lat = _fit([s[0] for s in samples], [s[2] for s in samples])
    link = PoolLink(
        offload_bytes_per_s=write_bw,
        prefetch_bytes_per_s=read_bw,
        latency_s=(write_lat + read_lat) / 2,
        shared_direction=False,
        source=f"tier {name!r} from {device} measured on {socket.gethostname()} at {_now()} by mcdla.profile.probe",
    )
    return TierProbe(
        tier=name,
        link=link,
        samples=tuple((n, w, r) for n, w, r, _ in samples),
        compression_ratio=statistics.median(s[3] for s in samples),
    )


def probe_tiers(
    directory: str | os.PathLike[str] | None = None,
    *,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 3,
    kinds: Sequence[str] = ("host", "file", "compress"),
    device: str | torch.device = "cpu",
) -> dict[str, PoolLink]:
    """Measured links of this machine's tiers: ``{"host": ..., "file": ..., "compress": ...}``.

    ``directory`` is where the file tiers write (a temporary directory when None); ``compress`` is the
    zstd tier in front of the file tier there; ``device`` is where the tensors live (see :func:`probe_pool`).
    """
    return {k: p.link for k, p in _probe_kinds(directory, sizes_bytes, repeats, kinds, device).items()}


def _probe_kinds(
    directory: str | os.PathLike[str] | None,
    sizes_bytes: Sequence[int],
    repeats: int,
    kinds: Sequence[str],
    device: str | torch.device = "cpu",
    on_progress: OnProgress | None = None,
) -> dict[str, TierProbe]:
    allowed = ("host", "file", "compress")
    for k in kinds:
        if k not in allowed:
            raise ConfigError(f"probe tiers: got {k!r}; must be among {', '.join(allowed)}")
    with tempfile.TemporaryDirectory(prefix="mcdla-probe-") as tmp:
        where = Path(directory) if directory is not None else Path(tmp)
        specs = {"host": "host", "file": f"file:{where}", "compress": f"compress(file:{where})"}
        probes = {}
        for i, k in enumerate(kinds):
            notify(on_progress, 1 + i, 1 + len(kinds), f"probing: {k} tier")
            probes[k] = probe_pool(specs[k], sizes_bytes=sizes_bytes, repeats=repeats, device=device)
        notify(on_progress, 1 + len(kinds), 1 + len(kinds), "probing: done")
        return probes


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


_DTYPES = MappingProxyType({"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16})


def probe_compute(
    device: str | torch.device = "cpu", *, precisions: Sequence[str] = ("fp32",), n: int = 1024, repeats: int = 5
) -> tuple[dict[str, float], float]:
    """Achieved matmul FLOP/s per precision (``n x n`` by ``n x n``) and memory copy bytes/s on ``device``."""
    dev = torch.device(device)
    rates: dict[str, float] = {}
    for prec in precisions:
        if prec not in _DTYPES:
            raise ConfigError(f"probe precision: got {prec!r}; must be one of {', '.join(_DTYPES)}")
        a = torch.randn(n, n, device=dev).to(_DTYPES[prec])
        b = torch.randn(n, n, device=dev).to(_DTYPES[prec])
        rates[prec] = 2.0 * n**3 / _median_time(lambda: torch.mm(a, b), dev, repeats)
    nbytes = 64 << 20 if dev.type == "cpu" else 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    copy_s = _median_time(lambda: dst.copy_(src), dev, repeats)
    return rates, 2.0 * nbytes / copy_s


def _median_time(fn: Any, dev: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_machine(
    directory: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 3,
    kinds: Sequence[str] = ("host", "file", "compress"),
    precisions: Sequence[str] = ("fp32",),
    on_progress: OnProgress | None = None,
) -> MachineProbe:
    """Measure compute, memory and the tiers of this machine (see the module doc); ``on_progress`` hears of
    each finished part (compute, then each tier)."""
    notify(on_progress, 0, 1 + len(kinds), "probing: compute and memory")
    flops, mem_bw = probe_compute(device, precisions=precisions)
    dev = torch.device(device)
    capacity = (
        float(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda"
        else float(psutil.virtual_memory().total)
    )
    return MachineProbe(
        host=socket.gethostname(),
        device=str(dev),
        flops_per_s=flops,
        memory_bytes=capacity,
        memory_bytes_per_s=mem_bw,
        tiers=_probe_kinds(directory, sizes_bytes, repeats, kinds, device, on_progress),
        measured_at=_now(),
    )


def probe_system(machine: MachineProbe, *, pool_tier: str = "file", name: str | None = None) -> System:
    """A one-device system for ``machine``: the device reaches each probed tier over its own link.

    The pool (what offloads go to) is ``pool_tier``. A system link has one bandwidth for both directions, so
    each tier's link gets the slower of its measured write and read bandwidths; the per-direction figures
    are in :func:`probe_tiers` and in the link's source text.
    """
    if pool_tier not in machine.tiers:
        raise ConfigError(f"pool tier: got {pool_tier!r}; probed tiers are {', '.join(machine.tiers) or 'none'}")
    src = machine.source
    device = {
        "name": "dev0", "peak_flops_per_s": dict(machine.flops_per_s), "hbm": machine.memory_bytes,
        "hbm_bandwidth": machine.memory_bytes_per_s, "compute_efficiency": 1.0, "memory_efficiency": 1.0,
        "source": f"{src}: achieved {machine.device} matmul rate and copy bandwidth (so efficiencies are 1)",
    }
    memories, links = [], []
    for kind, probe in machine.tiers.items():
        mem = f"pool-{kind}"
        link = probe.link
        memories.append({"name": mem, "kind": MemoryKind.HOST.value, "capacity": "inf", "dram_bandwidth": "inf",
                         "source": f"{src}: tier {probe.tier!r}; its bandwidth limit is the link's"})
        links.append({
            "a": "dev0", "b": mem, "bandwidth": min(link.offload_bytes_per_s, link.prefetch_bytes_per_s),
            "latency": link.latency_s, "kind": LinkKind.OTHER.value,
            "source": (
                f"{src}: tier {probe.tier!r} write {link.offload_bytes_per_s:.4g} B/s, read "
                f"{link.prefetch_bytes_per_s:.4g} B/s, latency {link.latency_s:.3g} s; the slower direction"
            ),
        })
    # the measured machine as an explicit graph document, loaded as every system is: a one-node Cluster, expanded
    document = {
        "format": "mcdla-system/1", "name": name or f"{machine.host}-{machine.device.replace(':', '')}",
        "description": f"This machine, {src}.", "devices": [device], "memories": memories, "links": links,
        "pools": {"dev0": [f"pool-{pool_tier}"]},
    }
    return cluster_from_dict(document, where=f"probe of {machine.host}").expand()
