"""``mcdla validate-llm`` (predicted vs measured published Megatron runs) and ``mcdla llm-predict`` (one model
under one execution record on a hardware preset, by default the validated ``dgx-a100``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mcdla.cli._app import app, fail


@app.command("validate-llm")
def validate_llm_cmd(
    system: Annotated[str, typer.Option(
        help="Hardware preset or generator file the runs are predicted on.")] = "dgx-a100",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and the summary as JSON.")] = False,
) -> None:
    """Predict Korthikanti et al. 2022 Table 5 and SC21 Table 1 (1.7B-18.4B) and print the error."""
    from mcdla.report.llm_validation import format_table, summary, validate_llm

    rows = validate_llm(system)
    if as_json:
        data = {"rows": [{"run": r.run.name, "model": r.run.model, "source": r.run.source,
                          "measured_s": r.run.measured_s, "predicted_s": r.predicted.iteration_s, "error": r.error,
                          "breakdown": r.predicted.to_dict()} for r in rows],
                **summary(rows)}
        print(json.dumps(data, indent=2, allow_nan=False))
        return
    print(format_table(rows))


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
    engine: Annotated[bool, typer.Option("--engine", help="Run the lowered per-rank programs on the contention-aware "
                                         "engine; adds the time lost to contention per link class.")] = False,
) -> None:
    """Predict one iteration of a preset under an execution record, with its breakdown."""
    from mcdla.hardware.cluster import load_cluster
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
    cluster = load_cluster(system).for_gpus(record.gpus)
    if engine and (ranks or slow):
        fail("--engine: got it with --ranks/--slowdown; the engine runs the symmetric lowering, use one of them")
    if engine:
        from mcdla.sim.llm_lower import engine_step

        run = engine_step(preset(model), record, cluster)
        data = {**run.analytical.to_dict(), "analytical_iteration_s": run.analytical.iteration_s,
                "iteration_s": run.iteration_s, "idle_iteration_s": run.idle_iteration_s,
                "contention_s": run.contention_s, "mfu": run.analytical.mfu * run.analytical.iteration_s / run.iteration_s,
                **{f"contention_{cls}_s": sec for cls, sec in run.contention_by_class_s.items()}}
        if as_json:
            data["contention_by_class_s"] = run.contention_by_class_s
    else:
        data = llm_step(preset(model), record, cluster, mode="ranks" if ranks or slow else "fast", **options).to_dict()
    if as_json:
        print(json.dumps(data, indent=2, allow_nan=False))
        return
    for key, value in data.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"{key:<22} {shown}")
