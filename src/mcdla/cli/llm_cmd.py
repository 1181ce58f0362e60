"""``mcdla validate-llm`` (predicted vs measured published Megatron runs) and ``mcdla llm-predict`` (one model
under one execution record on a hardware preset, by default the validated ``dgx-a100``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mcdla.cli._app import app, check_finite, console, fail, print_json
from mcdla.errors import HardwareError, brief
from mcdla.units import format_bytes, format_count, format_duration, format_seconds, parse_count

if TYPE_CHECKING:
    from mcdla.hardware.cluster import Cluster
    from mcdla.sim.llm import LlmStep
    from mcdla.workload.execution import Execution
    from mcdla.workload.transformer import TransformerSpec

__all__ = ["MAX_SLOWDOWN", "llm_predict_cmd", "validate_llm_cmd"]

#: Largest --slowdown factor: a rank a million times slower than its peers is a dead rank, not a straggler.
MAX_SLOWDOWN = 1e6


def _cluster(system: str) -> Cluster:
    """The ``--system`` preset or file as a generated cluster; a bad one fails naming the option."""
    from mcdla.hardware.cluster import load_cluster

    try:
        return load_cluster(system).generated()
    except HardwareError as exc:
        fail(f"--system: {exc}")


@app.command("validate-llm")
def validate_llm_cmd(
    system: Annotated[str, typer.Option(
        help="Hardware preset or generator file the A100 runs are predicted on.")] = "dgx-a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and the summary as JSON.")] = False,
    family: Annotated[str, typer.Option(
        help="Published runs: megatron-a100 (Korthikanti Table 5, SC21 Table 1), megatron-bridge-fp8 "
             "(Megatron-Bridge 25.11 FP8 on H100/GB200, each on its own preset), torchtitan-fsdp2 (torchtitan's "
             "FSDP2 runs on A100 and Grand Teton H100), pytorch-fsdp (IBM fms-fsdp's FSDP runs of Llama 2), "
             "megatron-bridge-moe (Megatron-Bridge 25.11 Qwen3 MoE), deepspeed-zero-offload (DeepSpeed's "
             "ZeRO-Offload tutorial run, Adam on the CPU, one V100 of a DGX-2) or all.")] = "megatron-a100",
) -> None:
    """Predict published runs (by default Korthikanti et al. 2022 Table 5 and SC21 Table 1, 1.7B-18.4B) and print
    the error per family; then each held-out family (DeepSpeed ZeRO-3, SC21 Table 2), never fitted, with its own."""
    from mcdla.report.llm_validation import HELD_OUT_FAMILIES, family_runs, format_table, summary, validate_llm

    runs = family_runs(family)
    cluster = _cluster(system)
    rows = validate_llm(cluster, runs)
    families = list(dict.fromkeys(r.run.family for r in rows))
    held_out = {name: validate_llm(cluster, runs) for name, runs in HELD_OUT_FAMILIES.items()}

    def as_data(part: list[Any]) -> list[dict[str, Any]]:
        return [{"run": r.run.name, "family": r.run.family, "model": r.run.model, "system": r.run.system,
                 "precision": r.run.precision, "source": r.run.source, "choices": r.run.choices,
                 "measured_s": r.run.measured_s, "predicted_s": r.predicted.iteration_s, "error": r.error,
                 "breakdown": r.predicted.to_dict()} for r in part]

    if as_json:
        data = {"rows": as_data(rows), **summary(rows),
                "families": {f: summary([r for r in rows if r.run.family == f]) for f in families},
                "held_out": {name: {"rows": as_data(part), **summary(part)} for name, part in held_out.items()}}
        print_json(data)
        return
    for f in families:
        part = [r for r in rows if r.run.family == f]
        console.print(format_table(part, f"{f}: LLM time model vs published runs") if len(families) > 1
                      else format_table(part))
    for name, part in held_out.items():
        console.print(format_table(part, title=name))


def _prediction(step: LlmStep, record: Execution, spec: TransformerSpec, *, system: str, gpus_per_node: int, hbm_bytes: float,
                peak_flops_per_s: float, offload_tier: str | None, train_tokens: float | None) -> dict[str, Any]:
    """Everything ``llm-predict`` prints, as plain data (bytes, seconds, FLOP/s): the step, the memory one GPU
    holds by kind, throughput per GPU and the time to train ``train_tokens`` tokens."""
    kinds = {"weights": (step.weight_bytes, step.offloaded_weight_bytes), "gradients": (step.gradient_bytes, 0.0),
             "optimizer_state": (step.optimizer_bytes, step.optimizer_bytes if record.offload_optimizer else 0.0),
             "activations": (step.activation_bytes, step.offloaded_activation_bytes)}
    on_device = {k: b - off for k, (b, off) in kinds.items()}
    offloaded = {k: off for k, (b, off) in kinds.items() if off}
    tokens_per_iteration = record.global_batch * spec.seq_len
    tokens_per_s_per_gpu = tokens_per_iteration / step.iteration_s / record.gpus
    return {
        "model": spec.name, "system": system, "gpus": record.gpus, "gpus_per_node": gpus_per_node,
        "execution": dataclasses.asdict(record), **step.to_dict(),
        "hbm_bytes": hbm_bytes,
        "memory_per_gpu_bytes": {**on_device, "workspace_other": 0.0,
                                 "offloaded": {"second_tier": offloaded} if offloaded else {}},
        "offload_tier": offload_tier,
        "tokens_per_iteration": tokens_per_iteration,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_flops_per_s_per_gpu": step.mfu * peak_flops_per_s,
        "peak_flops_per_s_per_gpu": peak_flops_per_s,
        "train_tokens": train_tokens,
        "time_to_train_s": None if train_tokens is None else train_tokens / (tokens_per_s_per_gpu * record.gpus),
    }


def _engine_fields(spec: TransformerSpec, record: Execution, cluster: Cluster, data: dict[str, Any]) -> dict[str, Any]:
    """The engine run's fields (``--engine``): its iteration replaces the analytical one (kept as
    ``analytical_iteration_s``), with the idle-fabric run and the time lost to contention per link class; the
    throughput figures follow the engine's iteration."""
    from mcdla.sim.llm_lower import engine_step

    run = engine_step(spec, record, cluster)
    ratio = run.analytical.iteration_s / run.iteration_s
    fields: dict[str, Any] = {
        "analytical_iteration_s": run.analytical.iteration_s, "iteration_s": run.iteration_s,
        "idle_iteration_s": run.idle_iteration_s, "contention_s": run.contention_s,
        "contention_by_class_s": dict(run.contention_by_class_s), "mfu": data["mfu"] * ratio,
        "tokens_per_s_per_gpu": data["tokens_per_s_per_gpu"] * ratio,
        "model_flops_per_s_per_gpu": data["model_flops_per_s_per_gpu"] * ratio,
    }
    if data["time_to_train_s"] is not None:
        fields["time_to_train_s"] = data["time_to_train_s"] / ratio
    return fields


def _render(data: dict[str, Any]) -> None:
    """The prediction as three rich tables: time, memory per GPU, throughput."""
    from rich.table import Table

    title = (f"{data['model']} on {data['system']}, {data['gpus']} GPUs: "
             + ("fits" if data["fits"] else "[red]does NOT fit[/red]"))
    console.print(title)
    times = Table(title="iteration", title_justify="left")
    times.add_column("part")
    times.add_column("time", justify="right")
    times.add_column("share", justify="right")
    for key in ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "bubble_s",
                "dp_comm_s", "fsdp_comm_s", "optimizer_s", "offload_s"):
        shown = format_seconds(data[key]) if data[key] else "-"
        times.add_row(key.removesuffix("_s").replace("_", " "), shown, f"{100 * data[key] / data['iteration_s']:.1f}%")
    times.add_row("[b]iteration[/b]", f"[b]{format_seconds(data['iteration_s'])}[/b]", "100%")
    console.print(times)
    if "analytical_iteration_s" in data:
        engine = Table(title="contention-aware engine (the parts above are the closed form's)", title_justify="left")
        engine.add_column("run")
        engine.add_column("time", justify="right")
        engine.add_row("closed form", format_seconds(data["analytical_iteration_s"]))
        engine.add_row("engine, idle fabric", format_seconds(data["idle_iteration_s"]))
        engine.add_row("[b]engine[/b]", f"[b]{format_seconds(data['iteration_s'])}[/b]")
        for cls, seconds in data["contention_by_class_s"].items():
            engine.add_row(f"  lost to contention on {cls}", format_seconds(seconds))
        console.print(engine)
    memory = Table(title="memory per GPU", title_justify="left")
    memory.add_column("kind")
    memory.add_column("on device", justify="right")
    memory.add_column("offloaded", justify="right")
    by_kind = data["memory_per_gpu_bytes"]
    tiers = by_kind["offloaded"]
    for kind, label in (("weights", "weights"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
                        ("activations", "activations"), ("workspace_other", "workspace/other (not modelled)")):
        off = sum(t.get(kind, 0.0) for t in tiers.values())
        memory.add_row(label, format_bytes(by_kind[kind]), format_bytes(off) if off else "-")
    memory.add_row("[b]total[/b]", f"[b]{format_bytes(data['device_bytes'])}[/b] of {format_bytes(data['hbm_bytes'])}",
                   format_bytes(data["offloaded_bytes"]) if data["offloaded_bytes"] else "-")
    console.print(memory)
    if tiers:
        console.print(f"offloaded to the second tier: {data['offload_tier']}", markup=False)
    rate = Table(title="throughput", title_justify="left")
    rate.add_column("measure")
    rate.add_column("value", justify="right")
    rate.add_row("tokens/s per GPU", f"{data['tokens_per_s_per_gpu']:,.0f}")
    rate.add_row("model TFLOP/s per GPU", f"{data['model_flops_per_s_per_gpu'] / 1e12:.1f} of "
                 f"{data['peak_flops_per_s_per_gpu'] / 1e12:.0f} peak")
    rate.add_row("MFU", f"{100 * data['mfu']:.1f}%")
    if data["time_to_train_s"] is not None:
        rate.add_row(f"time to train {format_count(data['train_tokens'])} tokens", format_duration(data["time_to_train_s"]))
    console.print(rate)


@app.command("llm-predict")
def llm_predict_cmd(
    model: Annotated[str, typer.Option(
        help="Transformer preset (e.g. llama3-70b), model file (.yaml/.json) or Hugging Face config.json.")],
    execution: Annotated[Path, typer.Option(help="Execution record (.json/.yaml): tp, pp, dp, batches, ...")],
    system: Annotated[str, typer.Option(help="Hardware preset or generator file (e.g. dgx-h100, gb200-nvl72), "
                                        "sized for the execution's GPUs; default: the validated DGX A100.")] = "dgx-a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
    ranks: Annotated[bool, typer.Option("--ranks", help="Schedule every rank (per-rank engine) instead of the "
                                        "symmetric closed form; needed for --slowdown.")] = False,
    slowdown: Annotated[list[str] | None, typer.Option(
        help="RANK:FACTOR, a straggler whose compute takes FACTOR x as long (repeatable; implies --ranks).")] = None,
    train_tokens: Annotated[str | None, typer.Option(
        help="Also give the time to train this many tokens, e.g. 1T or 300G.")] = None,
    precision: Annotated[str, typer.Option(help="Number format of the GEMMs: bf16, fp8 (Transformer Engine: "
                                           "linear layers in fp8, the rest in bf16), fp16 or fp32.")] = "bf16",
    engine: Annotated[bool, typer.Option("--engine", help="Run the lowered per-rank programs on the contention-aware "
                                         "engine; adds the time lost to contention per link class.")] = False,
) -> None:
    """Predict one iteration of a preset under an execution record: time breakdown, memory per GPU by kind,
    tokens/s per GPU and MFU. A record that does not fit (device memory or the offload tier's share per GPU)
    prints its result and exits with 1."""
    from mcdla.sim import llm_step
    from mcdla.sim.llm import cluster_precision
    from mcdla.workload.execution import load_execution
    from mcdla.workload.model_file import resolve_model

    if not execution.is_file():
        fail(f"--execution: got {str(execution)[:200]!r}; no such file")
    tokens = None if train_tokens is None else parse_count(train_tokens, "--train-tokens")
    if tokens is not None and not 0 < tokens < float("inf"):
        fail(f"--train-tokens: got {brief(train_tokens)}; must be > 0 and finite")
    slow: dict[int, float] = {}
    for item in slowdown or []:
        rank, sep, factor = item.partition(":")
        try:
            slow[int(rank)] = float(factor)
        except ValueError:
            fail(f"--slowdown: got {item[:60]!r}; must be RANK:FACTOR, e.g. 3:2.0")
        if not sep:
            fail(f"--slowdown: got {item[:60]!r}; must be RANK:FACTOR, e.g. 3:2.0")
        if not 0 < slow[int(rank)] <= MAX_SLOWDOWN:
            fail(f"--slowdown: got {item[:60]!r}; FACTOR must be > 0 and <= {MAX_SLOWDOWN:.0f}")
    options = {"slowdown": slow} if slow else {}
    record = load_execution(execution)
    spec = resolve_model(model)
    base = _cluster(system)
    base.nodes_for(record.gpus, field="execution.gpus")
    cluster = base.for_gpus(record.gpus)
    if engine and (ranks or slow):
        fail("--engine: got it with --ranks/--slowdown; the engine runs the symmetric lowering, use one of them")
    gemm_peak = cluster_precision(cluster, precision).gemm_peak
    step = llm_step(spec, record, cluster, mode="ranks" if ranks or slow else "fast", precision=precision, **options)
    data = _prediction(step, record, spec, system=cluster.name, gpus_per_node=cluster.gpus_per_node,
                       hbm_bytes=cluster.device.hbm_bytes,
                       peak_flops_per_s=cluster.device.flops_per_s(gemm_peak),
                       offload_tier=(cluster.nvme.source if record.offload_tier == "nvme" and cluster.nvme is not None
                                     else cluster.pool_link_for_gpus(record.gpus).source
                                     if cluster.offload is not None else None),
                       train_tokens=tokens)
    if engine:
        data.update(_engine_fields(spec, record, cluster, data))
    check_finite(data, "llm-predict")
    if as_json:
        print_json(data)
    else:
        _render(data)
    if not step.fits:
        if step.device_bytes > cluster.device.hbm_bytes:
            fail(f"does not fit: {format_bytes(step.device_bytes)} per GPU > {format_bytes(cluster.device.hbm_bytes)} "
                 "of device memory", code=1)
        share = cluster.pool_link_for_gpus(record.gpus).pool_bytes if cluster.offload is not None else 0.0
        if record.offload_tier == "nvme" and cluster.nvme is not None:
            drives = cluster.nvme.capacity_bytes / min(record.gpus, cluster.gpus_per_node)
            fail(f"does not fit: {format_bytes(step.offloaded_bytes)} offloaded per GPU > the host pool's "
                 f"{format_bytes(share)} plus the NVMe drives' {format_bytes(drives)} share per GPU", code=1)
        fail(f"does not fit: {format_bytes(step.offloaded_bytes)} offloaded per GPU > {format_bytes(share)} "
             "of the offload tier's share per GPU", code=1)
