"""The attention core as the LLM time model prices it against cuDNN's published SDPA kernel times.

The model prices a layer's causal attention core (``attention: flash``) as its FLOPs at the bf16 peak times the
GEMM curve's efficiency, plus the fused kernel's HBM bytes, plus the softmax exponentials at the device's
``exp_rate``; backward 2.5x the FLOPs (``mcdla.sim.llm._layer_compute``). NVIDIA's cuDNN frontend repository
publishes bf16 SDPA forward and backward times, causal (``top_left``), for Llama- and DeepSeek-V3-shaped heads
(``benchmark/sdpa_benchmark_training``, ``github.com/NVIDIA/cudnn-frontend``); :data:`MEASURED` copies them with
their commit, file and cuDNN version. Each is set beside the model's charge for the same heads, batch and sequence
on the matching preset (the GEMM curve's point at the named model's hidden size and ``batch x seq`` tokens).

The cuDNN 9.13.1 rows (the cuDNN of NeMo Framework 25.11, which ran Megatron-Bridge's 25.11 tables:
Megatron-Bridge r0.2.0 ``docs/releases/software-versions.md``) are the source of the Blackwell presets'
``node.attention_kernels`` ``cudnn-9.13.1`` figures: :func:`ratios` gives each measured time over the model's
charge on the chip's preset, which the presets carry to four places. ``--rows`` prices both Megatron-Bridge
families as recorded (their Blackwell rows name that build, ``execution.attention_kernel``) and with the model's
own attention pricing instead (the field removed). Run::

    .venv/bin/python -m benchmarks.bench_attention_kernels               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_attention_kernels --no-record   # print only
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import mcdla.sim.llm as llm
from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware import load_cluster
from mcdla.report.llm_validation import FAMILIES, MeasuredRun, summary, validate_llm
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import attention_bwd_flops_ratio, preset


class Kernel(NamedTuple):
    """One published cuDNN SDPA time: bf16, causal, forward and backward milliseconds."""

    heads: str  # the benchmark's head shape
    model: str  # the preset with those heads
    system: str  # the preset of the GPU
    gpu: str  # the GPU it ran on
    cudnn: str  # cuDNN version
    source: str  # commit and file in NVIDIA/cudnn-frontend
    batch: int
    seq: int
    fwd_ms: float
    bwd_ms: float


_R = "benchmark/sdpa_benchmark_training/results/"
_A = "benchmark/sdpa_benchmark_training/artifacts/"
_HEAD = "3929da2 " + _R
_DSV3 = "128 heads, 192/128 (DeepSeek-V3)"
_L70 = "64 q / 8 kv heads, 128"
_L405 = "128 q / 8 kv heads, 128"
MEASURED: tuple[Kernel, ...] = (
    Kernel(_DSV3, "deepseek-v3-671b", "gb200-nvl72", "GB200", "9.22", _HEAD + "dsv3/gb200/dsv3_20260424_101009.csv",
           2, 4096, 0.977, 3.383),
    Kernel(_DSV3, "deepseek-v3-671b", "gb200-nvl72", "GB200", "9.22", _HEAD + "dsv3/gb200/dsv3_20260424_101009.csv",
           2, 8192, 3.470, 11.984),
    Kernel(_DSV3, "deepseek-v3-671b", "gb200-nvl72", "GB200", "9.18.1 (deterministic bwd)",
           "b8c0656 " + _R + "gb200_918_only_cudnn/dsv3_20260126_110621.csv", 1, 4096, 0.519, 1.650),
    Kernel(_DSV3, "deepseek-v3-671b", "gb300-nvl72", "GB300", "9.22", _HEAD + "dsv3/gb300/dsv3_20260424_101002.csv",
           2, 4096, 0.864, 3.127),
    Kernel(_DSV3, "deepseek-v3-671b", "dgx-h100", "H200", "9.19 (deterministic bwd)",
           _HEAD + "h200_919_only_cudnn/dsv3_20260227_034744.csv", 1, 4096, 1.148, 4.424),
    Kernel(_L70, "qwen3-235b-a22b", "gb200-nvl72", "GB200", "9.22",
           _HEAD + "llama3.1/gb200/llama3.1_20260424_100750.csv", 2, 4096, 0.391, 1.198),
    Kernel(_L70, "qwen3-235b-a22b", "gb200-nvl72", "GB200", "9.18.1",
           "b8c0656 " + _R + "gb200_918_only_cudnn/llama3.1_20260126_110503.csv", 1, 4096, 0.212, 0.622),
    Kernel(_L70, "qwen3-235b-a22b", "gb300-nvl72", "GB300", "9.22",
           _HEAD + "llama3.1/gb300/llama3.1_20260424_100757.csv", 2, 4096, 0.323, 1.101),
    Kernel(_L70, "llama3-70b", "gb200-nvl72", "GB200", "9.22",
           _HEAD + "llama3.1/gb200/llama3.1_20260424_100750.csv", 2, 8192, 1.397, 4.127),
    Kernel(_L70, "llama3-70b", "dgx-h100", "H200", "9.19",
           _HEAD + "h200_919_only_cudnn/llama3.1_20260227_034703.csv", 1, 4096, 0.465, 1.450),
    Kernel(_L70, "llama3-70b", "dgx-h100", "H200", "9.19",
           _HEAD + "h200_919_only_cudnn/llama3.1_20260227_034703.csv", 1, 8192, 1.708, 5.083),
    Kernel(_L405, "llama3-405b", "gb200-nvl72", "GB200", "9.17.0",
           "b372d39 " + _A + "sdpa_bf16_benchmark_results_NVIDIA_GB200.csv", 1, 4096, 0.397, 1.304),
    Kernel(_L405, "llama3-405b", "gb200-nvl72", "GB200", "9.17.0",
           "b372d39 " + _A + "sdpa_bf16_benchmark_results_NVIDIA_GB200.csv", 1, 8192, 1.389, 4.542),
    Kernel(_L405, "llama3-405b", "b200", "B200", "9.13.1",
           "be6c079 " + _A + "sdpa_fp8_benchmark_results_NVIDIA_B200.csv", 1, 4096, 0.482, 1.650),
    Kernel(_L405, "llama3-405b", "b200", "B200", "9.13.1",
           "be6c079 " + _A + "sdpa_fp8_benchmark_results_NVIDIA_B200.csv", 1, 8192, 1.589, 5.526),
    Kernel(_L405, "llama3-405b", "gb300-nvl72", "GB300", "9.13.1",
           "be6c079 " + _A + "sdpa_fp8_benchmark_results_NVIDIA_GB300.csv", 1, 4096, 0.380, 1.459),
    Kernel(_L405, "llama3-405b", "gb300-nvl72", "GB300", "9.13.1",
           "be6c079 " + _A + "sdpa_fp8_benchmark_results_NVIDIA_GB300.csv", 1, 8192, 1.281, 4.778),
)
"""bf16, causal SDPA times from NVIDIA/cudnn-frontend (commit, file; cuDNN 9.22 and 9.18.1 from the ``cudnn``
backend rows at frontend 1.21.1 and 1.18.0, 9.19 at 1.19.0; 9.17.0 the ``cudnn_fe`` rows run in
``nvcr.io/nvidia/pytorch:25.11-py3``; 9.13.1 the ``bf16`` rows of the fp8 script, run through the frontend in
``nvcr.io/nvidia/pytorch:25.09-py3``, as each README states). The H200 rows are priced on ``dgx-h100`` (the same
989 TFLOP/s bf16 peak; 4.8 against 3.35 TB/s of HBM)."""

def model_ms(k: Kernel, attention_kernel: str | None = None) -> tuple[float, float]:
    """The model's forward and backward milliseconds of one layer's attention core for ``k``'s shape (with the
    measured build ``attention_kernel`` of ``k``'s preset where given)."""
    spec = dataclasses.replace(preset(k.model), seq_len=k.seq)
    cluster = load_cluster(k.system)
    e = Execution(gpus=1, micro_batch=k.batch, global_batch=k.batch, attention_kernel=attention_kernel)
    fwd, bwd = _core_s(llm._layer_compute(spec, e, cluster, llm.cluster_precision(cluster, "bf16")), e)
    return fwd * 1e3, bwd * 1e3


def _core_s(lc: llm._LayerCompute, e: Execution) -> tuple[float, float]:
    """One layer's attention core as the model prices it, forward and backward seconds: its FLOPs at the bf16
    rate plus the kernel's HBM traffic and exponentials."""
    return (lc.attention_s + lc.core_fwd_s,
            attention_bwd_flops_ratio(e.attention) * lc.attention_s + lc.core_bwd_s)


def ratios() -> dict[tuple[str, int], tuple[float, float]]:
    """Measured over model, forward and backward, of cuDNN 9.13.1 by (chip preset, sequence): the figures of the
    presets' ``attention_kernels`` ``cudnn-9.13.1`` (``gb200-nvl72`` takes the B200 chip's, ``b200``'s)."""
    out = {}
    for k in MEASURED:
        if k.cudnn == "9.13.1":
            f, b = model_ms(k)
            out[(k.system, k.seq)] = (k.fwd_ms / f, k.bwd_ms / b)
    return out


def _without_kernel(run: MeasuredRun) -> MeasuredRun:
    """The run with the model's own attention pricing (no measured kernel build)."""
    return dataclasses.replace(run, execution=dataclasses.replace(run.execution, attention_kernel=None))


def _rows_table() -> str:
    """Both Megatron-Bridge families as recorded (cuDNN 9.13.1's times on Blackwell) and with the model's own
    attention pricing."""
    lines = []
    for family in ("megatron-bridge-moe", "megatron-bridge-fp8"):
        recorded = validate_llm(runs=FAMILIES[family])
        own = validate_llm(runs=tuple(_without_kernel(r) for r in FAMILIES[family]))
        rows = [(r.run.name, f"{r.error:+.1%}", f"{s.error:+.1%}") for r, s in zip(recorded, own, strict=True)]
        a, b = summary(recorded), summary(own)
        rows.append(("mean / max |error|", f"{a['mean_abs_error']:.1%} / {a['max_abs_error']:.1%}",
                     f"{b['mean_abs_error']:.1%} / {b['max_abs_error']:.1%}"))
        lines.append(f"{family} (the presets' fp8 fractions, fitted with the recorded build):\n\n"
                     + markdown_table(("run", "recorded (cuDNN 9.13.1 on Blackwell)", "model's own attention"), rows))
    return "\n\n".join(lines)


def kernel_table() -> str:
    """The sourced kernel times beside the model's."""
    rows = []
    for k in MEASURED:
        f, b = model_ms(k)
        rows.append((k.heads, k.gpu, k.cudnn, str(k.batch), str(k.seq), f"{k.fwd_ms:.3f}", f"{f:.3f}",
                     f"{f / k.fwd_ms:.2f}", f"{k.bwd_ms:.3f}", f"{b:.3f}", f"{b / k.bwd_ms:.2f}",
                     f"{(f + b) / (k.fwd_ms + k.bwd_ms):.2f}", k.source))
    return markdown_table(("heads, head size", "GPU", "cuDNN", "batch", "seq", "fwd ms", "model", "ratio",
                           "bwd ms", "model", "ratio", "fwd+bwd ratio", "source (NVIDIA/cudnn-frontend)"), rows)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rows", action="store_true", help="also the Bridge rows with the model's own attention pricing")
    args = parser.parse_args()
    text = ("Model over measured (ratio < 1: the model is faster than the kernel):\n\n" + kernel_table())
    if args.rows:
        text += "\n\n" + _rows_table()
    print_and_record(args, "attention-kernels", "The attention core against cuDNN's published SDPA times",
                     ".venv/bin/python -m benchmarks.bench_attention_kernels" + (" --rows" if args.rows else ""), text)


if __name__ == "__main__":
    main()
