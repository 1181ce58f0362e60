"""Activation offload: mcdla against ``save_on_cpu``, torchtune's OffloadActivations and torchao's CPU-offload
optimizer on the same model, same run.

The model is the transformer of ``bench_runtime_host_overhead`` (``--dim``, ``--layers``, ``--seq``,
``--batch``). Modes are interleaved step by step; each figure is the fastest of ``--repeats`` steps, as a ratio
to the plain step measured in the same rounds, with the bytes each mode moved out of the step's memory.

torchtune and torchao are not dependencies of mcdla: pass ``--extra-path DIR`` where they were installed with
``pip install --no-deps --target DIR torchtune torchao``. torchtune 0.6.1's package does not import beside
torchao 0.18 (``torchao.dtypes.nf4tensor`` is gone), so its ``training/_activation_offloading.py`` is loaded
from that directory on its own, with its three imports of NF4Tensor, TiedLinear and get_logger stubbed (the
class itself is unchanged). Both need CUDA (OffloadActivations takes ``torch.cuda.default_stream()`` when
built; CPUOffloadOptimizer asserts CUDA or XPU); without it their rows say so.

Memory: each step's peak resident set over the resident set before it (``VmHWM`` after ``clear_refs`` 5, with
glibc's mmap threshold pinned at 64 KiB so that freed activations go back to the system at once, and the
garbage collector run before the step and paused in it, so that no earlier garbage is freed under the step's
peak), the median over the measured steps, and the memory saved against the plain step's. The host tier's pool
keeps its free buffers between steps (resident before the step starts), so they count as that step's memory. On a
CPU-only machine a copy into host memory (save_on_cpu, the host tier, torchtune) frees nothing by construction, so
only the file tier saves memory there (``bench_runtime_rss`` measures it on a step of more than 2 GB).

    .venv/bin/python -m benchmarks.bench_runtime_offload_compare [--extra-path /tmp/tt] [--repeats 8] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import logging
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_runtime_host_overhead import make_model
from mcdla.runtime import virtualize
from mcdla.runtime.tiers_host import HostTier


def load_torchtune_offload(extra: Path) -> Any:
    """torchtune's OffloadActivations class, loaded from its file with three imports stubbed (module doc)."""
    path = extra / "torchtune" / "training" / "_activation_offloading.py"
    src = path.read_text()
    for line, stub in (("from torchao.dtypes.nf4tensor import NF4Tensor", "class NF4Tensor: pass"),
                       ("from torchtune.modules import TiedLinear", "class TiedLinear: pass"),
                       ("from torchtune.utils import get_logger", "get_logger = logging.getLogger")):
        if line not in src:
            raise RuntimeError(f"{path}: expected import {line!r} not found; another torchtune version?")
        src = src.replace(line, stub)
    module = types.ModuleType("torchtune_activation_offloading")
    module.__dict__["logging"] = logging
    exec(compile(src, str(path), "exec"), module.__dict__)  # noqa: S102 - the benchmark's own copy of a public file
    return module.OffloadActivations


_M_MMAP_THRESHOLD = -3  # glibc malloc.h: setting it also turns off the dynamic threshold


def pin_mmap_threshold(nbytes: int = 64 * 1024) -> bool:
    """Serve every allocation of ``nbytes`` or more by its own mmap, so a freed activation leaves the resident
    set at once (glibc otherwise raises the threshold after the first free and keeps such blocks in its heap).
    False where the C library has no ``mallopt`` (not glibc): the RSS columns then include the heap's slack."""
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, nbytes))
    except (AttributeError, OSError):
        return False


def _rss_bytes(key: str) -> int:
    """A ``/proc/self/status`` figure (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> int:
    """Reset the kernel's high-water mark to the current resident set (``clear_refs`` 5) and return it; where the
    kernel refuses the reset the figure stays, and ``peak_is_tracked`` says the memory columns are void."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _rss_bytes("VmRSS")


def peak_is_tracked(probe_bytes: int = 16 * 2**20) -> bool:
    """Whether this kernel keeps a resettable peak resident set: after ``clear_refs`` 5, touching and freeing
    ``probe_bytes`` must leave ``VmHWM`` at least three quarters of them above the resident set before. Some
    sandboxed kernels refuse the reset or report ``VmHWM`` as the current resident set; the memory columns are
    then not measurable in-process."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    before = _rss_bytes("VmRSS")
    buffer = torch.ones(probe_bytes // 4)
    del buffer
    return _rss_bytes("VmHWM") - before >= 0.75 * probe_bytes


def _pooled_bytes(pool: Any) -> int:
    """Bytes of free buffers the host tiers of ``pool`` keep resident between steps."""
    return sum(t.buffers.cached_bytes for t in pool.tiers if isinstance(t, HostTier))


def run(args: argparse.Namespace, directory: str
        ) -> tuple[dict[str, float], dict[str, int], dict[str, str], dict[str, float]]:
    model = make_model(args.dim, args.layers, 4)
    x = torch.randn(args.batch, args.seq, args.dim)
    host = virtualize("host", min_bytes=args.min_bytes, model=model)
    disk = virtualize(f"file:{directory}", min_bytes=args.min_bytes, model=model)
    modes: dict[str, Callable[[], Any]] = {
        "plain": contextlib.nullcontext,
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()),
        "mcdla host tier": lambda: host,
        "mcdla file tier": lambda: disk,
    }
    skipped: dict[str, str] = {}
    if args.extra_path:
        sys.path.insert(0, args.extra_path)
        try:
            offload = load_torchtune_offload(Path(args.extra_path))
            offload(use_pin_memory=False, use_streams=False)  # raises without CUDA
            modes["torchtune OffloadActivations"] = lambda: offload(use_pin_memory=torch.cuda.is_available(),
                                                                     use_streams=torch.cuda.is_available())
        except Exception as exc:  # noqa: BLE001 - reported as the row's reason
            skipped["torchtune OffloadActivations"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        try:
            from torchao.optim import CPUOffloadOptimizer

            CPUOffloadOptimizer(torch.nn.Linear(2, 2).parameters(), torch.optim.AdamW)
            skipped["torchao CPUOffloadOptimizer"] = "runs only with CUDA: left to the GPU check"
        except Exception as exc:  # noqa: BLE001 - reported as the row's reason
            skipped["torchao CPUOffloadOptimizer"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    else:
        skipped["torchtune OffloadActivations"] = skipped["torchao CPUOffloadOptimizer"] = "no --extra-path given"
    times: dict[str, list[float]] = {m: [] for m in modes}
    growth: dict[str, list[int]] = {m: [] for m in modes}
    losses: dict[str, float] = {}
    moved: dict[str, int] = {}
    for i in range(args.repeats + 2):
        for name, ctx in modes.items():
            model.zero_grad()
            # garbage the collector would free mid-step lowers the resident set under the step's own peak
            gc.collect()
            gc.disable()
            try:
                before = _reset_peak() - (_pooled_bytes(host.pool) if name == "mcdla host tier" else 0)
                t0 = time.perf_counter()
                with ctx():
                    loss = model(x * 1.0).square().mean()
                    loss.backward()
                if name.startswith("mcdla"):
                    (host if "host" in name else disk).synchronize()
            finally:
                gc.enable()
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
                growth[name].append(_rss_bytes("VmHWM") - before)
            losses[name] = loss.item()
    assert len(set(losses.values())) == 1, losses
    moved["mcdla host tier"], moved["mcdla file tier"] = host.report.offloaded_bytes, disk.report.offloaded_bytes
    host.close(), disk.close()
    return ({m: min(t) for m, t in times.items()}, moved, skipped,
            {m: statistics.median(g) for m, g in growth.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extra-path", default=None, help="a pip --target directory holding torchtune and torchao")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where the file tier's blocks go (default: a temporary directory)")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pinned = pin_mmap_threshold()
    tracked = peak_is_tracked()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        best, moved, skipped, growth = run(args, d)
    plain, plain_growth = best["plain"], growth["plain"]
    lines = [f"Transformer {args.layers} x dim {args.dim}, batch {args.batch} x seq {args.seq}, torch threads "
             f"{args.threads}, {'CUDA' if torch.cuda.is_available() else 'CPU only'}; fastest of {args.repeats}; "
             f"peak RSS growth = median over the steps of the step's peak resident set over the one before it "
             f"(mmap threshold {'pinned at 64 KiB' if pinned else 'not pinned: no glibc mallopt'})"
             + ("." if tracked else "; this kernel keeps no resettable peak RSS, so the memory columns are "
                                   "not measurable here."), "",
             "| mode | step ms | step time / plain | bytes moved out per step | peak RSS growth | memory saved vs plain |",
             "|---|---|---|---|---|---|"]
    for name, s in best.items():
        lines.append(f"| {name} | {1e3 * s:.2f} | {s / plain:.3f} | "
                     f"{f'{moved[name] / 2**20:.1f} MiB' if name in moved else '-'} | "
                     + (f"{growth[name] / 2**20:.1f} MiB | {round(1 - growth[name] / plain_growth, 2) + 0.0:.0%} |"
                        if tracked else "- | - |"))
    for name, why in skipped.items():
        lines.append(f"| {name} | not run: {why} | | | | |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-offload-compare", "Runtime: mcdla vs save_on_cpu, torchtune and torchao (same model)",
               ".venv/bin/python -m benchmarks.bench_runtime_offload_compare --extra-path /tmp/tt --write", text)


if __name__ == "__main__":
    main()
