"""Host models of the MoE family's alltoall rows, measured and not adopted (``docs/llm.md`` "Megatron-Bridge MoE").

Three checks on the rows Megatron-Core's ``MoEAlltoAllTokenDispatcher`` runs (``dgx-h100`` and ``b200``):

* ``host_call_time`` fitted on these Xeon rows alone (10 us grid 0-400 us, least RMS relative error), left out one
  row at a time, and the figure at which each row alone is met (bisection);
* a two-stream timeline of the combined 1F1B schedule of the two ``moe_a2a_overlap`` rows, in the order
  ``TransformerLayerSchedulePlan.run`` (Megatron-Core 0.15,
  ``megatron/core/models/common/model_chunk_schedule_plan.py``) issues one layer's forward of one micro-batch and backward of another, the host held at the forward's dispatch
  until the attention and router are done (the dispatcher's ``before_ep_alltoall`` sync); GPU times are the
  model's (host time 0), the host's the preset's ``host_call_time`` per launch of the grouped GEMMs' loop
  (``grouped_gemm_launches``, the backward's split evenly between the data and the weight gradients) and of the
  ungraphed norm, router and preprocess (``router_preprocess_launches``, before the attention's forward and
  backward);
* those rows' predictions with the EP all-to-alls hidden (as the two streams hide them) and one pipeline send
  exposed per slot (the combined schedule's backward starts with the gradient the next stage sends after its
  slot). Run::

    .venv/bin/python -m benchmarks.bench_moe_host_models               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_moe_host_models --no-record   # print only
"""

from __future__ import annotations

import argparse

from benchmarks._results import markdown_table, record
from mcdla.hardware.cluster import Cluster, cluster_from_dict
from mcdla.report.llm_records import MeasuredRun
from mcdla.report.llm_validation import run_cluster
from mcdla.report.llm_validation_runs import BRIDGE_MOE_RUNS
from mcdla.sim.llm import cluster_precision, llm_step, stage_costs
from mcdla.sim.llm_moe import (expert_gemm_width, grouped_gemm_launches, routed_expert_flops,
                               router_preprocess_launches, tokens_per_local_expert)
from mcdla.workload.transformer import preset

ALLTOALL = tuple(r for r in BRIDGE_MOE_RUNS if not r.system.startswith("gb"))
"""The rows run with the alltoall dispatcher (the H100 and B200 configs set no flex backend)."""
A2A_OVERLAP = tuple(r for r in ALLTOALL if r.execution.virtual_stages > 1)
"""The two of them whose configs set ``moe_a2a_overlap`` (H100 30B, B200 235B; both interleaved)."""
GRID = tuple(i * 10e-6 for i in range(41))


def _cluster(run: MeasuredRun, call_s: float) -> Cluster:
    c = cluster_from_dict({"format": "mcdla-system/1", "extends": run.system, "name": run.system,
                           "node": {"gpu": {"host_call_time": call_s}}}, "bench")
    return (c.with_gpus_per_node(run.gpus_per_node) if run.gpus_per_node else c).for_gpus(run.execution.gpus)


def _error(run: MeasuredRun, call_s: float) -> float:
    step = llm_step(preset(run.model), run.execution, _cluster(run, call_s), precision=run.precision)
    return step.iteration_s / run.measured_s - 1


def fit() -> list[tuple[str, ...]]:
    """The Xeon-only grid fit, its leave-one-out and each row's break-even figure."""
    errors = {r.name: [_error(r, c) for c in GRID] for r in ALLTOALL}

    def best(names: list[str]) -> int:
        return min(range(len(GRID)), key=lambda k: sum(errors[n][k] ** 2 for n in names))

    k = best(list(errors))
    rows = [("all three", f"{GRID[k] * 1e6:.0f}", ", ".join(f"{errors[n][k]:+.1%}" for n in errors), "")]
    for run in ALLTOALL:
        out = run.name
        k = best([n for n in errors if n != out])
        lo, hi = 0.0, GRID[-1]
        for _ in range(30):  # the error grows with the figure
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _error(run, mid) < 0 else (lo, mid)
        rows.append((f"without {out}", f"{GRID[k] * 1e6:.0f}", f"{out}: {errors[out][k]:+.1%}",
                     f"{lo * 1e6:.0f} us"))
    return rows


def combined_layer_s(run: MeasuredRun, layers: int = 40) -> tuple[float, float, float]:
    """Per layer and micro-batch: the timeline of the combined schedule, the model's own figure and the measured
    step over ``m x layers per stage`` (seconds)."""
    spec, e = preset(run.model), run.execution
    plain = _cluster(run, 0.0)
    sc = stage_costs(spec, e, plain, precision=run.precision)
    prec = cluster_precision(plain, run.precision)
    curve = plain.gemm_efficiency
    peak = plain.device.flops_per_s(prec.gemm_peak) * (curve.fp8_fraction if prec.fp8 else 1.0)
    expert = routed_expert_flops(spec, e) / (e.tp * e.cp) / (
        peak * curve.at(expert_gemm_width(spec, e), tokens=tokens_per_local_expert(spec, e)))
    launch_s = run_cluster(run, None).device.host_call_s
    fwd_launches, bwd_launches = grouped_gemm_launches(spec, e, prec.fp8)
    host_f, host_dgrad = fwd_launches * launch_s, bwd_launches * launch_s / 2
    route_f, route_b = (n * launch_s for n in router_preprocess_launches(e))
    a2a, attn_f, attn_b = sc.layer_ep_fwd_s / 2, sc.layer_fwd_s - expert, sc.layer_bwd_s - 2 * expert
    host, free, done = 0.0, {"comp": 0.0, "comm": 0.0}, {}

    def op(name: str, stream: str, host_s: float, gpu_s: float, after: str = "") -> None:
        nonlocal host
        host += host_s
        start = max(host, free[stream], done.get(after, 0.0))
        done[name] = free[stream] = start + gpu_s

    ends = []
    for i in range(layers):  # TransformerLayerSchedulePlan.run, forward layer i beside a backward layer
        op(f"bcomb{i}", "comm", 0.0, a2a, f"bdisp{i - 1}")
        op(f"fattn{i}", "comp", route_f, attn_f, f"fcomb{i - 1}")  # attention, router, preprocess, permute
        op(f"bdgrad{i}", "comp", host_dgrad, expert, f"bcomb{i}")
        host = max(host, done[f"fattn{i}"])  # cuda_sync_point before_ep_alltoall
        op(f"fdisp{i}", "comm", 0.0, a2a, f"fattn{i}")
        op(f"bwgrad{i}", "comp", host_dgrad, expert)
        op(f"bdisp{i}", "comm", 0.0, a2a, f"bdgrad{i}")
        op(f"fmlp{i}", "comp", host_f, expert, f"fdisp{i}")
        op(f"fcomb{i}", "comm", 0.0, a2a, f"fmlp{i}")
        op(f"battn{i}", "comp", route_b, attn_b, f"bdisp{i}")
        ends.append(max(free.values()))
    hosted = stage_costs(spec, e, run_cluster(run, None), precision=run.precision)
    model = hosted.layer_fwd_s + hosted.layer_bwd_s + hosted.layer_ep_fwd_s + hosted.layer_ep_bwd_s
    m = e.global_batch // (e.micro_batch * e.dp)
    half = layers // 2
    return (ends[-1] - ends[half]) / (layers - 1 - half), model, run.measured_s / (m * sc.layers_per_stage)


def hidden_ep(run: MeasuredRun) -> tuple[float, float, float]:
    """The row's prediction, without its EP time, and that plus one exposed pipeline send per slot (seconds)."""
    spec, e, cluster = preset(run.model), run.execution, run_cluster(run, None)
    step = llm_step(spec, e, cluster, precision=run.precision)
    sc = stage_costs(spec, e, cluster, precision=run.precision)
    slots = e.global_batch // (e.micro_batch * e.dp) * e.virtual_stages
    without = step.iteration_s - step.ep_comm_s
    return step.iteration_s, without, without + slots * sc.p2p_hidden_s


def report() -> str:
    parts = ["Xeon-only `host_call_time` (10 us grid 0-400 us, least RMS; break-even: the figure at which the "
             "left-out row alone is met):", "",
             markdown_table(("fitted on", "us", "errors (of the left-out row)", "left-out row's break-even"), fit()),
             "", "Combined 1F1B timeline per layer and micro-batch (ms):", ""]
    rows = []
    for r in A2A_OVERLAP:
        line, model, measured = combined_layer_s(r)
        pred, without, exposed = hidden_ep(r)
        rows.append((r.name, f"{line * 1e3:.1f}", f"{model * 1e3:.1f}", f"{measured * 1e3:.1f}",
                     f"{pred:.2f} / {without:.2f} / {exposed:.2f}", f"{r.measured_s:.2f}"))
    parts.append(markdown_table(("run", "timeline", "model", "measured", "predicted s: as is / EP hidden / "
                                 "+ one send a slot", "measured s"), rows))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Print only; leave RESULTS.md alone.")
    args = parser.parse_args(argv)
    text = report()
    print(text)
    if not args.no_record:
        record("moe-host-models", "Host models of the MoE family's alltoall rows (measured, not adopted)",
               ".venv/bin/python -m benchmarks.bench_moe_host_models", text)


if __name__ == "__main__":
    main()
