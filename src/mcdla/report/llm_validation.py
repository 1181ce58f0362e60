"""Predicted against measured iteration times of published Megatron-LM runs on DGX A100 (Selene).

Two sources, every number cited where it is written down:

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv
  2205.05198), Table 5: measured end-to-end iteration time with full recomputation and with selective
  recomputation plus sequence parallelism; configurations from its Table 3 (seq 2048, vocab 51200, micro-batch
  4 for 22B and 1 otherwise, 175B and 530B with an interleaved schedule of 3 virtual stages).
* Narayanan et al. SC21, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
  (arXiv 2104.04473), Table 1 rows 1.7B-18.4B (pipeline-parallel size 1): measured teraFLOP/s per GPU,
  turned into seconds per iteration with the paper's own FLOP count (its eq. 3, full recomputation):
  ``96 B s l h^2 (1 + s/(6h) + V/(16 l h)) / (GPUs * TFLOP/s)``. The table gives no micro-batch size;
  4 is assumed (the prediction barely depends on it without pipelining).

The cluster is the shipped ``dgx-a100`` preset (``mcdla.hardware.presets``, every figure sourced there), sized to
each run's GPUs: A100 80 GB (312 TFLOP/s dense fp16/bf16, 2039 GB/s HBM2e), NVLink 3 through NVSwitch at 300 GB/s
per direction per GPU, one HDR InfiniBand 200 Gb/s rail (25 GB/s) per GPU, and the GEMM efficiency curve fitted
to these runs (``node.gemm_efficiency``, ``docs/llm.md`` "Fitting").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.sim.llm import LlmStep, llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, hardware_flops_per_iteration, preset

__all__ = ["MeasuredRun", "ValidationRow", "RUNS", "VALIDATION_SYSTEM", "validate_llm", "summary", "format_table"]

VALIDATION_SYSTEM = "dgx-a100"
"""The preset the published runs ran on (Selene: DGX A100 80 GB nodes on HDR InfiniBand)."""

@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """A published run: model, execution and the measured seconds per iteration with their source."""

    name: str
    model: str
    execution: Execution
    measured_s: float
    source: str


def _korthikanti(model: str, tp: int, pp: int, batch: int, mb: int, v: int, full_s: float, sel_s: float,
                 ) -> list[MeasuredRun]:
    src = "Korthikanti et al. 2022, Table 5 (config: Table 3)"
    gpus = tp * pp
    common = dict(gpus=gpus, tp=tp, pp=pp, dp=1, virtual_stages=v, micro_batch=mb, global_batch=batch)
    return [
        MeasuredRun(name=f"{model} full", model=model, measured_s=full_s, source=src,
                    execution=Execution(**common, recompute="full")),  # type: ignore[arg-type]
        MeasuredRun(name=f"{model} selective+SP", model=model, measured_s=sel_s, source=src,
                    execution=Execution(**common, recompute="selective", sequence_parallel=True)),  # type: ignore[arg-type]
    ]


def _sc21(model: str, tp: int, gpus: int, batch: int, tflops_per_gpu: float) -> MeasuredRun:
    spec = preset(model)
    seconds = hardware_flops_per_iteration(spec, batch, "full") / (gpus * tflops_per_gpu * 1e12)
    return MeasuredRun(
        name=f"{model} SC21", model=model, measured_s=seconds,
        source=f"Narayanan et al. SC21, Table 1: {tflops_per_gpu:g} TFLOP/s per GPU on {gpus} GPUs, batch {batch}",
        execution=Execution(gpus=gpus, tp=tp, pp=1, dp=gpus // tp, micro_batch=4, global_batch=batch,
                            recompute="full"))


RUNS: tuple[MeasuredRun, ...] = (
    *_korthikanti("megatron-22b", 8, 1, 4, 4, 1, 1.42, 1.10),
    *_korthikanti("gpt3-175b", 8, 8, 64, 1, 3, 18.13, 13.75),
    *_korthikanti("megatron-530b", 8, 35, 280, 1, 3, 49.05, 37.83),
    *_korthikanti("megatron-1t", 8, 64, 512, 1, 1, 94.42, 71.49),
    _sc21("megatron-1.7b", 1, 32, 512, 137),
    _sc21("megatron-3.6b", 2, 64, 512, 138),
    _sc21("megatron-7.5b", 4, 128, 512, 142),
    _sc21("megatron-18.4b", 8, 256, 1024, 135),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """One run: measured and predicted seconds per iteration and the relative error (predicted / measured - 1)."""

    run: MeasuredRun
    predicted: LlmStep

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted.iteration_s / self.run.measured_s - 1.0


def validate_llm(system: str | Cluster = VALIDATION_SYSTEM, runs: tuple[MeasuredRun, ...] = RUNS) -> list[ValidationRow]:
    """Predict every run on ``system`` (a preset, a generator file or a :class:`Cluster`), sized to each run's
    GPUs."""
    cluster = system if isinstance(system, Cluster) else load_cluster(system)
    rows = []
    for run in runs:
        spec: TransformerSpec = preset(run.model)
        rows.append(ValidationRow(run=run, predicted=llm_step(spec, run.execution, cluster.for_gpus(run.execution.gpus))))
    return rows


def summary(rows: list[ValidationRow]) -> dict[str, float]:
    """Mean and max absolute relative error."""
    errors = [abs(r.error) for r in rows]
    return {"mean_abs_error": statistics.fmean(errors), "max_abs_error": max(errors)}


def format_table(rows: list[ValidationRow]) -> str:
    """A plain-text table: run, TP/PP/v, micro-batches, measured and predicted seconds, error, MFU."""
    head = f"{'run':<28} {'tp':>3} {'pp':>3} {'v':>2} {'m':>4} {'measured s':>11} {'predicted s':>12} {'error':>7} {'MFU':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        e = r.run.execution
        lines.append(f"{r.run.name:<28} {e.tp:>3} {e.pp:>3} {e.virtual_stages:>2} {e.micro_batches:>4} "
                     f"{r.run.measured_s:>11.3f} {r.predicted.iteration_s:>12.3f} {r.error:>+7.1%} {r.predicted.mfu:>6.1%}")
    s = summary(rows)
    lines.append(f"mean |error| {s['mean_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%} over {len(rows)} runs")
    return "\n".join(lines)
