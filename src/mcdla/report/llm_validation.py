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
to these runs (``node.gemm_efficiency``, ``docs/llm.md`` "Fitting"). These runs used Megatron's fused softmax,
so they are predicted with ``attention="materialized"``.

A second family, ``megatron-bridge-fp8`` (:data:`BRIDGE_FP8_RUNS`): Megatron-Bridge 25.11's published FP8
(current scaling) runs of Llama 3 on DGX H100, B200, GB200 and GB300 (``performance-summary.md``, copied in
`Megatron-Bridge 25.11 `performance-summary.md`, NVIDIA-NeMo/Megatron-Bridge on GitHub`), all eleven Llama rows. Measured seconds per iteration = ``GBS x 8192 /
(tokens/s/GPU x GPUs)``. Every unpublished field is stated in the run's ``choices``. FlashAttention (Megatron-Bridge runs TE's fused
attention), ``precision="fp8"``.

Four more families, each record with its source and choices, live in :mod:`mcdla.report.llm_validation_runs`
(``torchtitan-fsdp2``, ``pytorch-fsdp``, ``megatron-bridge-moe``, ``deepspeed-zero-offload``) and are registered in
:data:`FAMILIES`.

Held out (:data:`HELD_OUT_FAMILIES`, reported apart, never fitted): DeepSpeed ZeRO-3 on DGX A100, SC21 Table 2
(:data:`ZERO3_SC21_RUNS`), with ZeRO-3 as DeepSpeed ran it then (one gather and one reduce-scatter per parameter
tensor).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.table import Table

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.report.llm_records import MeasuredRun
from mcdla.report.llm_validation_runs import SOURCED_FAMILIES, bridge_attention_kernel, bridge_attention_note
from mcdla.sim.llm import LlmStep, llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, hardware_flops_per_iteration, preset

__all__ = ["MeasuredRun", "ValidationRow", "RUNS", "BRIDGE_FP8_RUNS", "FAMILIES", "HELD_OUT_FAMILIES",
           "VALIDATION_SYSTEM", "ZERO3_SC21_RUNS", "validate_llm", "summary", "format_table", "family_runs",
           "run_cluster"]

VALIDATION_SYSTEM = "dgx-a100"
"""The preset the published runs ran on (Selene: DGX A100 80 GB nodes on HDR InfiniBand)."""

def _korthikanti(model: str, tp: int, pp: int, batch: int, mb: int, v: int, full_s: float, sel_s: float,
                 ) -> list[MeasuredRun]:
    src = "Korthikanti et al. 2022, Table 5 (config: Table 3)"
    gpus = tp * pp
    common = dict(gpus=gpus, tp=tp, pp=pp, dp=1, virtual_stages=v, micro_batch=mb, global_batch=batch,
                  attention="materialized")
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
                            recompute="full", attention="materialized"))


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


_BRIDGE = "Megatron-Bridge 25.11 performance-summary.md (NVIDIA-NeMo/Megatron-Bridge), FP8-CS, seq 8192"
_RECIPES = ("Megatron-Bridge v0.2.1, the 25.11 container's, scripts/performance/configs/llama3/"
            "workload_base_configs.py and utils/helpers.py")
_BRIDGE_COMMON = ("distributed optimizer (Megatron-Bridge's recipes: use_distributed_optimizer) as ZeRO-1, "
                  "or FSDP=1 as ZeRO-3; flash attention (TE fused attention); dp_overlap on (v0.2.1 "
                  "src/megatron/bridge/recipes/llama/llama3.py _llama3_common: overlap_grad_reduce and "
                  "overlap_param_gather True, and training/comm_overlap.py turns both on whenever dp > 1 with the "
                  "distributed optimizer); defer_embedding_wgrad_compute off (comm_overlap.py's default); fp8 "
                  "current scaling (utils/helpers.py get_precision_config fp8_cs, first and last layers in fp8 too); "
                  "with interleaving pp_comm_overlap on (comm_overlap.py: overlap_p2p_comm True when vp > 1)")


_SPLIT_405B = ("126 layers split with the embedding and the loss counted as layers (Megatron's "
               "account_for_*_in_pipeline_split); sequence_parallel and tp_comm_overlap on; CP's ring K/V exchange "
               "(cp_comm p2p)")
_RECIPE_405B: dict[str, object] = dict(sequence_parallel=True, zero=1, micro_batch=1, tp_comm_overlap=True,
                                       account_for_embedding_in_pipeline_split=True,
                                       account_for_loss_in_pipeline_split=True)


def _bridge(system: str, model: str, gpus: int, gbs: int, tokens_per_s_per_gpu: float, choices: str,
            **execution: object) -> MeasuredRun:
    seconds = gbs * 8192 / (tokens_per_s_per_gpu * gpus)
    execution.update(bridge_attention_kernel(system))
    choices += "; " + bridge_attention_note(system)
    execution.setdefault("dp_overlap", True)
    execution.setdefault("pp_comm_overlap", int(execution.get("virtual_stages", 1)) > 1)  # type: ignore[call-overload]
    return MeasuredRun(
        name=f"{model} {system}", model=model, system=system, precision="fp8", measured_s=seconds,
        family="megatron-bridge-fp8",
        source=f"{_BRIDGE}: {tokens_per_s_per_gpu:,g} tokens/s/GPU on {gpus} GPUs, GBS {gbs}",
        choices=f"{choices}; {_BRIDGE_COMMON}",
        execution=Execution(gpus=gpus, global_batch=gbs, **execution))  # type: ignore[arg-type]


BRIDGE_FP8_RUNS: tuple[MeasuredRun, ...] = (
    _bridge("dgx-h100", "llama3-8b", 8, 128, 14451, "FSDP=1 -> zero=3 over dp 8; no recompute: the table's FSDP 1 "
            "is the base config the scripts carried until 21 Nov 2025 (NVIDIA-NeMo/Megatron-Bridge commit 278b9baad, "
            "scripts/performance/configs/llama3/workload_base_configs.py LLAMA3_8B_H100_FP8_CS_BASE_CONFIG "
            "use_megatron_fsdp=True and no recompute_num_layers; the 25.09 table's row is FSDP 1 too), not the "
            f"one of {_RECIPES} (recompute_num_layers=5 and no Megatron-FSDP, from commit cb62f8620), which the "
            "table's FSDP column contradicts", dp=8, zero=3, micro_batch=1),
    _bridge("dgx-h100", "llama3-70b", 64, 128, 1602, "TP4 PP8 VP5 -> dp 2, zero=1; sequence_parallel and "
            "tp_comm_overlap on (the Llama 3 70B recipe's)", tp=4, pp=8, dp=2, virtual_stages=5,
            sequence_parallel=True, zero=1, micro_batch=1, tp_comm_overlap=True),
    _bridge("gb200-nvl72", "llama3-8b", 8, 128, 31508, "FSDP=0 -> zero=1 over dp 8; CUDA graphs not modelled",
            dp=8, zero=1, micro_batch=2),
    _bridge("gb200-nvl72", "llama3-70b", 64, 256, 4312, "FSDP=1 -> zero=3 over dp 64; activations of the first "
            f"40 of the 80 layers offloaded to Grace memory, weights kept, offload_num_layers 40 ({_RECIPES}: "
            "LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG cpu_offloading_num_layers=40, which set_recompute_overrides "
            "turns into cpu_offloading on, cpu_offloading_weights off)",
            dp=64, zero=3, micro_batch=2, offload_activations=True, offload_num_layers=40),
    _bridge("dgx-h100", "llama3-405b", 1024, 512, 292, f"TP8 PP8 CP2 VP8 -> dp 8, zero=1; {_SPLIT_405B}",
            tp=8, pp=8, cp=2, dp=8, virtual_stages=8, **_RECIPE_405B),
    _bridge("b200", "llama3-405b", 128, 64, 661, f"TP4 PP8 CP2 VP8 -> dp 2, zero=1; {_SPLIT_405B}",
            tp=4, pp=8, cp=2, dp=2, virtual_stages=8, **_RECIPE_405B),
    _bridge("gb200-nvl72", "llama3-405b", 256, 1536, 813, f"TP4 PP16 VP4 -> dp 4, zero=1; {_SPLIT_405B}",
            tp=4, pp=16, dp=4, virtual_stages=4, **_RECIPE_405B),
    _bridge("gb300-nvl72", "llama3-405b", 256, 1536, 999, f"TP2 PP8 CP2 VP4 -> dp 8, zero=1; {_SPLIT_405B}",
            tp=2, pp=8, cp=2, dp=8, virtual_stages=4, **_RECIPE_405B),
    _bridge("gb300-nvl72", "llama3-8b", 8, 128, 37556, "FSDP=0 -> zero=1 over dp 8; the table's MBS 2 (the "
            f"recipe LLAMA3_8B_GB300_FP8_CS_BASE_CONFIG says micro_batch_size=4, {_RECIPES}); CUDA graphs not "
            "modelled", dp=8, zero=1, micro_batch=2),
    _bridge("gb300-nvl72", "llama3-70b", 64, 256, 4520, "FSDP=1 -> zero=3 over dp 64; activations of the first "
            f"20 of the 80 layers offloaded to Grace memory, weights kept, offload_num_layers 20 ({_RECIPES}: "
            "LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG cpu_offloading_num_layers=20, which set_recompute_overrides "
            "turns into cpu_offloading on, cpu_offloading_weights off)",
            dp=64, zero=3, micro_batch=2, offload_activations=True, offload_num_layers=20),
    _bridge("b200", "llama3-8b", 8, 128, 30624, f"FSDP=0 -> zero=1 over dp 8 ({_RECIPES}: "
            "LLAMA3_8B_B200_FP8_CS_BASE_CONFIG micro_batch_size=2); CUDA graphs not modelled",
            dp=8, zero=1, micro_batch=2),
)
"""Megatron-Bridge 25.11's FP8-CS Llama 3 runs: the eleven Llama rows of its table (the numbers in parentheses,
FP8-MX, left out)."""

FAMILIES: dict[str, tuple[MeasuredRun, ...]] = {"megatron-a100": RUNS, "megatron-bridge-fp8": BRIDGE_FP8_RUNS,
                                                 **SOURCED_FAMILIES}
"""The validation families by name: the published A100 Megatron-LM runs, Megatron-Bridge's FP8 runs and the
families of :mod:`mcdla.report.llm_validation_runs` (torchtitan FSDP2, PyTorch FSDP, Megatron-Bridge MoE, DeepSpeed
ZeRO-Offload)."""


def family_runs(family: str) -> tuple[MeasuredRun, ...]:
    """The runs of a family by name (or all of them for ``all``); one-line ConfigError listing them otherwise."""
    if family == "all":
        return tuple(run for runs in FAMILIES.values() for run in runs)
    try:
        return FAMILIES[family]
    except KeyError:
        raise ConfigError(f"validate-llm.family: got {brief(family)}; must be one of "
                          f"{', '.join(FAMILIES)}, all") from None


def run_cluster(run: MeasuredRun, system: str | Cluster | None) -> Cluster:
    """The cluster a run is predicted on, sized to its GPUs: ``system`` for the A100 family when given, else the
    run's preset, with the GPUs per node the run's job took (``MeasuredRun.gpus_per_node``)."""
    if system is not None and run.system == VALIDATION_SYSTEM:
        cluster = system if isinstance(system, Cluster) else load_cluster(system)
    else:
        cluster = load_cluster(run.system)
    if run.gpus_per_node:
        cluster = cluster.with_gpus_per_node(run.gpus_per_node)
    return cluster.for_gpus(run.execution.gpus)


_SC21_ZERO3_CHOICES = (
    "full recomputation (eq. 3 counts it; Megatron-DeepSpeed's checkpointed activations); fsdp_prefetch 0: "
    "DeepSpeed's default prefetch bucket (stage3_prefetch_bucket_size 5e7 parameters) is smaller than one of this "
    "model's 1.8e9-parameter layers, and each prefetched gather waits on torch.cuda.synchronize() "
    "(partition_parameters.py _allgather_param), so no whole layer is gathered ahead; zero3_collectives "
    "per-tensor: DeepSpeed ZeRO-3 of the paper's time (v0.3.12 to v0.5.4, microsoft/DeepSpeed 599258f97 until "
    "c0eeb69df) all-gathers one parameter at a time (fetch_sub_module -> _all_gather(async_op=True) -> one "
    "_allgather_param, one torch.distributed.all_gather, per parameter) and reduce-scatters each parameter of a "
    "gradient bucket on its own (_reduce_scatter_gradients: one torch.distributed.reduce_scatter per "
    "parameter); zero3_persist_numel 100000: stage3_param_persistence_threshold's default (runtime/zero/"
    "constants.py), which keeps the biases and LayerNorms (< 1e5 elements) gathered; no separate gradient "
    "overlap; materialized attention (Megatron-DeepSpeed's fused softmax, as the A100 Megatron runs)")


def _sc21_zero3(gpus: int, micro_batch: int, tflops_per_gpu: float) -> MeasuredRun:
    """A row of SC21 Table 2, "ZeRO-3 without model parallelism", GPT-3 175B, batch 1536, in seconds per
    iteration by the paper's eq. 3 (as :func:`_sc21`). Unpublished fields, chosen before comparing and stated in
    :data:`_SC21_ZERO3_CHOICES`: full recomputation, no prefetch, DeepSpeed's per-parameter collectives with its
    default persistence threshold, materialized attention."""
    spec = preset("gpt3-175b")
    seconds = hardware_flops_per_iteration(spec, 1536, "full") / (gpus * tflops_per_gpu * 1e12)
    return MeasuredRun(
        name=f"gpt3-175b ZeRO-3 {gpus} GPUs", model="gpt3-175b", measured_s=seconds, family="deepspeed-zero3",
        source=f"Narayanan et al. SC21, Table 2 (ZeRO-3, DeepSpeed): {tflops_per_gpu:g} TFLOP/s per GPU on {gpus} "
               f"GPUs, micro-batch {micro_batch}, batch 1536 [the 1,536-GPU row read from the table; the "
               "others from the same table, not re-read here]",
        choices=_SC21_ZERO3_CHOICES,
        execution=Execution(gpus=gpus, dp=gpus, zero=3, fsdp_prefetch=0, micro_batch=micro_batch,
                            global_batch=1536, recompute="full", attention="materialized",
                            zero3_collectives="per-tensor", zero3_persist_numel=100_000))


ZERO3_SC21_RUNS: tuple[MeasuredRun, ...] = (
    _sc21_zero3(384, 4, 144),
    _sc21_zero3(768, 2, 88),
    _sc21_zero3(1536, 1, 44),
)
"""DeepSpeed ZeRO-3 on DGX A100 (Selene), held out: reported, never fitted (Narayanan et al. SC21, Table 2)."""

HELD_OUT_FAMILIES: dict[str, tuple[MeasuredRun, ...]] = {
    "DeepSpeed ZeRO-3, SC21 Table 2 (held out)": ZERO3_SC21_RUNS,
}
"""Families ``validate-llm`` reports apart from the fitted families (:data:`FAMILIES`), each with its own error;
never part of ``--family all`` nor of a fit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """One run: measured and predicted seconds per iteration and the relative error (predicted / measured - 1)."""

    run: MeasuredRun
    predicted: LlmStep

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted.iteration_s / self.run.measured_s - 1.0


def validate_llm(system: str | Cluster | None = VALIDATION_SYSTEM,
                 runs: tuple[MeasuredRun, ...] = RUNS) -> list[ValidationRow]:
    """Predict every run, sized to its GPUs: the A100 runs on ``system`` (a preset, a generator file or a
    :class:`Cluster`; None = their own preset), the other families on the preset each run names."""
    rows = []
    for run in runs:
        spec: TransformerSpec = preset(run.model)
        step = llm_step(spec, run.execution, run_cluster(run, system), precision=run.precision)
        rows.append(ValidationRow(run=run, predicted=step))
    return rows


def summary(rows: list[ValidationRow]) -> dict[str, float]:
    """Mean and max absolute relative error."""
    errors = [abs(r.error) for r in rows]
    return {"mean_abs_error": statistics.fmean(errors), "max_abs_error": max(errors)}


def format_table(rows: list[ValidationRow], title: str = "LLM time model vs published Megatron runs") -> Table:
    """A rich table: run, TP/PP/v, micro-batches, measured and predicted seconds, error, MFU; the mean and
    max error as its caption."""
    s = summary(rows)
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption=f"mean |error| {s['mean_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%} over {len(rows)} runs")
    for column in ("run", "tp", "pp", "v", "m", "measured s", "predicted s", "error", "MFU"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        e = r.run.execution
        table.add_row(r.run.name, str(e.tp), str(e.pp), str(e.virtual_stages), str(e.micro_batches),
                      f"{r.run.measured_s:.3f}", f"{r.predicted.iteration_s:.3f}", f"{r.error:+.1%}",
                      f"{r.predicted.mfu:.1%}")
    return table
