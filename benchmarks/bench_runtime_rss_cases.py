"""RSS of one step with and without mcdla for a plain MLP, the same MLP under torch.compile, and CPU nn.LSTM.

Each run is a fresh child process (one torch thread) that reads its own RSS: growth from before forward to
the end of forward, the forward's peak and backward's peak (``VmHWM`` after ``clear_refs`` 5 at the start
of each phase), all relative to the RSS before forward. Next to them: what the report says (bytes the
runtime held at its peak, bytes alive in all, and the ``not_freed`` reasons).

    .venv/bin/python -m benchmarks.bench_runtime_rss_cases [--cases mlp,compile,lstm] [--backend aot_eager]
        [--pool file] [--write]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 2**20


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmHWM")


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def child(case: str, mode: str, pool: str, backend: str) -> dict:
    import gc

    import psutil
    import torch

    import mcdla

    torch.set_num_threads(1)
    torch.manual_seed(0)
    proc = psutil.Process()
    if case in ("mlp", "compile"):  # 6 x (Linear 1024 -> Tanh), 8192 rows: 32 MiB per activation
        model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(1024, 1024), torch.nn.Tanh())])
        x = torch.randn(8192, 1024)
        fn = model
        if case == "compile":
            fn = torch.compile(model, backend=backend)
            fn(x).sum().backward()  # compile outside the measured step
            model.zero_grad(set_to_none=True)
    else:  # 3-layer LSTM 512, batch 64 x 256 steps, batch_first: the fused mkldnn path on CPU
        model = torch.nn.LSTM(512, 512, num_layers=3, batch_first=True)
        x = torch.randn(64, 256, 512)

        def fn(inp):
            return model(inp)[0]

    gc.collect()
    rss0 = proc.memory_info().rss
    _reset_hwm()
    report = None
    if mode == "none":
        y = fn(x)
    else:
        vm = mcdla.virtualize(pool, budget=0, model=model)
        with vm:
            y = fn(x)
        vm._last.settle()  # offloads in flight land
    gc.collect()
    rss_fwd, hwm_fwd = proc.memory_info().rss, _hwm()
    _reset_hwm()
    y.sum().backward()
    hwm_bwd = _hwm()
    out = {"case": case, "mode": mode, "fwd_end": (rss_fwd - rss0) / MIB, "fwd_peak": (hwm_fwd - rss0) / MIB,
           "bwd_peak": (hwm_bwd - rss0) / MIB}
    if mode != "none":
        vm.synchronize()
        report = vm.report
        out.update(managed=report.managed_bytes / MIB, offloaded=report.offloaded_bytes / MIB,
                   peak_held=report.peak_resident_saved_bytes / MIB, peak_alive=report.peak_alive_saved_bytes / MIB,
                   not_freed=list(report.not_freed))
        vm.close()
    return out


def measure(case: str, mode: str, pool: str, backend: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_runtime_rss_cases", "--child", case, mode, pool, backend]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="mlp,compile,lstm")
    ap.add_argument("--backend", default="aot_eager", help="torch.compile backend (inductor works; slow here)")
    ap.add_argument("--pool", default="file", help="'file' (a temp dir) or a pool spec")
    ap.add_argument("--dir", default=None, help="where the file tier's temp dir goes")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        pool = f"file:{tmp}" if args.pool == "file" else args.pool
        for case in args.cases.split(","):
            for mode in ("none", "mcdla"):
                rows.append(measure(case, mode, pool, args.backend))
    names = {"mlp": "MLP (eager)", "compile": f"MLP, torch.compile({args.backend})", "lstm": "nn.LSTM (CPU, mkldnn)"}
    lines = [
        f"One step, one torch thread, pool `{args.pool}`, `budget=0`. RSS growth over the RSS before forward (MiB): "
        "at the end of forward (offloads landed), the forward's peak and backward's peak (VmHWM). Report: the "
        "runtime's peak held bytes and the peak bytes of managed storages alive in all (NOTE [memory honesty]).",
        "",
        "| model | run | end of forward | forward peak | backward peak | managed | report: peak held | report: peak alive |",
        "|---|---|---|---|---|---|---|---|",
    ]
    reasons = []
    for r in rows:
        extra = (f"{r['managed']:.0f} | {r['peak_held']:.0f} | {r['peak_alive']:.0f}" if r["mode"] != "none"
                 else "- | - | -")
        lines.append(f"| {names[r['case']]} | {'no mcdla' if r['mode'] == 'none' else 'mcdla'} | {r['fwd_end']:.0f} | "
                     f"{r['fwd_peak']:.0f} | {r['bwd_peak']:.0f} | {extra} |")
        reasons += [f"- {names[r['case']]}: {line}" for line in r.get("not_freed", [])]
    lines += ["", "`StepReport.not_freed`:", "", *reasons]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-rss-cases", "Runtime: RSS with and without mcdla, plain / torch.compile / nn.LSTM (CPU)",
               ".venv/bin/python -m benchmarks.bench_runtime_rss_cases --write", text)


if __name__ == "__main__":
    main()
