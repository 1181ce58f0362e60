"""Host models of the MoE family's alltoall rows, measured and not adopted (``docs/llm.md`` "Megatron-Bridge MoE").

Four checks, the first three on the rows Megatron-Core's ``MoEAlltoAllTokenDispatcher`` runs (``dgx-h100`` and
``b200``), the last on the whole family:

* ``host_call_time`` fitted on these Xeon rows alone (10 us grid 0-400 us, least RMS relative error), left out one
  row at a time, and the figure at which each row alone is met (bisection);
* a two-stream timeline of the combined 1F1B schedule of the two ``moe_a2a_overlap`` rows, in the order
  ``TransformerLayerSchedulePlan.run`` (Megatron-Core 0.15,
  ``megatron/core/models/common/model_chunk_schedule_plan.py``) issues one layer's forward of one micro-batch and backward of another, the host held at the forward's dispatch
  until the attention and router are done (the dispatcher's ``before_ep_alltoall`` sync); GPU times are the
  model's (host time 0, the fp8 row padding's with the experts' GEMMs), the host's the preset's ``host_call_time``
  per launch of the grouped GEMMs' loop (``grouped_gemm_launches`` and ``fp8_padding_launches``, the backward's
  split evenly between the data and the weight gradients) and of the
  ungraphed norm, router and preprocess (``router_preprocess_launches``, before the attention's forward and
  backward);
* those rows' predictions with the EP all-to-alls hidden (as the two streams hide them) and one pipeline send
  exposed per slot (the combined schedule's backward starts with the gradient the next stage sends after its
  slot);
* the host synchronisation of every MoE layer's forward on all nine rows of the family (the alltoall dispatcher's
  ``d2h_event.synchronize()`` at ``before_ep_alltoall``, Megatron-LM 0d8e0714
  ``megatron/core/transformer/moe/token_dispatcher.py``; HybridEP's two blocking count copies in dropless mode,
  before its dispatch kernel and after it, deepseek-ai/DeepEP 1dddd19 ``deep_ep/hybrid_ep_buffer.py``
  ``dispatch_with_permute`` and ``csrc/hybrid_ep/executor/executor.cu`` ``dispatch_postprocess``): a timeline of the host issuing each layer's blocks in the code's order onto one stream (two with
  ``moe_a2a_overlap``), the host held at each sync until the GPU has run what it was issued, so it cannot run
  ahead across the sync (:func:`stream_s`, :func:`sync_layer_s`); the family's errors over the ``host_call_time``
  grid with the model's layer replaced by the timeline's; and, for the two Qwen3-30B-A3B alltoall rows, the figure
  per launch at which each row is met with the host's and the GPU's work of a layer overlapped wholly (the
  timeline's lower bound) and not at all (its upper bound). Run::

    .venv/bin/python -m benchmarks.bench_moe_host_models               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_moe_host_models --no-record   # print only
"""

from __future__ import annotations

from benchmarks._results import markdown_table, run_table
from mcdla.hardware.cluster import Cluster, cluster_from_dict
from mcdla.report.llm_records import MeasuredRun
from mcdla.report.llm_validation import run_cluster
from mcdla.report.llm_validation_runs import BRIDGE_MOE_RUNS
from mcdla.sim.llm import StageCosts
from mcdla.sim.llm import cluster_precision, llm_step, stage_costs
from mcdla.sim.llm_moe import (expert_gemm_width, fp8_padding_bytes, fp8_padding_launches, grouped_gemm_launches,
                               routed_expert_flops, router_preprocess_launches, tokens_per_local_expert)
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

ALLTOALL = tuple(r for r in BRIDGE_MOE_RUNS if not r.system.startswith("gb"))
"""The rows run with the alltoall dispatcher (the H100 and B200 configs set no flex backend)."""
A2A_OVERLAP = tuple(r for r in ALLTOALL if r.execution.virtual_stages > 1)
"""The two of them whose configs set ``moe_a2a_overlap`` (H100 30B, B200 235B; both interleaved)."""
GRID = tuple(i * 10e-6 for i in range(41))
SYNC = None
"""A block list's marker of a host synchronisation: the host waits until the GPU has run every block issued."""
Block = tuple[float, float] | None


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
    rows = [(f"all {len(ALLTOALL)}", f"{GRID[k] * 1e6:.0f}", ", ".join(f"{errors[n][k]:+.1%}" for n in errors), "")]
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


def _expert_s(run: MeasuredRun) -> tuple[StageCosts, Cluster, bool, float, float]:
    """The row's stage costs with ``host_call_time`` 0, that cluster, whether it runs fp8, one layer's routed
    expert GEMMs' forward time and its fp8 row padding's forward time (seconds; as long backward)."""
    spec, e = preset(run.model), run.execution
    plain = _cluster(run, 0.0)
    sc = stage_costs(spec, e, plain, precision=run.precision)
    prec = cluster_precision(plain, run.precision)
    curve = plain.gemm_efficiency
    peak = plain.device.flops_per_s(prec.gemm_peak) * (curve.fp8_fraction if prec.fp8 else 1.0)
    expert = routed_expert_flops(spec, e) / (e.tp * e.cp) / (
        peak * curve.at(expert_gemm_width(spec, e), tokens=tokens_per_local_expert(spec, e)))
    pad = fp8_padding_bytes(spec, e, prec.fp8) / (plain.device.hbm_bytes_per_s * plain.device.memory_efficiency)
    return sc, plain, prec.fp8, expert, pad


def _loop_launches(spec: TransformerSpec, e: Execution, fp8: bool) -> tuple[int, int]:
    """Launches of the experts' loop, forward and backward: the grouped GEMMs' and the fp8 row padding's."""
    (gg_f, gg_b), (pad_f, pad_b) = grouped_gemm_launches(spec, e, fp8), fp8_padding_launches(spec, e, fp8)
    return gg_f + pad_f, gg_b + pad_b


def combined_layer_s(run: MeasuredRun, layers: int = 40, call_s: float | None = None,
                     dense: tuple[int, int] = (0, 0), sync: bool = True) -> tuple[float, float, float]:
    """Per layer and micro-batch: the timeline of the combined schedule, the model's own figure and the measured
    step over ``m x layers per stage`` (seconds); the host at ``call_s`` per launch (the preset's
    ``host_call_time`` when None) with ``dense`` (forward, backward) launches of the attention block besides; the
    host held at the dispatch unless ``sync`` is False."""
    spec, e = preset(run.model), run.execution
    sc, _, fp8, gemm, pad = _expert_s(run)
    launch_s = run_cluster(run, None).device.host_call_s if call_s is None else call_s
    fwd_launches, bwd_launches = _loop_launches(spec, e, fp8)
    host_f, host_dgrad = fwd_launches * launch_s, bwd_launches * launch_s / 2
    route_f, route_b = ((n + d) * launch_s for n, d in zip(router_preprocess_launches(e), dense))
    expert, dgrad = gemm + pad, gemm + pad / 2  # the backward's padding split as its launches are
    # the all-to-alls whole: the streams hide them here, not the model's combined share (NOTE [EP overlap])
    a2a = (sc.layer_ep_fwd_s + sc.layer_ep_hidden_fwd_s) / 2
    attn_f, attn_b = sc.layer_fwd_s - expert, sc.layer_bwd_s - 2 * gemm - pad
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
        op(f"bdgrad{i}", "comp", host_dgrad, dgrad, f"bcomb{i}")
        if sync:  # cuda_sync_point before_ep_alltoall
            host = max(host, done[f"fattn{i}"])
        op(f"fdisp{i}", "comm", 0.0, a2a, f"fattn{i}")
        op(f"bwgrad{i}", "comp", host_dgrad, dgrad)
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


def stream_s(blocks: list[Block]) -> float:
    """One CUDA stream fed by one host thread: each block ``(host_s, gpu_s)`` is issued ``host_s`` after the
    host's previous issue and runs once issued and once the stream's previous block is done; at :data:`SYNC` the
    host waits until the stream has run every block issued (the device-to-host copy's event, whose stream waited
    on the compute stream; its round trip, microseconds, is left out). Returns when the last block ends."""
    host = gpu = 0.0
    for block in blocks:
        if block is SYNC:
            host = max(host, gpu)
            continue
        host_s, gpu_s = block
        host += host_s
        gpu = max(host, gpu) + gpu_s
    return max(host, gpu)


def _layer_parts(run: MeasuredRun, call_s: float, dense: tuple[int, int]) -> dict[str, float]:
    """One layer's blocks (seconds): GPU times from the model with ``host_call_time`` 0, host times at ``call_s``
    per launch of the grouped GEMMs' loop, of the ungraphed norm, router and preprocess and of ``dense`` (forward,
    backward) launches of the attention block."""
    spec, e = preset(run.model), run.execution
    sc, plain, fp8, gemm, pad = _expert_s(run)
    gg_f, gg_b = _loop_launches(spec, e, fp8)
    rp_f, rp_b = router_preprocess_launches(e)
    expert, bwd_expert = gemm + pad, plain.gemm_efficiency.backward_ratio * gemm + pad
    return {"attn_f": sc.layer_fwd_s - expert, "attn_b": sc.layer_bwd_s - bwd_expert, "expert_f": expert,
            "expert_b": bwd_expert, "a2a_f": sc.layer_ep_fwd_s / 2, "a2a_b": sc.layer_ep_bwd_s / 2,
            "host_attn_f": (dense[0] + rp_f) * call_s, "host_attn_b": (dense[1] + rp_b) * call_s,
            "host_expert_f": gg_f * call_s, "host_expert_b": gg_b * call_s,
            "gpu": sc.layer_fwd_s + sc.layer_bwd_s + sc.layer_ep_fwd_s + sc.layer_ep_bwd_s}


def sync_layer_s(run: MeasuredRun, call_s: float, dense: tuple[int, int] = (0, 0), repeats: int = 8,
                 sync: bool = True) -> float:
    """Per layer and micro-batch, the host-synchronised timeline's time (seconds). A layer's forward issues the
    attention block and the norm, router and preprocess (the device-to-host copy of the counts), waits at the
    sync, then the dispatch (HybridEP waits again after it), the experts' loop and the combine; its backward the combine's gradient, the experts'
    loop, the dispatch's gradient, then the router, norm and attention block; no sync. The schedule: without
    pipelining (PP 1, ``forward_backward_no_pipelining``) a micro-batch's forward through every layer, then its
    backward; with PP > 1 1F1B's steady state, one chunk's forward, then one chunk's backward; with
    ``moe_a2a_overlap`` the combined schedule's two streams (:func:`combined_layer_s`). ``sync`` False: the host
    never waits (the same blocks)."""
    if run in A2A_OVERLAP:
        return combined_layer_s(run, call_s=call_s, dense=dense, sync=sync)[0]
    p = _layer_parts(run, call_s, dense)
    e = run.execution
    wait = [SYNC] if sync else []
    # HybridEP (dropless) waits twice: for its metadata's token count before the dispatch kernel and for the
    # permute's per-expert counts after it
    after = wait if e.ep_dispatcher == "hybridep" else []
    fwd = [(p["host_attn_f"], p["attn_f"]), *wait, (0.0, p["a2a_f"]), *after, (p["host_expert_f"], p["expert_f"]),
           (0.0, p["a2a_f"])]
    bwd = [(0.0, p["a2a_b"]), (p["host_expert_b"], p["expert_b"]), (0.0, p["a2a_b"]),
           (p["host_attn_b"], p["attn_b"])]
    stage_layers = stage_costs(preset(run.model), e, _cluster(run, 0.0), precision=run.precision).layers_per_stage
    n = stage_layers if e.pp == 1 else stage_layers // e.virtual_stages
    return stream_s((fwd * n + bwd * n) * repeats) / (n * repeats)


def sync_error(run: MeasuredRun, call_s: float, dense: tuple[int, int] = (0, 0)) -> float:
    """The row's relative error with each layer and micro-batch of its pacing stage at :func:`sync_layer_s` in
    place of the model's GPU time of a layer (the fill and drain left as the model has them)."""
    spec, e = preset(run.model), run.execution
    plain = _cluster(run, 0.0)
    sc: StageCosts = stage_costs(spec, e, plain, precision=run.precision)
    base = llm_step(spec, e, plain, precision=run.precision).iteration_s
    m = e.global_batch // (e.micro_batch * e.dp)
    layer = sync_layer_s(run, call_s, dense) - _layer_parts(run, 0.0, dense)["gpu"]
    return (base + m * sc.layers_per_stage * layer) / run.measured_s - 1


def bounds(run: MeasuredRun) -> tuple[float, ...]:
    """Per layer and micro-batch: the time the measurement leaves a layer (the model's GPU time plus the gap
    between measurement and the model at ``host_call_time`` 0, over ``m x layers per stage``), the GPU time, the
    MoE launches (grouped GEMMs, norm, router, preprocess), and the figure per launch at which the row is met with
    the host's and the GPU's work overlapped wholly (``T = H``, the host the longer) and not at all
    (``T = H + G``)."""
    spec, e = preset(run.model), run.execution
    p = _layer_parts(run, 1.0, (0, 0))
    launches = p["host_attn_f"] + p["host_attn_b"] + p["host_expert_f"] + p["host_expert_b"]
    m = e.global_batch // (e.micro_batch * e.dp)
    lps = stage_costs(spec, e, _cluster(run, 0.0), precision=run.precision).layers_per_stage
    gap = (run.measured_s - llm_step(spec, e, _cluster(run, 0.0), precision=run.precision).iteration_s) / (m * lps)
    needed = p["gpu"] + gap
    return needed, p["gpu"], launches, needed / launches, (needed - p["gpu"]) / launches


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
    parts += ["", "Host synchronisation per MoE layer forward, per layer and micro-batch at the presets' "
              "`host_call_time` (ms; MoE launches only, none of the attention block's):", ""]
    rows = []
    for r in BRIDGE_MOE_RUNS:
        call_s = run_cluster(r, None).device.host_call_s
        p = _layer_parts(r, call_s, (0, 0))
        needed = bounds(r)[0]
        rows.append((r.name, f"{sync_layer_s(r, call_s) * 1e3:.2f}", f"{sync_layer_s(r, call_s, sync=False) * 1e3:.2f}",
                     f"{p['gpu'] * 1e3:.2f}", f"{needed * 1e3:.2f}"))
    parts.append(markdown_table(("run", "with the sync", "host never waits", "GPU", "measured"), rows))
    errors = {r.name: [sync_error(r, c) for c in GRID[:16]] for r in BRIDGE_MOE_RUNS}
    rms = [(sum(v[k] ** 2 for v in errors.values()) / len(errors)) ** 0.5 for k in range(16)]
    k = min(range(16), key=rms.__getitem__)
    values = [v[k] for v in errors.values()]
    parts += ["", f"The family with the synchronised timeline in place of the model's layer (10 us grid 0-150 us, "
              f"least RMS): {GRID[k] * 1e6:.0f} us, RMS {rms[k]:.1%}, mean {sum(map(abs, values)) / len(values):.1%}, "
              f"max {max(map(abs, values)):.1%}; "
              + ", ".join(f"{name} {v[k]:+.1%}" for name, v in errors.items()), "",
              "Per-launch figure at which each Qwen3-30B-A3B alltoall row is met (per layer and micro-batch):", ""]
    rows = []
    for r in ALLTOALL:
        if r.model.startswith("qwen3-30b"):
            needed, gpu, launches, lower, upper = bounds(r)
            rows.append((r.name, f"{needed * 1e3:.2f}", f"{gpu * 1e3:.2f}", f"{launches:.0f}", f"{lower * 1e6:.1f}",
                         f"{upper * 1e6:.1f}"))
    parts.append(markdown_table(("run", "measured ms", "GPU ms", "MoE launches", "us, T = H", "us, T = H + G"), rows))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    run_table(argv, __doc__, "moe-host-models",
              "Host models of the MoE family's alltoall rows (measured, not adopted)",
              ".venv/bin/python -m benchmarks.bench_moe_host_models", report)


if __name__ == "__main__":
    main()
