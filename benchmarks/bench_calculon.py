"""mcdla's LLM iteration model side by side with Calculon on Korthikanti et al. 2022, Table 5.

The eight Table 5 runs (A100-80GB, seq 2048; 22B TP8 PP1, 175B TP8 PP8 v3, 530B TP8 PP35 v3,
1T TP8 PP64; full recomputation and selective recomputation + sequence parallelism) are predicted by
``mcdla.sim.llm.llm_step`` on the ``dgx-a100`` preset and by Calculon's ``Llm`` model
on its own ``systems/a100_80g.json`` with the execution files of its own ``llm-validation`` (``seqsel_tab5``).
The table gives both predictions against the measured time and the seconds per evaluation of each, medians
of N evaluations in this process, taken in alternating rounds (N/10 mcdla, N/10 Calculon, ...) so load on the
shared machine hits both alike. An evaluation is one prediction from already-parsed inputs: ``llm_step(spec, execution,
cluster)`` for mcdla; ``Llm(app, log)``, ``compile``, ``run`` and ``get_total_time()`` for Calculon.

Calculon is not a dependency of mcdla: point ``--calculon`` (or ``$CALCULON_PATH``) at a checkout of
calculon-ai/calculon (its ``calculon`` package, ``models/``, ``systems/`` and ``validation/seqsel/tab5/``; it
imports numpy). Without one the benchmark reports mcdla's side only and does not touch RESULTS.md::

    .venv/bin/python -m benchmarks.bench_calculon --calculon /tmp/calculon               # run, print, record
    .venv/bin/python -m benchmarks.bench_calculon --calculon /tmp/calculon --no-record   # print only

The machine is shared: with ``--wait-quiet S`` the run first waits up to S seconds for the 1-minute load
average to drop below ``--quiet-load`` (default 1.0); the record gives the load it ended under.
A ``PROVENANCE.md`` at the top of the Calculon checkout, if there is one, is quoted in the record.
Errors are ``predicted / measured - 1`` on both sides (Calculon's own table prints ``1 - predicted / measured``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._results import record
from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation import RUNS, MeasuredRun
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

COMMAND = ".venv/bin/python -m benchmarks.bench_calculon --calculon /tmp/calculon"
# mcdla preset -> Calculon's model file name (models/<name>.json, validation/seqsel/tab5/<name>_<mode>.json)
CALCULON_MODEL = {"megatron-22b": "megatron-22B", "gpt3-175b": "gpt3-175B", "megatron-530b": "turing-530B",
                  "megatron-1t": "megatron-1T"}
TABLE5 = tuple(r for r in RUNS if r.source.startswith("Korthikanti"))
NOTES = """\
Same runs on both sides (checked field by field: hidden, layers, heads, FFN, seq, TP/PP/DP, global and micro
batch, interleaving, sequence parallelism, full or selective recomputation); each side on its own description of
a DGX A100 80 GB cluster. Calculon's execution files add its own knobs: `seqsel` is `attn_only` recomputation with
`rs_ag` TP communication and `seq_par_ag_redo`; its 530B `full` file sets `fused_activation: true`, the others
false. Neither number is out of sample: mcdla's GEMM efficiency curve (2 parameters, docs/llm.md "Fitting") is
fitted to these 8 runs and SC21's 4, and Calculon's a100_80g system file (its efficiency tables) is the one its
own validation on this table uses. Evaluation times are single-process, single-thread Python on this shared 2-core machine."""


@dataclass
class Row:
    run: MeasuredRun
    mcdla_s: float
    mcdla_eval_s: float
    calc_s: float | None = None
    calc_eval_s: float | None = None

    @property
    def mcdla_err(self) -> float:
        return self.mcdla_s / self.run.measured_s - 1

    @property
    def calc_err(self) -> float | None:
        return None if self.calc_s is None else self.calc_s / self.run.measured_s - 1


class Calculon:
    """Calculon's Table 5 inputs, parsed once, and one evaluation of its model on them."""

    def __init__(self, root: Path) -> None:
        if not (root / "calculon" / "__init__.py").is_file():
            raise FileNotFoundError(f"no calculon package under {root}")
        sys.path.insert(0, str(root))
        try:
            calculon = importlib.import_module("calculon")
            self.Llm = importlib.import_module("calculon.llm").Llm
        finally:
            sys.path.remove(str(root))
        self.root = root
        self.read = calculon.io.read_json_file
        self.system = calculon.System(self.read(str(root / "systems" / "a100_80g.json")))
        self.log = logging.getLogger("bench_calculon.calculon")
        self.log.setLevel(logging.WARNING)  # as its llm-validation runs it (default level); debug lines are not printed

    def inputs(self, run: MeasuredRun) -> tuple[Any, Any]:
        name = CALCULON_MODEL[run.model]
        mode = "full" if run.execution.recompute == "full" else "seqsel"
        app_cfg = self.read(str(self.root / "models" / f"{name}.json"))
        exe_cfg = self.read(str(self.root / "validation" / "seqsel" / "tab5" / f"{name}_{mode}.json"))
        _check_same(run, app_cfg, exe_cfg)
        return self.Llm.Application(app_cfg), self.Llm.Execution.from_json(exe_cfg)

    def evaluate(self, app: Any, exe: Any) -> float:
        model = self.Llm(app, self.log)
        model.compile(self.system, exe)
        model.run(self.system)
        return float(model.get_total_time())


def _check_same(run: MeasuredRun, app: dict[str, Any], exe: dict[str, Any]) -> None:
    """Both sides must describe the same run; stop on any difference in shape or parallelism."""
    spec, e = preset(run.model), run.execution
    ours = {"hidden": spec.hidden, "num_blocks": spec.layers, "attn_heads": spec.heads, "seq_size": spec.seq_len,
            "feedforward": spec.ffn_hidden, "tensor_par": e.tp, "pipeline_par": e.pp, "data_par": e.dp,
            "batch_size": e.global_batch, "microbatch_size": e.micro_batch, "pipeline_interleaving": e.virtual_stages,
            "seq_par": e.sequence_parallel, "full_recompute": e.recompute == "full"}
    theirs = {**{k: app[k] for k in ("hidden", "num_blocks", "attn_heads", "seq_size", "feedforward")},
              **{k: exe[k] for k in ("tensor_par", "pipeline_par", "data_par", "batch_size", "microbatch_size",
                                     "pipeline_interleaving")},
              "seq_par": exe["tensor_par_comm_type"] == "rs_ag", "full_recompute": exe["activation_recompute"] == "full"}
    diff = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    if diff:
        raise SystemExit(f"bench_calculon: {run.name}: mcdla and Calculon configurations differ (mcdla, Calculon): {diff}")


def _alternate(fns: list[Callable[[], Any]], n: int, rounds: int = 10) -> list[float]:
    """Median seconds of each of ``fns`` over about ``n`` calls, in ``rounds`` rounds of ``n / rounds`` calls of
    each in turn: load on the shared machine hits both alike, and one model's garbage and cache traffic does not
    land in the other's calls (one call each, alternated, doubled mcdla's median)."""
    times: list[list[float]] = [[] for _ in fns]
    per = max(1, n // rounds)
    for _ in range(max(1, min(rounds, n))):
        for fn, ts in zip(fns, times):
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def run(calc: Calculon | None, n: int) -> list[Row]:
    rows = []
    for r in TABLE5:
        spec = preset(r.model)
        cluster = load_cluster("dgx-a100").for_gpus(r.execution.gpus)
        mcdla_fn = lambda: llm_step(spec, r.execution, cluster)  # noqa: E731,B023 - called inside the loop
        row = Row(run=r, mcdla_s=mcdla_fn().iteration_s, mcdla_eval_s=0.0)
        if calc is None:
            (row.mcdla_eval_s,) = _alternate([mcdla_fn], n)
        else:
            app, exe = calc.inputs(r)
            calc_fn = lambda: calc.evaluate(app, exe)  # noqa: E731,B023
            row.calc_s = calc_fn()
            row.mcdla_eval_s, row.calc_eval_s = _alternate([mcdla_fn, calc_fn], n)
        rows.append(row)
        print(f"{r.name}: measured {r.measured_s:.2f} s, mcdla {row.mcdla_s:.2f} s ({row.mcdla_err:+.1%}), "
              + ("Calculon n/a" if row.calc_s is None else f"Calculon {row.calc_s:.2f} s ({row.calc_err:+.1%})"),
              flush=True)
    return rows


def _us(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e6:,.0f}"


def table(rows: list[Row]) -> str:
    head = ("| run (Korthikanti Table 5) | TP x PP, v | measured s | mcdla s | mcdla error | Calculon s | Calculon error "
            "| mcdla us/eval | Calculon us/eval | Calculon / mcdla |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        e = r.run.execution
        ratio = "n/a" if r.calc_eval_s is None else f"{r.calc_eval_s / r.mcdla_eval_s:,.0f}x"
        lines.append(
            f"| {r.run.name} | {e.tp} x {e.pp}, {e.virtual_stages} | {r.run.measured_s:.2f} | {r.mcdla_s:.2f} | "
            f"{r.mcdla_err:+.1%} | {'n/a' if r.calc_s is None else f'{r.calc_s:.2f}'} | "
            f"{'n/a' if r.calc_err is None else f'{r.calc_err:+.1%}'} | {_us(r.mcdla_eval_s)} | {_us(r.calc_eval_s)} | "
            f"{ratio} |")
    return "\n".join(lines)


def summary(rows: list[Row], n: int) -> str:
    def errs(xs: list[float]) -> str:
        return f"mean |error| {statistics.fmean(map(abs, xs)):.2%}, max {max(map(abs, xs)):.2%}"

    m_eval = statistics.median(r.mcdla_eval_s for r in rows)
    lines = [f"- mcdla: {errs([r.mcdla_err for r in rows])}; {m_eval * 1e6:,.0f} us per evaluation (median over the "
             f"{len(rows)} runs of each run's median of {n})."]
    calc_errs = [r.calc_err for r in rows if r.calc_err is not None]
    if len(calc_errs) == len(rows):
        c_eval = statistics.median(r.calc_eval_s for r in rows if r.calc_eval_s is not None)
        lines.append(f"- Calculon: {errs(calc_errs)}; {c_eval * 1e6:,.0f} us per evaluation (same medians); "
                     f"{c_eval / m_eval:,.0f}x mcdla's time.")
    else:
        lines.append("- Calculon: not run (no checkout given: --calculon PATH or $CALCULON_PATH).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.bench_calculon", description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", type=Path, default=os.environ.get("CALCULON_PATH") or None,
                    help="checkout of calculon-ai/calculon (default $CALCULON_PATH; none: mcdla only)")
    ap.add_argument("-n", type=int, default=200, help="evaluations per run and side, in 10 alternating rounds (default 200)")
    ap.add_argument("--no-record", action="store_true", help="print only, leave RESULTS.md alone")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="first wait up to S seconds for the load average to drop below --quiet-load (default 0)")
    ap.add_argument("--quiet-load", type=float, default=1.0, help="load average to wait for (default 1.0)")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"-n must be at least 1, got {args.n}")

    calc = None
    if args.calculon is None:
        print("bench_calculon: Calculon not found (give --calculon PATH or $CALCULON_PATH); reporting mcdla only")
    else:
        try:
            calc = Calculon(args.calculon.expanduser())
        except (OSError, ImportError, KeyError, json.JSONDecodeError) as exc:
            print(f"bench_calculon: Calculon not usable at {args.calculon}: {exc}; reporting mcdla only")

    deadline = time.monotonic() + args.wait_quiet
    while os.getloadavg()[0] >= args.quiet_load and time.monotonic() < deadline:
        time.sleep(5)
    print(f"bench_calculon: load average {os.getloadavg()[0]:.1f} at start", flush=True)
    rows = run(calc, args.n)
    text = table(rows) + "\n\n" + summary(rows, args.n) + "\n\n" + NOTES
    print(text)
    if args.no_record:
        return
    if calc is None:
        print("bench_calculon: RESULTS.md not updated (the recorded section compares both)")
        return
    prov = calc.root / "PROVENANCE.md"
    note = ("Calculon: " + " ".join(prov.read_text().split())) if prov.is_file() else f"Calculon: checkout at {calc.root}."
    record("llm-calculon", "LLM validation: mcdla vs Calculon", COMMAND, text + "\n\n" + note)


if __name__ == "__main__":
    main()
