"""Moving a record's bytes between the training device and the pool's tiers, asynchronously.

NOTE [streams and threads]
    CPU tensors: a tier with ``io_threads`` > 0 (file, compress) writes and reads on its own thread pool,
    which is what overlaps transfers with compute on a CPU-only machine; the host tier copies in the
    caller's thread. CUDA tensors: device-to-host copies run on one D2H side stream per device after
    waiting for an event recorded on the compute stream, into a pinned buffer from the host pool; a worker
    thread waits for the copy's event and then hands the buffer to the tier (the host tier adopts it as the
    block, others write it out). Host-to-device copies run on one H2D side stream per device; the restored
    tensor is allocated on that stream, so the unpack side makes the compute stream wait for the copy's
    event and calls ``record_stream`` on it (it escapes to the compute stream and, through views, to
    autograd). Sources and pinned buffers stay referenced until the copy that reads them has completed, and
    no longer: an offload job takes its source out of a one-slot list and drops it when it returns, since an
    executor keeps a finished job (and any closure cell or default argument) alive a moment after its
    future completes, which is when the step stops counting the storage as resident.

NOTE [fetch tails]
    A CUDA fetch from the host or a device tier returns a finished future at once: the bytes are usable as
    soon as the compute stream waits for the copy's event, so backward never blocks on the host side. The
    block can only be freed once the copy has completed, which a worker thread waits for: the fetch's
    tail. The tail was an untracked future (issue #9): an error in it was lost, ``synchronize()`` did not
    wait for it, and the step could finish with the block still held. It is now watched by the step like a
    transfer (``_Step._watch``, under the step's lock, which ``_issue_fetch`` holds): the step finishes, and
    ``settle`` returns, only after every tail has run, and a failing tail is the step's failure. A tail
    gives the same result as its fetch, so whichever completion the step applies first restores the
    record. It frees the block even when the wait failed: a CUDA error there leaves nothing to copy, and a
    block kept would hold its tier's capacity for good.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from mcdla.runtime._records import _Record
from mcdla.runtime.pool import Block, Pool, Tier
from mcdla.runtime.report import TransferSpan, _ReportBuilder
from mcdla.runtime.tiers_device import DeviceTier
from mcdla.runtime.tiers_host import HostBufferPool, HostTier

__all__: list[str] = []


def profiled(name: str) -> Any:
    """A ``torch.profiler`` range named ``name`` while the calling thread is profiled, else a free no-op.

    NOTE [profiler ranges]: copies and waits show up in a PyTorch profiler trace as ``mcdla::offload``,
    ``mcdla::fetch`` and ``mcdla::wait ...``. The profiler records only the thread that started it, so the
    ranges cover the host tier's copies, the issue of CUDA copies and the compute side's waits; the work
    of the file and compress tiers' I/O threads is in the runtime's own trace (``trace=``) instead.
    """
    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


def _run_inline(fn: Callable[[], Any]) -> Future:
    fut: Future = Future()
    try:
        fut.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - delivered through the future, like an executor would
        fut.set_exception(exc)
    return fut


class _Mover:
    """Starts offloads and fetches for one step and owns that step's I/O threads and CUDA streams."""

    def __init__(self, pool: Pool, report: _ReportBuilder, host_buffers: HostBufferPool) -> None:
        self.pool = pool
        self.report = report
        self.host_buffers = host_buffers
        self._lock = threading.Lock()
        self._executors: dict[str, ThreadPoolExecutor] = {}  # tier name (or "cuda") -> its threads
        self._streams: dict[tuple[int, str], Any] = {}  # (device index, "d2h"/"h2d") -> stream

    # -- plumbing --------------------------------------------------------------------------------------
    def _executor(self, key: str, threads: int) -> ThreadPoolExecutor:
        with self._lock:
            ex = self._executors.get(key)
            if ex is None:
                ex = self._executors[key] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"mcdla-io {key}")
            return ex

    def _submit(self, tier: Tier, fn: Callable[[], Any], *, cuda: bool) -> Future:
        if tier.io_threads > 0:
            return self._executor(tier.name, tier.io_threads).submit(fn)
        if cuda:  # host/device tiers on CUDA: a thread waits for the copy's event
            return self._executor("cuda", 1).submit(fn)
        return _run_inline(fn)

    def _stream(self, device: torch.device, direction: str) -> Any:
        key = (device.index if device.index is not None else torch.cuda.current_device(), direction)
        with self._lock:
            s = self._streams.get(key)
            if s is None:
                s = self._streams[key] = torch.cuda.Stream(device=key[0])
            return s

    def shutdown(self, *, wait: bool) -> None:
        with self._lock:
            executors = list(self._executors.values())
            self._executors.clear()
        for ex in executors:
            ex.shutdown(wait=wait)

    def _span(self, kind: str, rec: _Record, tier: str, t0: float, *, stored: int = 0) -> None:
        self.report.transfer(
            TransferSpan(kind=kind, tier=tier, tensor=rec.label, layer=rec.layer, nbytes=rec.nbytes,  # type: ignore[arg-type]
                         start_s=t0, end_s=self.report.now_s(), thread=threading.current_thread().name),
            stored_bytes=stored,
        )

    # -- offload ---------------------------------------------------------------------------------------
    def offload(self, rec: _Record, src: torch.Tensor, *, index: int, reserved_bytes: int) -> Future:
        """Start copying ``src`` (the record's storage bytes) into tier ``index``; the future gives the block."""
        tier = self.pool.tiers[index]
        if src.device.type == "cuda":
            return self._offload_cuda(rec, src, tier, index, reserved_bytes)

        held = [src]  # NOTE [streams and threads]: the job drops the source when it returns

        def job() -> Block:
            data = held.pop()
            t0 = self.report.now_s()
            with profiled("mcdla::offload"):
                block = self.pool.write(memoryview(data.numpy()), index=index, reserved_bytes=reserved_bytes,
                                        label=rec.label, on_warning=self.report.warn)
            self._span("offload", rec, block.tier.name, t0, stored=block.tier.stored_bytes_of(block))
            return block

        return self._submit(tier, job, cuda=False)

    def _offload_cuda(self, rec: _Record, src: torch.Tensor, tier: Tier, index: int, reserved: int) -> Future:
        with profiled("mcdla::offload"):
            return self._issue_offload_cuda(rec, src, tier, index, reserved)

    def _issue_offload_cuda(self, rec: _Record, src: torch.Tensor, tier: Tier, index: int, reserved: int) -> Future:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(src.device))
        t0 = self.report.now_s()
        if isinstance(tier, DeviceTier):
            block, done = tier.store_tensor(src, ready=ready, reserved_bytes=reserved, label=rec.label)

            held = [src]

            def wait_peer() -> Block:
                keep = held.pop()  # noqa: F841 - referenced until the peer copy has completed
                done.synchronize()
                self._span("offload", rec, tier.name, t0, stored=block.nbytes)
                return block

            return self._submit(tier, wait_peer, cuda=True)
        n = src.numel()
        staging = self.host_buffers.acquire(n)
        d2h = self._stream(src.device, "d2h")
        with torch.cuda.stream(d2h):
            d2h.wait_event(ready)
            staging[:n].copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(d2h)

        held = [src]

        def store() -> Block:
            keep = held.pop()  # noqa: F841 - referenced until the D2H copy has completed
            done.synchronize()
            if isinstance(tier, HostTier) and tier.buffers is self.host_buffers:
                block = tier.adopt(staging, nbytes=n, reserved_bytes=reserved, label=rec.label)
            else:
                try:
                    view = memoryview(staging[:n].numpy())
                    block = self.pool.write(view, index=index, reserved_bytes=reserved, label=rec.label,
                                            on_warning=self.report.warn)
                finally:
                    self.host_buffers.release(staging)
            self._span("offload", rec, block.tier.name, t0, stored=block.tier.stored_bytes_of(block))
            return block

        return self._submit(tier, store, cuda=True)

    # -- fetch -----------------------------------------------------------------------------------------
    def fetch(self, rec: _Record, block: Block) -> Future:
        """Start bringing ``block`` back to the record's device; the future gives (bytes, CUDA event or None).

        The block is freed once read (a tier gives a block back once), also when the read fails.
        """
        tier = block.tier
        if rec.device.type == "cuda":
            return self._fetch_cuda(rec, block, tier)

        def job() -> tuple[torch.Tensor, None]:
            t0 = self.report.now_s()
            try:
                with profiled("mcdla::fetch"):
                    dst = torch.empty(block.nbytes, dtype=torch.uint8)
                    tier.read_into(block, memoryview(dst.numpy()))
            finally:
                self.report.warn(tier.free(block))  # NOTE [freeing never fails] in ``pool``
            self._span("fetch", rec, tier.name, t0)
            return dst, None

        return self._submit(tier, job, cuda=False)

    def _fetch_cuda(self, rec: _Record, block: Block, tier: Tier) -> Future:
        with profiled("mcdla::fetch"):
            return self._issue_fetch_cuda(rec, block, tier)

    def _issue_fetch_cuda(self, rec: _Record, block: Block, tier: Tier) -> Future:
        device = rec.device
        h2d = self._stream(device, "h2d")
        t0 = self.report.now_s()
        if isinstance(tier, (DeviceTier, HostTier)):
            if isinstance(tier, DeviceTier):
                dst, done = tier.load_tensor(block, device=device, stream=h2d)
            else:
                src = tier.host_tensor(block)
                with torch.cuda.stream(h2d):
                    dst = torch.empty(block.nbytes, dtype=torch.uint8, device=device)
                    dst.copy_(src, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(h2d)

            return self._release_after_copy(rec, block, tier, dst, done, t0, event=done)

        def job() -> tuple[torch.Tensor, Any]:
            staging = self.host_buffers.acquire(block.nbytes)
            try:
                tier.read_into(block, memoryview(staging[: block.nbytes].numpy()))
            except BaseException:
                self.host_buffers.release(staging)
                raise
            finally:
                self.report.warn(tier.free(block))  # NOTE [freeing never fails] in ``pool``
            with torch.cuda.device(device), torch.cuda.stream(h2d):
                dst = torch.empty(block.nbytes, dtype=torch.uint8, device=device)
                dst.copy_(staging[: block.nbytes], non_blocking=True)
                done = torch.cuda.Event()
                done.record(h2d)
            self.host_buffers.release_after(staging, done)
            self._span("fetch", rec, tier.name, t0)
            return dst, done

        return self._submit(tier, job, cuda=True)

    def _release_after_copy(self, rec: _Record, block: Block, tier: Tier, dst: torch.Tensor, done: Any, t0: float,
                            *, event: Any) -> Future:
        """A finished fetch future giving ``(dst, event)``, and a watched tail that frees ``block`` once
        ``done`` (the copy's event) has completed (NOTE [fetch tails]). Called under the step's lock."""

        def release_after_copy() -> tuple[torch.Tensor, Any]:
            try:
                done.synchronize()
            finally:
                self.report.warn(tier.free(block))  # NOTE [freeing never fails] in ``pool``
            self._span("fetch", rec, tier.name, t0)
            return dst, event

        tail = self._submit(tier, release_after_copy, cuda=True)
        rec.step._watch(tail, rec, "fetch")
        fut: Future = Future()
        fut.set_result((dst, event))
        return fut
