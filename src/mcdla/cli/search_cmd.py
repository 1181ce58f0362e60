"""``mcdla search``: every valid TP/PP/DP/CP/micro-batch/recompute/ZeRO/offload configuration of an LLM on a
system, predicted by the fast LLM time model, best by iteration time under the memory limits."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from mcdla._io_safety import atomic_output
from mcdla.cli._app import app, check_budget, check_finite, check_output, console, fail, print_json
from mcdla.errors import brief

__all__ = ["MAX_TOP", "search_cmd"]

MAX_TOP = 1000
"""Most rows --top shows (the table renders ~1,000 rows in a few seconds; --out holds every row)."""


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        fail(f"{option}: got {brief(text)}; must be a comma-separated list of integers >= 1, e.g. 1,2,4")
    if not values or any(v < 1 for v in values):
        fail(f"{option}: got {brief(text)}; must be a comma-separated list of integers >= 1, e.g. 1,2,4")
    return values


def _count_list(text: str | None, option: str) -> list[int | None] | None:
    """A comma list of layer counts (integers >= 0, or ``all`` for every layer; None: not asked), else one line."""
    if text is None:
        return None
    values: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            values.append(None)
        elif part.isdigit() and int(part) <= 2**31 - 1:
            values.append(int(part))
        else:
            fail(f"{option}: got {brief(text)}; must be a comma-separated list of layer counts (integers >= 0) "
                 "or all, e.g. all,2,4")
    return values


def _choice_list(text: str | None, option: str, allowed: tuple[str, ...]) -> list[str] | None:
    """A comma list of names from ``allowed`` (None: no constraint), else one line naming ``option``."""
    if text is None:
        return None
    values = [part.strip() for part in text.split(",")]
    if not values or any(v not in allowed for v in values):
        fail(f"{option}: got {brief(text)}; must be a comma-separated list of {', '.join(allowed)}")
    return values


def _offload_tag(e: Any) -> str:
    """``act+wts+opt`` for what is offloaded, ``:N`` when only N layers of each model chunk offload theirs."""
    tags = [name for name, on in (("act", e.offload_activations), ("wts", e.offload_weights),
                                  ("opt", e.offload_optimizer)) if on]
    count = "" if e.offload_num_layers is None else f":{e.offload_num_layers}"
    return "+".join(tags) + count if tags else "-"


def _recompute_tag(e: Any) -> str:
    """The recompute choice, with ``block N`` / ``uniform N`` when a layer count is given."""
    n = e.recompute_num_layers
    return e.recompute if n is None else f"{e.recompute} {e.recompute_method} {n}"


@dataclasses.dataclass
class _EvaluatedCounter:
    """``search``'s callbacks (the enumeration once, then batches of evaluated configurations) as the
    ``on_progress(done, total, what)`` calls that :func:`mcdla.profile.progress.progress_bar` draws."""

    on_progress: Callable[[int, int, str], None]
    total: int = 0
    done: int = 0

    def enumerated(self, enumeration: Any) -> None:
        self.total, self.done = enumeration.valid, 0
        self.on_progress(0, self.total, "evaluating")

    def advance(self, evaluated: int) -> None:
        self.done += evaluated
        self.on_progress(self.done, self.total, "evaluating")


def _rejected_table(rejected: Mapping[str, int]) -> Table:
    """The rejected candidates, one row per reason with its count (right-aligned), most frequent first."""
    table = Table(title="rejected candidates", title_justify="left")
    table.add_column("count", justify="right")
    table.add_column("reason")
    for reason, count in sorted(rejected.items(), key=lambda kv: -kv[1]):
        table.add_row(str(count), Text(reason))
    return table


def _tokens_per_s_per_gpu(row: Any, seq_len: int) -> float:
    e = row.execution
    return e.global_batch * seq_len / row.step.iteration_s / e.gpus


def _row_dict(row: Any, seq_len: int, train_tokens: float | None) -> dict[str, Any]:
    """One ranked row as data: its batch, the execution, the prediction, tokens/s per GPU, MFU and the time to
    train ``train_tokens`` tokens (None without)."""
    rate = _tokens_per_s_per_gpu(row, seq_len)
    return {"index": row.index, "global_batch": row.execution.global_batch,
            "execution": dataclasses.asdict(row.execution), "prediction": row.step.to_dict(), "fits": row.fits,
            "tokens_per_s_per_gpu": rate, "mfu": row.step.mfu,
            "time_to_train_s": None if train_tokens is None else train_tokens / (rate * row.execution.gpus)}


def _csv_header() -> list[str]:
    from mcdla.plan.llm_search import EXECUTION_FIELDS, STEP_FIELDS

    return ["index", *EXECUTION_FIELDS, *(f"pred_{n}" for n in STEP_FIELDS), "fits_limits"]


def _csv_row(r: Any) -> list[Any]:
    from mcdla.plan.llm_search import EXECUTION_FIELDS, STEP_FIELDS

    fields = (getattr(r.execution, n) for n in EXECUTION_FIELDS)  # recompute_modules as "core_attn,mla_up_proj"
    return [r.index, *(",".join(v) if isinstance(v, tuple) else v for v in fields),
            *(getattr(r.step, n) for n in STEP_FIELDS), r.fits]


@contextlib.contextmanager
def _as_option(field: str, option: str) -> Any:
    """A ConfigError about the search argument ``field`` becomes one line naming the CLI ``option``."""
    from mcdla.errors import ConfigError

    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        if not text.startswith(f"{field}:"):
            raise
        fail(option + text.removeprefix(field))


@contextlib.contextmanager
def _writing(path: Path) -> Any:
    """``atomic_output(path)``, an OS error (a full disk) becoming one line naming --out."""
    try:
        with atomic_output(path) as f:
            yield f
    except OSError as exc:
        fail(f"--out: got {brief(str(path), 200)}; cannot write it ({exc.strerror or type(exc).__name__})")


def _ranked_table(rows: list[Any], fitting: int, seq_len: int, train_tokens: float | None) -> Table:
    """The ranked rows (most tokens/s per GPU first) with their batch, rate, MFU and time to train."""
    from mcdla.units import format_count, format_duration
    from mcdla.units import format_bytes

    table = Table(title=f"fastest {len(rows)} of {fitting} that fit (by tokens/s per GPU)")
    columns = ["#", "batch", "time s", "tok/s/GPU", "MFU", *(["train " + format_count(train_tokens)] if train_tokens else []),
               "device mem", "tp", "pp", "v", "dp", "cp", "ep", "mb", "SP", "ZeRO", "recompute", "offload"]
    for column in columns:
        table.add_column(column, justify="right" if column not in ("recompute", "offload", "SP") else "left")
    for i, r in enumerate(rows, 1):
        e, s = r.execution, r.step
        rate = _tokens_per_s_per_gpu(r, seq_len)
        train = [format_duration(train_tokens / (rate * e.gpus))] if train_tokens else []
        table.add_row(str(i), str(e.global_batch), f"{s.iteration_s:.3f}", f"{rate:,.0f}", f"{100 * s.mfu:.1f}%",
                      *train, format_bytes(s.device_bytes), str(e.tp), str(e.pp), str(e.virtual_stages), str(e.dp),
                      str(e.cp), str(e.ep), str(e.micro_batch), "on" if e.sequence_parallel else "-", str(e.zero),
                      _recompute_tag(e), _offload_tag(e))
    return table


def _export(execution: Any, spec: Any, precision: str, megatron: Path | None, torchtitan: Path | None) -> None:
    """Write the winner as Megatron-LM arguments and a torchtitan TOML (mcdla.report.export_config)."""
    from mcdla.report.export_config import megatron_file, torchtitan_toml

    for path, option, text in ((megatron, "--export-megatron", megatron_file),
                               (torchtitan, "--export-torchtitan", torchtitan_toml)):
        if path is None:
            continue
        try:
            with atomic_output(path) as f:
                f.write(text(execution, spec, precision))
        except OSError as exc:
            fail(f"{option}: got {brief(str(path), 200)}; cannot write it ({exc.strerror or type(exc).__name__})")


@app.command("search")
def search_cmd(
    model: Annotated[str, typer.Option(
        help="Transformer preset (e.g. llama3-70b), model file (.yaml/.json) or Hugging Face config.json.")],
    system: Annotated[str, typer.Option(help="Generated system preset (dgx-a100, dgx-h100, gb200-nvl72, ...) or file.")],
    gpus: Annotated[int, typer.Option(help="GPUs in total (any count; the last node may be partly used).")],
    global_batch: Annotated[str, typer.Option(
        help="Samples per iteration over all data-parallel replicas; a comma list searches each "
             "(e.g. 512,1024,1536) and ranks all by tokens/s per GPU.")],
    seq: Annotated[Optional[int], typer.Option(help="Sequence length (default: the model's).")] = None,
    cp: Annotated[str, typer.Option(help="Context-parallel degrees to try, comma-separated.")] = "1",
    ep: Annotated[str, typer.Option(help="Expert-parallel degrees to try (MoE models), comma-separated.")] = "1",
    tp: Annotated[Optional[str], typer.Option(
        help="Tensor-parallel degrees to try, e.g. 8 or 4,8 (default: all).")] = None,
    pp: Annotated[Optional[str], typer.Option(help="Pipeline depths to try, e.g. 1,2,4 (default: all).")] = None,
    micro_batch: Annotated[Optional[str], typer.Option(help="Micro-batch sizes to try, e.g. 1 (default: all).")] = None,
    zero: Annotated[Optional[str], typer.Option(help="ZeRO stages to try, of 0,1,2,3 (default: all).")] = None,
    recompute: Annotated[Optional[str], typer.Option(
        help="Recompute choices to try, of none,selective,selective-op,full (default: none,selective,full).")] = None,
    recompute_layers: Annotated[Optional[str], typer.Option(
        help="Layer counts per model chunk to try for full recompute (Megatron's block method), comma-separated, "
             "all = every layer (default: all).")] = None,
    offload_layers: Annotated[Optional[str], typer.Option(
        help="Layer counts per model chunk to try for activation/weight offload, comma-separated, all = every "
             "layer (default: all).")] = None,
    train_tokens: Annotated[Optional[str], typer.Option(
        help="Report the time to train this many tokens per row (e.g. 1T, 300G, 2e12).")] = None,
    export_megatron: Annotated[Optional[Path], typer.Option(
        help="Write the best configuration as Megatron-LM command-line arguments to this file.")] = None,
    export_torchtitan: Annotated[Optional[Path], typer.Option(
        help="Write the best configuration as a torchtitan v0.2 job TOML (its --job.config_file) to this file.")] = None,
    max_virtual_stages: Annotated[Optional[int], typer.Option(
        help="Largest interleaving (virtual stages per pipeline rank) to try (default: any divisor of the layers).")] = None,
    offload: Annotated[bool, typer.Option("--offload/--no-offload", help="Try offloading activations, weights "
                                          "and optimizer state to the system's second tier.")] = True,
    dp_overlap: Annotated[bool, typer.Option("--dp-overlap", help="Overlap the gradient reduction with backward.")] = False,
    tiers: Annotated[str, typer.Option(help="Tiers to try for offloaded weights and optimizer state, comma-separated: "
                                            "host, nvme (ZeRO-Infinity; needs node.nvme).")] = "host",
    cpu_optimizer: Annotated[bool, typer.Option("--cpu-optimizer", help="Also try Adam on the CPU (ZeRO-Offload) "
                                                "wherever optimizer state is offloaded.")] = False,
    memory_limit: Annotated[Optional[str], typer.Option(
        help="Device memory a rank may use, with a unit (e.g. 70GiB; default: the GPU's HBM).")] = None,
    top: Annotated[int, typer.Option(help=f"Rows of the table (and of --json's top list), at most {MAX_TOP}.")] = 10,
    max_configurations: Annotated[Optional[int], typer.Option(
        help="Most candidate configurations to take on (counted before any is built); more is refused "
             "(default: the search's DEFAULT_MAX_CONFIGURATIONS, 2,000,000).")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes (default: the CPU count); 1 = in-process.")] = None,
    use_ray: Annotated[bool, typer.Option("--ray", help="Evaluate on a Ray cluster (a local one unless --ray-address).")] = False,
    ray_address: Annotated[Optional[str], typer.Option(help="Address of a running Ray cluster (implies --ray).")] = None,
    chunk_size: Annotated[Optional[int], typer.Option(help="Configurations per task (default: automatic).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary and the top rows as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Write every evaluated configuration as CSV.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    precision: Annotated[str, typer.Option(help="Number format of the GEMMs: bf16, fp8, fp16 or fp32.")] = "bf16",
    engine_top: Annotated[Optional[int], typer.Option(
        help="Re-rank the K fastest on the contention-aware engine (llm-predict --engine) and show that ranking.")] = None,
) -> None:
    """Search all valid parallel configurations of a model on a system; print the fastest that fit in memory."""
    from mcdla.hardware.cluster import load_cluster
    from mcdla.plan.llm_search import (DEFAULT_MAX_CONFIGURATIONS, RAY_INSTALL_HINT, RECOMPUTE_CHOICES,
                                       count_candidates, search)
    from mcdla.profile.progress import progress_bar
    from mcdla.report.meta import meta_comment_lines, results_meta
    from mcdla.units import format_bytes, parse_count
    from mcdla.workload.model_file import resolve_model

    batches = _int_list(global_batch, "--global-batch")
    if any(b > 2**31 - 1 for b in batches):
        fail(f"--global-batch: got {brief(global_batch)}; each must be >= 1 and <= {2**31 - 1}")
    batches = list(dict.fromkeys(batches))
    tokens = None if train_tokens is None else parse_count(train_tokens, "--train-tokens")
    if tokens is not None and not 0 < tokens < float("inf"):
        fail(f"--train-tokens: got {brief(train_tokens)}; must be > 0 and finite")
    narrowing: dict[str, Any] = {}
    for option, text, key in (("--tp", tp, "tp"), ("--pp", pp, "pp"), ("--micro-batch", micro_batch, "micro_batch")):
        if text is not None:
            narrowing[key] = _int_list(text, option)
    if zero is not None:
        narrowing["zero"] = [int(z) for z in _choice_list(zero, "--zero", ("0", "1", "2", "3")) or ()]
    if recompute is not None:
        narrowing["recompute"] = _choice_list(recompute, "--recompute", RECOMPUTE_CHOICES)
    for option, text, key in (("--recompute-layers", recompute_layers, "recompute_layers"),
                              ("--offload-layers", offload_layers, "offload_layers")):
        counts = _count_list(text, option)
        if counts is not None:
            narrowing[key] = counts
    for name, value in (("--gpus", gpus), ("--top", top), ("--seq", seq),
                        ("--workers", workers), ("--chunk-size", chunk_size),
                        ("--max-virtual-stages", max_virtual_stages), ("--max-configurations", max_configurations),
                        ("--engine-top", engine_top)):
        if value is not None and not 1 <= value <= 2**31 - 1:
            fail(f"{name}: got {brief(value)}; must be >= 1 and <= {2**31 - 1}")
    if top > MAX_TOP:
        fail(f"--top: got {top}; must be at most {MAX_TOP} (--out writes every configuration)")
    if max_configurations is None:
        max_configurations = DEFAULT_MAX_CONFIGURATIONS
    cp_values = _int_list(cp, "--cp")
    ep_values = _int_list(ep, "--ep")
    check_output(out, "--out")
    check_output(export_megatron, "--export-megatron")
    check_output(export_torchtitan, "--export-torchtitan")
    backend = "ray" if use_ray or ray_address else ("serial" if workers == 1 else "process")
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            fail(f"--ray: the ray package is not installed; install it with {RAY_INSTALL_HINT}")
    spec = resolve_model(model, seq_len=seq)
    cluster = load_cluster(system).generated()
    cluster.nodes_for(gpus, field="--gpus")
    sys_ = cluster.for_gpus(gpus)
    if not offload:
        sys_ = sys_.without_offload()
    device = sys_.device
    limit = check_budget(memory_limit, "--memory-limit", device.hbm_bytes, f"{sys_.name}'s GPU")
    capacity = sys_.offload.pool_bytes if sys_.offload is not None else None

    use_offload = offload and sys_.offload is not None
    tier_space = dict(tiers=tuple(t.strip() for t in tiers.split(",")), cpu_optimizer=(False, True) if cpu_optimizer
                      else (False,))
    space: dict[str, Any] = dict(cp=cp_values, ep=ep_values, max_virtual_stages=max_virtual_stages,
                                 offload=use_offload, **narrowing, **tier_space)
    for batch in batches:
        with _as_option("search.tiers", "--tiers"):
            count = count_candidates(spec, sys_, gpus=gpus, global_batch=batch, **space)
        if count > max_configurations:
            fail(f"--max-configurations: got {max_configurations}, but {spec.name} on {gpus} GPUs with a global "
                 f"batch of {batch} has {count} candidate configurations; raise it to at least {count}, or narrow "
                 "the space (--tp, --pp, --micro-batch, --zero, --recompute, --cp, --ep, --max-virtual-stages, a "
                 "global batch with fewer divisors)")

    meta = results_meta()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        on_row = None
        if out is not None:
            csv_file: IO[str] = stack.enter_context(_writing(out))
            writer = csv.writer(csv_file, lineterminator="\n")
            csv_file.write(meta_comment_lines(meta))
            writer.writerow(_csv_header())
            on_row = lambda row: writer.writerow(_csv_row(row))  # noqa: E731
        counter = _EvaluatedCounter(stack.enter_context(progress_bar("evaluating", enabled=False if quiet else None)))
        stack.enter_context(_as_option("search.ray_address", "--ray-address"))
        results = []
        for batch in batches:
            results.append(search(spec, sys_, gpus=gpus, global_batch=batch, dp_overlap=dp_overlap,
                                  memory_limit_bytes=limit, backend=backend,
                                  workers=workers if workers is not None else os.cpu_count() or 1,
                                  chunk_size=chunk_size, ray_address=ray_address, precision=precision,
                                  max_configurations=max_configurations, top=top, keep_rows=False, on_row=on_row,
                                  on_enumerated=counter.enumerated, progress=counter.advance, **space))
    seconds = time.perf_counter() - started
    # within one batch the fastest iteration has the most tokens/s per GPU; across batches that rate ranks
    ranked = sorted((r for res in results for r in res.ranked), key=lambda r: -_tokens_per_s_per_gpu(r, spec.seq_len))
    best = ranked[0] if ranked else None
    rejected: dict[str, int] = {}
    for res in results:
        for reason, n in res.enumeration.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    candidates = sum(res.enumeration.candidates for res in results)
    valid = sum(res.enumeration.valid for res in results)
    fitting = sum(res.fitting for res in results)
    summary = {
        "meta": meta,
        "model": spec.name, "seq_len": spec.seq_len, "system": sys_.name, "gpus": gpus, "global_batches": batches,
        "memory_limit_bytes": limit, "offload_capacity_bytes": capacity, "backend": backend, "precision": precision,
        "candidates": candidates, "valid": valid, "rejected": rejected, "fitting": fitting, "seconds": seconds,
        "train_tokens": tokens, "ranked_by": "tokens_per_s_per_gpu",
        "best": _row_dict(best, spec.seq_len, tokens) if best is not None else None,
        "per_batch": [{"global_batch": b, "candidates": res.enumeration.candidates, "valid": res.enumeration.valid,
                       "fitting": res.fitting,
                       "best": _row_dict(res.best, spec.seq_len, tokens) if res.best is not None else None}
                      for b, res in zip(batches, results, strict=True)],
        "top": [_row_dict(r, spec.seq_len, tokens) for r in ranked[:top]],
        "results_csv": str(out) if out is not None else None,
    }
    code = 0 if best is not None else 1
    if best is not None:
        _export(best.execution, spec, precision, export_megatron, export_torchtitan)
    reranked = None
    if engine_top is not None and ranked:
        from mcdla.plan.llm_rerank import rerank

        reranked = rerank(spec, sys_, ranked, engine_top)
        summary["engine_top"] = [{**_row_dict(r.row, spec.seq_len, tokens), "analytical_rank": r.analytical_rank,
                                  "engine": r.engine.to_dict()} for r in reranked]
    check_finite(summary, "search")
    if as_json:
        print_json(summary)
        raise typer.Exit(code)
    batch_text = ", ".join(str(b) for b in batches)
    console.print(f"[b]{spec.name}[/b] (seq {spec.seq_len}, global batch {batch_text}) on [b]{sys_.name}[/b], "
                  f"{gpus} GPUs, memory limit {format_bytes(limit)} per GPU")
    console.print(f"  {candidates} candidates: {valid} valid, {candidates - valid} rejected; "
                  f"{fitting} fit in memory; {seconds:.1f} s ({backend})")
    if rejected:
        console.print(_rejected_table(rejected))
    if best is None:
        why = "no valid configuration" if not valid else "no configuration fits in memory"
        least_all = [res.least_device_bytes for res in results if res.least_device_bytes is not None]
        extra = f" (least device memory: {format_bytes(min(least_all))})" if least_all else ""
        console.print(f"[red]{why}[/red]{extra}")
        raise typer.Exit(code)
    console.print(_ranked_table(ranked[:top], fitting, spec.seq_len, tokens))
    if len(batches) > 1:
        for b, res in zip(batches, results, strict=True):
            if res.best is not None:
                rate = _tokens_per_s_per_gpu(res.best, spec.seq_len)
                console.print(f"  best at global batch {b}: {res.best.step.iteration_s:.3f} s, "
                              f"{rate:,.0f} tokens/s per GPU, MFU {100 * res.best.step.mfu:.1f}%")
            else:
                console.print(f"  global batch {b}: no configuration fits")
    for path in (export_megatron, export_torchtitan):
        if path is not None:
            console.print(f"  best configuration written to {path}")
    if reranked is not None:
        again = Table(title=f"the {len(reranked)} fastest re-ranked on the contention-aware engine")
        for column in ("#", "search #", "engine s", "analytical s", "contention s", "by link class", "tp", "pp",
                       "v", "dp", "cp", "ep", "mb", "recompute", "offload"):
            again.add_column(column, justify="left" if column in ("by link class", "recompute", "offload") else "right")
        for i, r in enumerate(reranked, 1):
            e, run = r.row.execution, r.engine
            classes = ", ".join(f"{cls} {sec:.3g}" for cls, sec in run.contention_by_class_s.items()) or "-"
            again.add_row(str(i), str(r.analytical_rank), f"{run.iteration_s:.3f}", f"{r.row.step.iteration_s:.3f}",
                          f"{run.contention_s:.3g}", classes, str(e.tp), str(e.pp), str(e.virtual_stages), str(e.dp),
                          str(e.cp), str(e.ep), str(e.micro_batch), _recompute_tag(e), _offload_tag(e))
        console.print(again)
    if out is not None:
        console.print(f"  all {valid} configurations: {out}")
