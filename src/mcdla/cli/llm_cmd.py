"""``mcdla validate-llm`` (predicted vs measured published Megatron runs) and ``mcdla llm-predict`` (one model
under one execution record, on the validated DGX A100 figures or on a hardware preset)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mcdla.cli._app import app, check_finite, fail, print_json

#: Largest --slowdown factor: a rank a million times slower than its peers is a dead rank, not a straggler.
MAX_SLOWDOWN = 1e6


@app.command("validate-llm")
def validate_llm_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and the summary as JSON.")] = False,
) -> None:
    """Predict Korthikanti et al. 2022 Table 5 and SC21 Table 1 (1.7B-18.4B) and print the error."""
    from mcdla.report.llm_validation import format_table, summary, validate_llm

    rows = validate_llm()
    if as_json:
        data = {"rows": [{"run": r.run.name, "model": r.run.model, "source": r.run.source,
                          "measured_s": r.run.measured_s, "predicted_s": r.predicted.iteration_s, "error": r.error,
                          "breakdown": r.predicted.to_dict()} for r in rows],
                **summary(rows)}
        print_json(data)
        return
    print(format_table(rows))


@app.command("llm-predict")
def llm_predict_cmd(
    model: Annotated[str, typer.Option(help="Transformer preset, e.g. gpt3-175b or llama3-70b.")],
    execution: Annotated[Path, typer.Option(help="Execution record (.json/.yaml): tp, pp, dp, batches, ...")],
    system: Annotated[str | None, typer.Option(help="Hardware preset or file (e.g. dgx-h100, gb200-nvl72), sized "
                                               "for the execution's GPUs; default: the validated DGX A100.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
    ranks: Annotated[bool, typer.Option("--ranks", help="Schedule every rank (per-rank engine) instead of the "
                                        "symmetric closed form; needed for --slowdown.")] = False,
    slowdown: Annotated[list[str] | None, typer.Option(
        help="RANK:FACTOR, a straggler whose compute takes FACTOR x as long (repeatable; implies --ranks).")] = None,
) -> None:
    """Predict one iteration of a preset under an execution record, with its breakdown."""
    from mcdla.report.llm_validation import dgx_a100_cluster
    from mcdla.sim.llm import llm_step
    from mcdla.sim.llm_systems import llm_system
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
        if not 0 < slow[int(rank)] <= MAX_SLOWDOWN:
            fail(f"--slowdown: got {item[:60]!r}; FACTOR must be > 0 and <= {MAX_SLOWDOWN:.0f}")
    options = {"slowdown": slow} if slow else {}
    record = load_execution(execution)
    cluster = dgx_a100_cluster() if system is None else llm_system(system, gpus=record.gpus).cluster
    step = llm_step(preset(model), record, cluster, mode="ranks" if ranks or slow else "fast", **options)
    data = step.to_dict()
    check_finite(data, "llm-predict")
    if as_json:
        print_json(data)
        return
    for key, value in data.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"{key:<16} {shown}")
