"""Peak resident memory (RSS) of one training step with and without mcdla's file tier, on CPU.

The step runs in a child process; this process reads the child's RSS from ``/proc/<pid>/status``: it resets
the kernel's high-water mark (``clear_refs`` 5) when the child is ready, and reads ``VmHWM`` when the step
is done (a 5 ms psutil sampler runs alongside as a cross-check). The model is a stack of
Linear -> LayerNorm -> Tanh blocks whose saved activations (two per block) exceed ``--target-gib``; the two
runs must give the same loss and gradient checksum.

    .venv/bin/python -m benchmarks.bench_runtime_rss [--target-gib 2.2] [--dir DIR] [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

WIDTH = 256


def _blocks_for(target_bytes: float, rows: int) -> int:
    per_block = 2 * rows * WIDTH * 4  # LayerNorm input and Tanh output (the Linear's input is the Tanh output)
    return max(1, math.ceil(target_bytes / per_block))


def child(mode: str, blocks: int, rows: int, directory: str, threads: int) -> None:
    """Build the model, say READY, wait for GO, run one step, print the result, wait for EXIT."""
    import torch

    import mcdla

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(rows, WIDTH)
    print("READY", flush=True)
    assert sys.stdin.readline().strip() == "GO"
    t0 = time.perf_counter()
    if mode == "none":
        loss = model(x * 1.0).square().mean()
        loss.backward()
        report = None
    else:
        with mcdla.virtualize(f"file:{directory}", model=model, min_bytes=1 << 20, window=2) as vm:
            loss = model(x * 1.0).square().mean()
            loss.backward()
        report = vm.report
    step_s = time.perf_counter() - t0
    checksum = sum(float(p.grad.double().sum()) for p in model.parameters())
    saved = sum(rows * WIDTH * 4 for _ in range(2 * blocks))
    print(json.dumps({
        "loss": loss.item(), "checksum": checksum, "step_s": step_s, "saved_bytes": saved,
        "offloaded_bytes": report.offloaded_bytes if report else 0,
        "peak_resident_saved_bytes": report.peak_resident_saved_bytes if report else saved,
        "unpack_wait_s": report.unpack_wait_s if report else 0.0,
    }), flush=True)
    sys.stdin.readline()


@dataclass
class Measured:
    before_bytes: int  # RSS when the step starts
    peak_bytes: int  # kernel high-water mark during the step
    sampled_peak_bytes: int  # psutil sampler's maximum
    result: dict


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def measure(mode: str, *, blocks: int, rows: int, directory: str, threads: int) -> Measured:
    """Run one step in a child process and measure its RSS from here."""
    cmd = [sys.executable, "-m", "benchmarks.bench_runtime_rss", "--child", mode, "--blocks", str(blocks),
           "--rows", str(rows), "--dir", directory, "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "READY"
        before = _status_kib(proc.pid, "VmRSS") * 1024
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        sampled = [before]
        done = threading.Event()

        def sample() -> None:
            ps = psutil.Process(proc.pid)
            while not done.is_set():
                sampled.append(ps.memory_info().rss)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        peak = _status_kib(proc.pid, "VmHWM") * 1024
        done.set()
        sampler.join()
        proc.stdin.write("EXIT\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Measured(before, peak, max(sampled), result)


def compare(target_bytes: float, *, rows: int, directory: str, threads: int) -> dict:
    blocks = _blocks_for(target_bytes, rows)
    none = measure("none", blocks=blocks, rows=rows, directory=directory, threads=threads)
    file = measure("file", blocks=blocks, rows=rows, directory=directory, threads=threads)
    return {
        "blocks": blocks, "none": none, "file": file,
        "same_loss": none.result["loss"] == file.result["loss"],
        "same_grads": none.result["checksum"] == file.result["checksum"],
        "peak_reduction": 1 - file.peak_bytes / none.peak_bytes,
        "growth_reduction": 1 - (file.peak_bytes - file.before_bytes) / (none.peak_bytes - none.before_bytes),
        "leftover_files": os.listdir(directory),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-gib", type=float, default=2.2, help="saved activation bytes to exceed (GiB)")
    ap.add_argument("--rows", type=int, default=131072, help="batch rows (each activation is rows*256*4 bytes)")
    ap.add_argument("--dir", default=None, help="directory for the file tier (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the child")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    ap.add_argument("--child", choices=["none", "file"], help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.blocks, args.rows, args.dir, args.threads)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        r = compare(args.target_gib * 2**30, rows=args.rows, directory=tmp, threads=args.threads)
    gib = 2**30
    saved = r["none"].result["saved_bytes"]
    lines = [
        f"One step, {r['blocks']} blocks of Linear 256 -> LayerNorm -> Tanh, {args.rows} rows, saved activations "
        f"{saved / gib:.2f} GiB, torch threads {args.threads}; RSS read by the parent from /proc (VmHWM after "
        "clear_refs) and by a 5 ms psutil sampler. Target: peak at least 50% lower, identical loss.",
        "",
        "| run | RSS before step | peak RSS (VmHWM) | sampled peak | step s | loss |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("none", "file"):
        m: Measured = r[name]
        lines.append(f"| {'no offload' if name == 'none' else 'mcdla file tier'} | {m.before_bytes / gib:.2f} GiB | "
                     f"{m.peak_bytes / gib:.2f} GiB | {m.sampled_peak_bytes / gib:.2f} GiB | {m.result['step_s']:.1f} | "
                     f"{m.result['loss']:.6f} |")
    lines += ["", f"**peak RSS {100 * r['peak_reduction']:.0f}% lower** (growth over the pre-step RSS "
              f"{100 * r['growth_reduction']:.0f}% lower); identical loss: {r['same_loss']}, identical gradient "
              f"checksum: {r['same_grads']}; block files left: {len(r['leftover_files'])}"]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-rss", "Runtime: peak RSS of a step with > 2 GB of activations, file tier vs none (CPU)",
               ".venv/bin/python -m benchmarks.bench_runtime_rss --write", text)


if __name__ == "__main__":
    main()
