"""LLM iteration prediction at scale: seconds per evaluation of the fast path and of the per-rank engine.

The target: one 1,024-GPU GPT-3 175B iteration in <= 1 s and 16,384 GPUs in <= 5 s in-process on this
(2-core, shared) machine. The fast path (``llm_step(mode="fast")``) is a closed form over one rank per
pipeline role; the per-rank engine (``mode="ranks"``, ``sim/llm_ranks.py``) schedules every replica's
``p x m x v x 2`` ops and is the reference it is tested equal to. Both are timed here on DGX A100 figures,
TP8 PP16, selective recompute + SP, micro-batch 1, 1F1B and interleaved (v = 2).
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware.cluster import load_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

COMMAND = ".venv/bin/python -m benchmarks.bench_llm_scale"
HEADER = ("GPUs", "TP x PP x DP", "v", "micro-batches", "iteration s (fast)", "iteration s (ranks)",
          "fast s/eval", "ranks s/eval", "ranks / fast - 1")
# (gpus, dp, global batch, virtual stages): GPT-3's batch of 1536 sequences on 1,024 GPUs; 8x the batch on
# 16,384 GPUs (weak scaling, 96 micro-batches per replica).
CASES = ((1024, 8, 1536, 1), (1024, 8, 1536, 2), (16384, 128, 12288, 1), (16384, 128, 12288, 2))


def _time(fn, budget_s: float, least: int = 3) -> float:
    """Median seconds of ``fn()`` over at least ``least`` calls and about ``budget_s`` seconds."""
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < least or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(budget_s: float) -> list[tuple[str, ...]]:
    spec = preset("gpt3-175b")
    rows = []
    for gpus, dp, batch, v in CASES:
        cluster = load_cluster("dgx-a100").for_gpus(gpus)
        e = Execution(gpus=gpus, tp=8, pp=16, dp=dp, virtual_stages=v, sequence_parallel=True, micro_batch=1,
                      global_batch=batch, recompute="selective")
        fast = llm_step(spec, e, cluster)
        ranks = llm_step(spec, e, cluster, mode="ranks")
        t_fast = _time(lambda: llm_step(spec, e, cluster), budget_s)  # noqa: B023 - called inside the loop
        t_ranks = _time(lambda: llm_step(spec, e, cluster, mode="ranks"), budget_s, least=1)  # noqa: B023
        rows.append((f"{gpus:,}", f"8 x 16 x {dp}", str(v), str(e.micro_batches), f"{fast.iteration_s:.4f}",
                     f"{ranks.iteration_s:.4f}", f"{t_fast:.2e}", f"{t_ranks:.3f}",
                     f"{ranks.iteration_s / fast.iteration_s - 1:.1e}"))
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--budget-s", type=float, default=1.0, help="timing budget per case and mode (s)")
    args = parser.parse_args(argv)
    text = markdown_table(HEADER, run(args.budget_s))
    print_and_record(args, "llm-scale", "LLM iteration at scale: fast path and per-rank engine (GPT-3 175B)", COMMAND,
                     "Seconds per evaluation, median, in-process on this machine (the target: <= 1 s at "
                     "1,024 GPUs and <= 5 s at 16,384). Fast path = closed form over one rank per pipeline role; "
                     "ranks = every replica's 1F1B / interleaved schedule (`sim/llm_ranks.py`), the reference the "
                     "fast path is tested equal to (`tests/sim/test_llm_ranks.py`). DGX A100 figures, TP8 PP16, "
                     "selective recompute + SP, micro-batch 1.\n\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
