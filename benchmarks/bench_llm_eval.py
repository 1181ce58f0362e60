"""Cost of one analytical LLM evaluation on each preset, and of a whole configuration search, on one core.

The LLM time model (``mcdla.sim.llm_step``) on a preset's generated ``Cluster`` prices each parallel group on the
fabric dimensions it spans (``Cluster.group_dims``), which a cluster remembers per (size, stride). Baseline measured
in the same run: the same evaluation with that memo and the time model's per-cluster memo above it
(``Cluster.model_memo``: collectives, pipeline sends, layer compute; the floor's path table kept) emptied before
every call (every group recomputed, as a fresh cluster would). Both columns empty
the floor's memo of recent drains before each call, so a repeated execution is priced as a new one is in a search. CPU seconds of this process (``time.process_time``), so other jobs on the shared machine do not
inflate them. The search row enumerates and evaluates every valid configuration of GPT-3 175B on 1,024 DGX H100
GPUs in-process and projects the time of 90,000 configurations.
"""

from __future__ import annotations

import statistics
import time

from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.plan.llm_search import enumerate_executions, evaluate_executions
from mcdla.sim import llm_floor_drain
from mcdla.sim import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

COMMAND = ".venv/bin/python -m benchmarks.bench_llm_eval"
HEADER = ("preset", "execution (GPT-3 175B, 1,024 GPUs)", "us/eval", "us/eval, groups recomputed", "ratio")
PRESETS = ("dgx-a100", "dgx-h100", "dgx-h100-cxl", "gh200", "gb200-nvl72", "gb200-nvl72-memnode")
CALCULON_US = 3180.0  # benchmarks/RESULTS.md, "LLM validation: mcdla vs Calculon" (median per evaluation)


def _execution(cluster: Cluster) -> Execution:
    """TP8 PP16 DP8 interleaved, SP, ZeRO-1, selective recompute, activations offloaded, 2,048 sequences (TP1
    DP64 on one-GPU nodes, so the micro-batches still split over the interleaved stages)."""
    tp = min(8, cluster.gpus_per_node)
    return Execution(gpus=1024, tp=tp, pp=16, dp=1024 // (16 * tp), virtual_stages=2, sequence_parallel=tp > 1,
                     zero=1, micro_batch=1, global_batch=2048, recompute="selective",
                     offload_activations=cluster.offload is not None, dp_overlap=True)


def _per_call_s(fn, calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the CPU seconds per call of ``calls`` calls."""
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        samples.append((time.process_time() - t0) / calls)
    return statistics.median(samples)


def run(calls: int) -> tuple[list[tuple[str, ...]], str]:
    spec = preset("gpt3-175b")
    rows, warm_all = [], []
    for name in PRESETS:
        cluster = load_cluster(name).for_gpus(1024)
        e = _execution(cluster)
        memo = cluster._group_memo
        table = llm_floor_drain._table(cluster, e.gpus)
        drains = table.ends

        def fresh() -> None:
            # the floor remembers its last few drains by their bytes: a search never asks the same execution
            # twice, so each call here starts without them (the per-cluster tables stay, as in a search)
            drains.clear()
            llm_step(spec, e, cluster)

        def cold() -> None:
            memo.clear()
            # the time model's per-cluster memo above group_dims would answer without asking it; the floor's
            # path table stays, as in a search
            cluster.model_memo.clear()
            cluster.model_memo[llm_floor_drain._TABLE_KEY] = table
            fresh()

        warm = _per_call_s(fresh, calls)
        base = _per_call_s(cold, calls)
        warm_all.append(warm)
        rows.append((name, f"TP{e.tp} PP16 v2 DP{e.dp}{' +act offload' if e.offload_activations else ''}",
                     f"{warm * 1e6:.1f}", f"{base * 1e6:.1f}", f"{base / warm:.2f}x"))
        print(" | ".join(rows[-1]), flush=True)
    cluster = load_cluster("dgx-h100").for_gpus(1024)
    t0 = time.process_time()
    en = enumerate_executions(spec, cluster, gpus=1024, global_batch=1536)
    t_enum = time.process_time() - t0
    t0 = time.process_time()
    evaluate_executions(spec, cluster, en.executions, backend="serial")
    t_eval = time.process_time() - t0
    n = len(en.executions)
    per = (t_enum + t_eval) / n
    worst = max(warm_all)
    summary = (f"- Search, GPT-3 175B on 1,024 DGX H100 GPUs, global batch 1536: {n:,} valid configurations, "
               f"enumeration {t_enum:.1f} s + evaluation {t_eval:.1f} s CPU = {per * 1e6:.0f} us per configuration; "
               f"90,000 configurations: {90_000 * per:.1f} s on one core.\n"
               f"- Slowest preset {worst * 1e6:.1f} us per evaluation; Calculon's {CALCULON_US:,.0f} us per "
               f"evaluation (its section above) is {CALCULON_US / (worst * 1e6):.0f}x that.")
    print(summary)
    return rows, summary


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="evaluations per timing sample")
    args = parser.parse_args(argv)
    rows, summary = run(args.calls)
    text = markdown_table(HEADER, rows) + "\n\n" + summary
    print_and_record(args, "llm-eval",
                     "Analytical LLM evaluation per preset and a 90,000-configuration search (one core)", COMMAND,
                     text + "\n\nCPU time of one process (`time.process_time`), median of 5 samples per "
                     "cell. Every call starts without the floor's memo of recent drains (a search never asks an "
                     "execution twice). Baseline (same run): also the group -> fabric-dimension memo and the time "
                     "model's per-cluster memo (`Cluster.model_memo`: collectives, pipeline sends, layer compute; the "
                     "floor's path table kept) emptied before each call.")


if __name__ == "__main__":
    main()
