"""Engine mode on ZeRO-3/FSDP records: the lowered programs (one op per layer, the per-layer gathers and
reduce-scatters) on the contention-aware engine against the analytical evaluation of the same execution measured
in the same run (``mcdla.sim.llm_lower.engine_step`` vs ``mcdla.sim.llm_step``). CPU seconds of this process
(``time.process_time``), the engine's the median of ``--repeats`` runs, the analytical one the mean of 100 calls.
The records: the held-out DeepSpeed ZeRO-3 run (GPT-3 175B on 384 DGX A100 GPUs, one pipeline folded, the
collectives at their closed-form times), Megatron-Bridge's Llama 3 8B FSDP record on one DGX H100 (every replica
simulated, the collectives on the NVLink), and the same on two nodes with activations offloaded (the gathers
share the GPU's x16 with the offload).
"""

from __future__ import annotations

from benchmarks._engine_timing import time_engine
from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation import ZERO3_SC21_RUNS
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

COMMAND = ".venv/bin/python -m benchmarks.bench_llm_engine_zero"
HEADER = ("record", "engine s", "analytical us", "ratio", "ranks simulated", "engine iteration s",
          "analytical iteration s", "engine / analytical", "contention s")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="engine runs per record; the median is reported")
    args = parser.parse_args(argv)
    sc21 = ZERO3_SC21_RUNS[0]
    cases = [
        ("GPT-3 175B ZeRO-3, 384 DGX A100 (SC21), folded", sc21.model, "dgx-a100", sc21.execution),
        ("Llama 3 8B FSDP DP8, 128 seq, one DGX H100", "llama3-8b", "dgx-h100",
         Execution(gpus=8, dp=8, zero=3, micro_batch=1, global_batch=128)),
        ("Llama 3 8B ZeRO-3 TP8 DP2, 8 seq, activations offloaded", "llama3-8b", "dgx-h100",
         Execution(gpus=16, tp=8, dp=2, zero=3, micro_batch=1, global_batch=8, offload_activations=True)),
    ]
    rows = []
    for label, model, system, e in cases:
        spec, cluster = preset(model), load_cluster(system).for_gpus(e.gpus)
        t = time_engine(spec, e, cluster, args.repeats)
        analytical, analytical_s, run, engine_s = t.analytical, t.analytical_s, t.run, t.engine_s
        rows.append((label, f"{engine_s:.2f}", f"{analytical_s * 1e6:.0f}", f"{engine_s / analytical_s:.3g}",
                     str(run.ranks_simulated), f"{run.iteration_s:.4f}", f"{analytical.iteration_s:.4f}",
                     f"{run.iteration_s / analytical.iteration_s:.4f}", f"{run.contention_s:.4f}"))
    text = markdown_table(HEADER, rows)
    print_and_record(args, "llm-engine-zero", "Engine mode on ZeRO-3/FSDP records (one core)", COMMAND, text)


if __name__ == "__main__":
    main()
