"""Engine mode for GPT-3 175B on 1,024 GPUs: the lowered programs on the contention-aware engine, against the
analytical evaluation of the same execution measured in the same run (``mcdla.sim.llm_lower.engine_step`` vs
``mcdla.sim.llm_step``). CPU seconds of this process (``time.process_time``). The execution is Megatron's SC21
one (TP8 PP16 DP8, 1,536 sequences) on 128 DGX H100 nodes (``dgx-h100-ndr``), activations offloaded. The
engine's figure is the median of ``--repeats`` runs, the analytical one the mean of 100 calls.
"""

from __future__ import annotations

from benchmarks._engine_timing import time_engine
from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware.cluster import load_cluster
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

COMMAND = ".venv/bin/python -m benchmarks.bench_llm_engine"
HEADER = ("execution", "engine s", "analytical us", "ratio", "ranks simulated", "engine iteration s",
          "analytical iteration s", "contention s")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--global-batch", type=int, default=1536, help="sequences per iteration")
    parser.add_argument("--repeats", type=int, default=3, help="engine runs; the median is reported")
    args = parser.parse_args(argv)
    spec = preset("gpt3-175b")
    e = Execution(gpus=1024, tp=8, pp=16, dp=8, micro_batch=1, global_batch=args.global_batch,
                  recompute="selective", sequence_parallel=True, offload_activations=True)
    cluster = load_cluster("dgx-h100-ndr").for_gpus(1024)
    t = time_engine(spec, e, cluster, args.repeats)
    analytical, analytical_s, run, engine_s, samples = t.analytical, t.analytical_s, t.run, t.engine_s, t.samples
    rows = [(f"TP8 PP16 DP8, {args.global_batch} seq, SP, selective, activations offloaded", f"{engine_s:.2f}",
             f"{analytical_s * 1e6:.0f}", f"{engine_s / analytical_s:.3g}", str(run.ranks_simulated),
             f"{run.iteration_s:.4f}", f"{analytical.iteration_s:.4f}", f"{run.contention_s:.4f}")]
    text = markdown_table(HEADER, rows) + f"\n\nEngine runs (CPU s): {', '.join(f'{x:.2f}' for x in samples)}."
    print_and_record(args, "llm-engine", "Engine mode: GPT-3 175B on 1,024 DGX H100 GPUs (one core)",
                     COMMAND + (f" --global-batch {args.global_batch}" if args.global_batch != 1536 else ""), text)


if __name__ == "__main__":
    main()
