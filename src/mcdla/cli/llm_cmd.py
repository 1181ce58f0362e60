"""``mcdla validate-llm`` (predicted vs measured published Megatron runs) and ``mcdla llm-predict`` (one model
under one execution record on a hardware preset, by default the validated ``dgx-a100``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mcdla.cli._app import app, fail
from mcdla.errors import HardwareError

if TYPE_CHECKING:
    from mcdla.hardware.cluster import Cluster

__all__ = ["llm_predict_cmd", "validate_llm_cmd"]


def _cluster(system: str) -> Cluster:
    """The ``--system`` preset or file as a generated cluster; a bad one fails naming the option."""
    from mcdla.hardware.cluster import load_cluster

    try:
        return load_cluster(system)
    except HardwareError as exc:
        fail(f"--system: {exc}")


@app.command("validate-llm")
def validate_llm_cmd(
    system: Annotated[str, typer.Option(
        help="Hardware preset or generator file the A100 runs are predicted on.")] = "dgx-a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and the summary as JSON.")] = False,
    family: Annotated[str, typer.Option(
        help="Published runs: megatron-a100 (Korthikanti Table 5, SC21 Table 1), megatron-bridge-fp8 "
             "(Megatron-Bridge 25.11 FP8 on H100/GB200, each on its own preset) or all.")] = "megatron-a100",
) -> None:
    """Predict published runs (by default Korthikanti et al. 2022 Table 5 and SC21 Table 1, 1.7B-18.4B) and print
    the error per family."""
    from mcdla.report.llm_validation import family_runs, format_table, summary, validate_llm

    runs = family_runs(family)
    rows = validate_llm(_cluster(system), runs)
    families = list(dict.fromkeys(r.run.family for r in rows))
    if as_json:
        data = {"rows": [{"run": r.run.name, "family": r.run.family, "model": r.run.model, "system": r.run.system,
                          "precision": r.run.precision, "source": r.run.source, "choices": r.run.choices,
                          "measured_s": r.run.measured_s, "predicted_s": r.predicted.iteration_s, "error": r.error,
                          "breakdown": r.predicted.to_dict()} for r in rows],
                **summary(rows),
                "families": {f: summary([r for r in rows if r.run.family == f]) for f in families}}
        print(json.dumps(data, indent=2, allow_nan=False))
        return
    print("\n\n".join(f"{f}\n{format_table([r for r in rows if r.run.family == f])}" if len(families) > 1
                      else format_table(rows) for f in families))


@app.command("llm-predict")
def llm_predict_cmd(
    model: Annotated[str, typer.Option(help="Transformer preset, e.g. gpt3-175b or llama3-70b.")],
    execution: Annotated[Path, typer.Option(help="Execution record (.json/.yaml): tp, pp, dp, batches, ...")],
    system: Annotated[str, typer.Option(help="Hardware preset or generator file (e.g. dgx-h100, gb200-nvl72), "
                                        "sized for the execution's GPUs; default: the validated DGX A100.")] = "dgx-a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
    ranks: Annotated[bool, typer.Option("--ranks", help="Schedule every rank (per-rank engine) instead of the "
                                        "symmetric closed form; needed for --slowdown.")] = False,
    slowdown: Annotated[list[str] | None, typer.Option(
        help="RANK:FACTOR, a straggler whose compute takes FACTOR x as long (repeatable; implies --ranks).")] = None,
    precision: Annotated[str, typer.Option(help="Number format of the GEMMs: bf16, fp8 (Transformer Engine: "
                                           "linear layers in fp8, the rest in bf16), fp16 or fp32.")] = "bf16",
) -> None:
    """Predict one iteration of a preset under an execution record, with its breakdown."""
    from mcdla.sim import llm_step
    from mcdla.workload.execution import load_execution
    from mcdla.workload.transformer import preset

    if not execution.is_file():
        fail(f"--execution: got {str(execution)[:200]!r}; no such file")
    slow: dict[int, float] = {}
    for item in slowdown or []:
        rank, sep, factor = item.partition(":")
        try:
            slow[int(rank)] = float(factor)
        except ValueError:
            fail(f"--slowdown: got {item[:60]!r}; must be RANK:FACTOR, e.g. 3:2.0")
        if not sep:
            fail(f"--slowdown: got {item[:60]!r}; must be RANK:FACTOR, e.g. 3:2.0")
    options = {"slowdown": slow} if slow else {}
    record = load_execution(execution)
    cluster = _cluster(system).for_gpus(record.gpus)
    step = llm_step(preset(model), record, cluster, mode="ranks" if ranks or slow else "fast", precision=precision,
                    **options)
    data = step.to_dict()
    if as_json:
        print(json.dumps(data, indent=2, allow_nan=False))
        return
    for key, value in data.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"{key:<16} {shown}")
