"""The modern reproduction: where should the second memory tier of LLM training sit in 2026?

MC-DLA's question asked again at scale: GPT-3 175B and Llama-3 405B trained on a fixed number of GPUs, with
the offload tier behind PCIe 5 (DC-DLA 2026, the device-centric baseline), behind NVLink-C2C (GH200, GB200
NVL72 to their Grace memory), in a CXL pool (DGX H100 + CXL expanders), as MC-DLA-style memory-nodes on the
NVLink5 switch (GB200 NVL72 + memory-nodes, hypothetical), or absent (recompute instead) on the same GPUs.

For each (model, GPU count, system) the configuration search (:func:`mcdla.plan.llm_search.search`, narrowed
to :class:`Grid`) over TP x PP x DP x virtual stages x micro-batch x recomputation x what is offloaded picks
the fastest configuration that fits (:attr:`~mcdla.sim.LlmStep.fits`: per-rank state in HBM, the offloaded part
in the tier's capacity per GPU); the time model is :func:`mcdla.sim.llm_step` on the preset's
:class:`~mcdla.hardware.cluster.Cluster`. ZeRO-1 (Megatron's distributed optimizer), sequence parallelism with
TP, gradient reduction overlapped with the last backward, CP = 1, throughout.

NOTE [modern GPU counts]
1,152 and 4,608 GPUs: whole NVL72 racks (16, 64) and whole DGX H100 nodes (144, 576) at once, so every system
runs on exactly the same number of GPUs with no partial node. With the published global batches (GPT-3 175B
1,536 sequences of 2,048, Brown et al. 2020 Table 2.1; Llama-3 405B 2,048 of 8,192 = 16M tokens, Dubey et al.
2024 sec. 3.4) the factor 9 of these counts must go into PP (or TP) for the batch to split into whole
micro-batches, which is why Llama-3's 126 layers run with PP 9 or 18 here (Meta used 16 with shortened
end stages, which the closed-form model does not represent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.plan.llm_search import SearchResult, search
from mcdla.profile.progress import OnProgress, notify
from mcdla.report.meta import results_meta, write_results_csv, write_results_json
from mcdla.units import format_bytes, format_seconds
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

__all__ = ["Variant", "Scenario", "Grid", "VARIANTS", "SCENARIOS", "FULL_GRID", "SMALL_GRID", "BASELINE",
           "variant_cluster", "search_grid", "run_modern", "write_results", "modern_table", "plot_modern"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """A system: a hardware preset, with or without its second tier."""

    key: str
    preset: str
    offload: bool
    label: str


VARIANTS: tuple[Variant, ...] = (
    Variant(key="dc-dla-2026", preset="dc-dla-2026", offload=True, label="H100, host DDR5 over PCIe5 (DC-DLA 2026)"),
    Variant(key="h100-recompute", preset="dc-dla-2026", offload=False, label="H100, no offload (recompute)"),
    Variant(key="dgx-h100-cxl", preset="dgx-h100-cxl", offload=True, label="H100, DDR5 + CXL pool over PCIe5"),
    Variant(key="gh200", preset="gh200", offload=True, label="GH200, Grace over C2C"),
    Variant(key="dgx-gh200", preset="dgx-gh200", offload=True, label="DGX GH200 (256-GPU NVLink), Grace over C2C"),
    Variant(key="dgx-gh200-recompute", preset="dgx-gh200", offload=False, label="DGX GH200, no offload (recompute)"),
    Variant(key="gb200-nvl72", preset="gb200-nvl72", offload=True, label="GB200 NVL72, Grace over C2C"),
    Variant(key="b200-recompute", preset="gb200-nvl72", offload=False, label="GB200 NVL72, no offload (recompute)"),
    Variant(key="gb200-nvl72-memnode", preset="gb200-nvl72-memnode", offload=True,
            label="GB200 NVL72, memory-nodes on NVLink5 (MC-DLA)"),
)
BASELINE = "dc-dla-2026"


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A model, its global batch (sequences) and the GPUs it trains on (NOTE [modern GPU counts])."""

    model: str
    global_batch: int
    gpus: int


SCENARIOS: tuple[Scenario, ...] = tuple(
    Scenario(model=m, global_batch=b, gpus=n) for m, b in (("gpt3-175b", 1536), ("llama3-405b", 2048))
    for n in (1152, 4608))

_OFFLOADS: tuple[tuple[str, ...], ...] = ((), ("activations",), ("optimizer",), ("activations", "optimizer"),
                                          ("weights", "activations", "optimizer"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """The search space; PP is every divisor of the layers that divides the GPUs (with TP), DP the rest."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    micro_batch: tuple[int, ...] = (1, 2, 4)
    virtual_stages: tuple[int, ...] = (1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    offload: tuple[tuple[str, ...], ...] = _OFFLOADS
    max_pp: int = 128


FULL_GRID = Grid()
SMALL_GRID = Grid(tp=(1, 8), micro_batch=(1,), virtual_stages=(1,), recompute=("selective", "full"),
                  offload=((), ("activations",), ("activations", "optimizer")), max_pp=24)


def variant_cluster(variant: Variant, gpus: int) -> Cluster:
    """The variant's preset sized for ``gpus`` GPUs, without its pool for a no-offload variant."""
    cluster = load_cluster(variant.preset).for_gpus(gpus)
    return cluster if variant.offload else cluster.without_offload()


def search_grid(spec: TransformerSpec, scenario: Scenario, cluster: Cluster, grid: Grid = FULL_GRID) -> SearchResult:
    """The configuration search on ``grid`` (no offload first, so ties go to the simpler configuration)."""
    offloads = [(("activations" in off), ("weights" in off), ("optimizer" in off))
                for off in sorted(grid.offload, key=len)]
    return search(spec, cluster, gpus=scenario.gpus, global_batch=scenario.global_batch, tp=grid.tp,
                  micro_batch=grid.micro_batch, virtual_stages=grid.virtual_stages, recompute=grid.recompute,
                  offloads=offloads, max_pp=grid.max_pp, sequence_parallel=(True,), zero=(1,), dp_overlap=True)


def _offloaded(e: Execution) -> str:
    parts = [n for n, on in (("weights", e.offload_weights), ("activations", e.offload_activations),
                             ("optimizer", e.offload_optimizer)) if on]
    return "+".join(parts) or "none"


def _row(scenario: Scenario, variant: Variant, cluster: Cluster, result: SearchResult) -> dict[str, Any]:
    link = cluster.offload
    row: dict[str, Any] = {
        "model": scenario.model, "gpus": scenario.gpus, "global_batch": scenario.global_batch,
        "system": variant.key, "label": variant.label, "preset": variant.preset,
        "hbm_bytes": cluster.device.hbm_bytes, "offload_bytes_per_s": link.offload_bytes_per_s if link else 0.0,
        "offload_capacity_bytes": link.pool_bytes if link else 0.0,
        "evaluated": len(result.rows), "fitting": result.fitting, "feasible": result.best is not None,
    }
    if result.best is None:
        return row
    e, step = result.best.execution, result.best.step
    row.update({
        "iteration_s": step.iteration_s, "mfu": step.mfu,
        "hbm_used_bytes": step.device_bytes, "offload_used_bytes": step.offloaded_bytes,
        "tp": e.tp, "pp": e.pp, "dp": e.dp, "virtual_stages": e.virtual_stages, "micro_batch": e.micro_batch,
        "recompute": e.recompute, "offloaded": _offloaded(e),
        **{k: getattr(step, k) for k in ("compute_s", "recompute_s", "tp_comm_s", "pp_comm_s", "bubble_s",
                                          "dp_comm_s", "optimizer_s", "offload_s", "contention_s")},
    })
    return row


def run_modern(grid: Grid = FULL_GRID, scenarios: Sequence[Scenario] = SCENARIOS,
               variants: Sequence[Variant] = VARIANTS, on_progress: OnProgress | None = None) -> list[dict[str, Any]]:
    """One row per (scenario, variant): the best configuration and its time, memory and speedup over the
    baseline (DC-DLA 2026, when it is among ``variants`` and feasible); ``on_progress`` hears of each row."""
    rows: list[dict[str, Any]] = []
    total = len(scenarios) * len(variants)
    for sc in scenarios:
        spec = preset(sc.model)
        block = []
        for v in variants:
            notify(on_progress, len(rows) + len(block), total, f"searching: {sc.model} on {v.label}")
            cluster = variant_cluster(v, sc.gpus)
            block.append(_row(sc, v, cluster, search_grid(spec, sc, cluster, grid)))
        base = next((r for r in block if r["system"] == BASELINE and r["feasible"]), None)
        for r in block:
            r["speedup"] = base["iteration_s"] / r["iteration_s"] if base is not None and r["feasible"] else None
        rows += block
    notify(on_progress, total, total, "searching: done")
    return rows


_COLUMNS = ("model", "gpus", "global_batch", "system", "label", "preset", "feasible", "iteration_s", "speedup", "mfu",
            "hbm_used_bytes", "hbm_bytes", "offload_used_bytes", "offload_capacity_bytes", "offload_bytes_per_s",
            "tp", "pp", "dp", "virtual_stages", "micro_batch", "recompute", "offloaded", "compute_s", "recompute_s",
            "tp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "optimizer_s", "offload_s", "contention_s", "evaluated",
            "fitting")


def write_results(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """``results.json`` and ``results.csv`` (one row per model, GPU count and system) in ``out``."""
    meta = results_meta()
    return [write_results_json(out / "results.json", rows, meta),
            write_results_csv(out / "results.csv", rows, _COLUMNS, meta)]


def _config(r: dict[str, Any]) -> str:
    v = f" v{r['virtual_stages']}" if r["virtual_stages"] > 1 else ""
    return f"TP{r['tp']} PP{r['pp']}{v} DP{r['dp']} mb{r['micro_batch']}, {r['recompute']}, off: {r['offloaded']}"


def modern_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The rich table: per model, GPUs and system the best iteration, speedup, MFU, memory per tier, the time
    shared links add (``LlmStep.contention_s``: the offload path also carrying collectives, NOTE [link floor]),
    config."""
    table = Table(title="Modern reproduction: LLM training, best configuration per system", title_justify="left")
    for col in ("model", "GPUs", "system", "iteration", "vs DC-DLA", "MFU", "HBM used", "offload used / cap",
                "offload BW/GPU", "link contention", "best configuration"):
        table.add_column(col, justify="left" if col in ("model", "system", "best configuration") else "right")
    for r in rows:
        cap = format_bytes(r["offload_capacity_bytes"]) if r["offload_capacity_bytes"] else "-"
        bw = f"{r['offload_bytes_per_s'] / 1e9:.0f} GB/s" if r["offload_bytes_per_s"] else "-"
        if not r["feasible"]:
            table.add_row(r["model"], f"{r['gpus']:,}", r["system"], "does not fit", "-", "-", "-", f"- / {cap}", bw, "-",
                          "-")
            continue
        used = format_bytes(r["offload_used_bytes"]) if r["offload_used_bytes"] else "0"
        table.add_row(r["model"], f"{r['gpus']:,}", r["system"], format_seconds(r["iteration_s"]),
                      f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-", f"{100 * r['mfu']:.1f}%",
                      f"{format_bytes(r['hbm_used_bytes'])} / {format_bytes(r['hbm_bytes'])}", f"{used} / {cap}",
                      bw, format_seconds(r["contention_s"]) if r["contention_s"] else "0", _config(r))
    return table


def plot_modern(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Two panels: speedup over DC-DLA 2026 per scenario and system; HBM and offload-tier bytes per GPU with
    each system's HBM capacity marked (:func:`mcdla.report.figures.modern_figure`), saved as a PNG."""
    from mcdla.report.figures import modern_figure, save_figure

    return save_figure(modern_figure(rows), path)
