"""The per-rank engine for LLM training iterations: every rank's 1F1B (or interleaved 1F1B) schedule, explicitly.

:func:`mcdla.sim.llm.llm_step` (``mode="fast"``) is a closed form over one representative rank per pipeline
role, exact only when every stage's ranks are symmetric. This module is the reference it is tested against
(``tests/sim/test_llm_ranks.py``) and the path for asymmetric systems — a straggler (``slowdown``: a per-rank
compute time factor) or a non-uniform layer split (``layers_per_stage``). NOTE [rank schedule]:

* Ranks are numbered as Megatron-LM orders them, TP fastest, then CP, DP, PP
  (:class:`~mcdla.workload.parallel_dims.ParallelDims`, NOTE [rank order]).
* A TP x CP group (same stage ``s``, same replica ``d``) is gang-scheduled: every layer's all-reduce (and CP's
  ring exchange) synchronises its members, so a chunk takes the slowest member's compute plus the
  collectives (exact at layer granularity as long as a member's layers cost the same, which they do).
* Each rank runs Megatron-LM's order of ops: 1F1B with ``p - s - 1`` warm-up forwards, or the interleaved
  schedule with ``2 (p - s - 1) + (v - 1) p`` warm-up forwards, chunk ``(k mod p v) // p`` and micro-batch
  ``(k // p v) p + k mod p`` for its ``k``-th forward (``forward_backward_pipelining_with_interleaving``).
  An op starts when its rank is free and its input is there: a forward after the previous chunk's forward
  (stage ``s - 1``, or stage ``p - 1`` of chunk ``c - 1``), a backward after the next chunk's backward and
  its own forward.
* Every forward and backward op ends with one blocking point-to-point transfer (Megatron's scatter/gather of
  ``b s h / tp``) on the link the stage boundary it crosses runs over (``StageCosts.send_s``: a forward to the
  next stage, a backward to the previous one, the interleaved schedule's wrap between the last stage and the
  first; where Megatron has no peer the op holds the slowest boundary's send, ``p2p_s``), as the fast path
  charges ``2 v`` transfers per micro-batch to every stage; one transfer at a time per link, since the op holds
  its rank. With ``pp_comm_overlap`` the op holds only the exposed part and the rest (``boundary_hidden_s``)
  runs beside the next op: its receiver starts that much after the op ends.
* After a replica's last backward on stage ``s``, the DP group of that stage reduces its gradients: it starts
  when the slowest replica is done and exposes what the last backward does not hide (the fast path's
  ``dp_exposed_s``); then each rank's optimizer step (nominal, not slowed) and optimizer offload.
* ``slowdown`` multiplies a rank's compute (layer forward, backward, recomputation, logits and loss), not its
  collectives, transfers or offload and ZeRO-3 exposure (those stay the nominal figures, spread evenly over
  a stage's chunks).

The replicas' pipelines are independent until the DP reduction, so the engine schedules each of the ``dp``
pipelines over ``p`` stages: ``O(dp p m v)`` ops. Symmetric replicas give identical schedules; the fast path
is the same system reduced to one replica and a closed form (``docs/llm.md``, "Per-rank engine").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.sim.llm import DEFAULT_PRECISION, LlmStep, StageCosts, pacing_stage_parts, stage_costs, step_record
from mcdla.workload.execution import Execution
from mcdla.workload.layer_counts import dense_chunk_layers
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import TransformerSpec

__all__ = ["MAX_RANK_GPUS", "MAX_SCHEDULED_OPS", "PipelineSchedule", "RanksResult", "pipeline_order", "pipeline_s",
           "schedule_pipeline", "simulate_ranks", "ranks_step"]

MAX_RANK_GPUS = 2**20
"""Most GPUs the per-rank engine schedules: it keeps one end time per rank."""
MAX_SCHEDULED_OPS = 4_000_000
"""Most ``dp x pp x micro-batches x virtual stages`` (forward-backward pairs) the engine schedules, about 5 s
at the ~1 us per pair it takes; beyond that the symmetric fast path (``mode="fast"``) is the tool."""


_ROUNDING = 1e-12
"""Relative size below which the schedule's remainder over its parts is the rounding of two float sums."""


def pipeline_order(stages: int, micro_batches: int, chunks: int, stage: int) -> list[tuple[bool, int, int]]:
    """Megatron-LM's op order on pipeline rank ``stage``: ``(is_forward, micro_batch, chunk)`` tuples.

    ``chunks == 1``: 1F1B (warm-up ``min(p - s - 1, m)`` forwards, then one forward one backward, then the
    cool-down backwards). ``chunks > 1``: the interleaved schedule (module docstring), ``m`` a multiple of ``p``.
    """
    p, m, v = stages, micro_batches, chunks
    if v == 1:
        warm = min(p - stage - 1, m)
        order = [(True, k, 0) for k in range(warm)]
        for i in range(m - warm):
            order += [(True, warm + i, 0), (False, i, 0)]
        order += [(False, k, 0) for k in range(m - warm, m)]
        return order
    if m % p:
        raise ConfigError(f"pipeline_order: got {m} micro-batches with an interleaved schedule of {p} stages; "
                          "must be a multiple of the stages")
    total = m * v
    warm = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)

    def op(k: int, forward: bool) -> tuple[bool, int, int]:
        chunk = (k % (p * v)) // p
        return forward, (k // (p * v)) * p + k % p, chunk if forward else v - 1 - chunk

    order = [op(k, True) for k in range(warm)]
    for i in range(total - warm):
        order += [op(warm + i, True), op(i, False)]
    order += [op(k, False) for k in range(total - warm, total)]
    return order


@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """One replica's pipeline: per stage, the end of its last op and the start and end of its last backward
    (seconds from the iteration's start), and its busy time."""

    end_s: tuple[float, ...]
    last_bwd_start_s: tuple[float, ...]
    busy_s: tuple[float, ...]

    @property
    def makespan_s(self) -> float:
        """When the last stage of the pipeline finishes (stage 0's last backward under 1F1B)."""
        return max(self.end_s)


def schedule_pipeline(fwd_s: Sequence[Sequence[float]], bwd_s: Sequence[Sequence[float]],
                      micro_batches: int, *, transit_s: float | Sequence[float] = 0.0) -> PipelineSchedule:
    """Run the ops of Megatron's schedule on ``p = len(fwd_s)`` stages of ``v = len(fwd_s[0])`` chunks with the
    given durations (``fwd_s[s][c]``, ``bwd_s[s][c]``: one micro-batch of chunk ``c`` on stage ``s``, transfers
    included) and the dependencies of the module docstring; every op starts as soon as its rank is free and
    its input has arrived, ``transit_s`` after the op on the other stage that produced it ended (the part of a
    send that runs beside the sender's next chunk under ``pp_comm_overlap``, not in its durations): one figure,
    or one per stage boundary (:attr:`~mcdla.sim.llm.StageCosts.boundary_hidden_s`: stage ``b`` and ``b + 1``,
    then the last stage and the first)."""
    p, v, m = len(fwd_s), len(fwd_s[0]), micro_batches
    transit = [float(transit_s)] * p if isinstance(transit_s, int | float) else list(transit_s)
    orders = [pipeline_order(p, m, v, s) for s in range(p)]
    nan = float("nan")
    f_end = [[nan] * (v * m) for _ in range(p)]
    b_end = [[nan] * (v * m) for _ in range(p)]
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    last_bwd = [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for s in range(p):
            order, i, t = orders[s], pos[s], free[s]
            while i < len(order):
                forward, mb, c = order[i]
                if forward:
                    dep = (f_end[s - 1][c * m + mb] + transit[s - 1] if s
                           else f_end[p - 1][(c - 1) * m + mb] + transit[p - 1]) if s or c else 0.0
                else:
                    dep = b_end[s + 1][c * m + mb] + transit[s] if s < p - 1 else (
                        b_end[0][(c + 1) * m + mb] + transit[p - 1] if c < v - 1 else f_end[s][c * m + mb])
                    dep = max(dep, f_end[s][c * m + mb])
                if dep != dep:  # NaN: the input is not computed yet
                    break
                start = max(t, dep)
                dur = fwd_s[s][c] if forward else bwd_s[s][c]
                t = start + dur
                busy[s] += dur
                (f_end if forward else b_end)[s][c * m + mb] = t
                if not forward:
                    last_bwd[s] = start
                i += 1
            if i != pos[s]:
                progressed = True
                left -= i - pos[s]
                pos[s], free[s] = i, t
        if not progressed:  # cannot happen for Megatron's orders; a guard against a wrong order
            raise RuntimeError(f"schedule_pipeline: deadlock with {left} ops left (p={p}, v={v}, m={m})")
    return PipelineSchedule(end_s=tuple(free), last_bwd_start_s=tuple(last_bwd), busy_s=tuple(busy))


@dataclass(frozen=True, slots=True)
class RanksResult:
    """The per-rank engine's iteration: its length (seconds), when each rank finishes (Megatron rank order),
    the pipeline makespan of each replica, and the stage costs it was built from."""

    iteration_s: float
    rank_end_s: tuple[float, ...]
    pipeline_s: tuple[float, ...]
    costs: StageCosts


def _chunk_durations(c: StageCosts, e: Execution, chunks: Sequence[Sequence[int]], factor: Sequence[float],
                     dense: Sequence[Sequence[int]] = ()) -> tuple[list[list[float]], list[list[float]]]:
    """Forward and backward durations per stage and chunk for one replica (module docstring); ``chunks``:
    the layers of each stage's chunks, ``dense`` how many of them are dense leading layers (() for none), each
    kind of layer at its own figures (:meth:`StageCosts.kinds`)."""
    p, v = e.pp, e.virtual_stages
    fwd, bwd = [], []
    for s in range(p):
        k = factor[s]
        f_row, b_row = [], []
        for ch in range(v):
            kinds = c.kinds(chunks[s][ch], dense[s][ch] if dense else 0)
            last = s == p - 1 and ch == v - 1
            f_row.append(k * (sum(n * x.layer_fwd_s for x, n in kinds) + (c.last_fwd_s if last else 0.0))
                         + sum(n * x.layer_comm_fwd_s for x, n in kinds)
                         + c.send_s(s, ch, v, forward=True) + (c.offload_fwd_s + c.fsdp_fwd_s) / v
                         + (c.last_fsdp_s if last else 0.0))
            b_row.append(k * (sum(n * (x.layer_bwd_s + x.layer_recompute_s) for x, n in kinds)
                              + (c.last_bwd_s if last else 0.0))
                         + sum(n * x.layer_comm_bwd_s for x, n in kinds) + c.send_s(s, ch, v, forward=False)
                         + (c.offload_bwd_s + c.fsdp_bwd_s) / v)
        fwd.append(f_row)
        bwd.append(b_row)
    return fwd, bwd


def pipeline_s(c: StageCosts, e: Execution, *, stretch_s: float = 0.0) -> float:
    """The makespan of one replica's pipeline at nominal speed (:func:`schedule_pipeline` of the execution's
    chunks, each boundary's send on its own link), each stage's micro-batch longer by ``stretch_s`` (the closed
    form's link floor, spread evenly over its ``2 v`` passes): the closed form of a pipeline whose boundaries'
    sends differ where no expression in the stage times is exact (NOTE [pipeline sends] in :mod:`mcdla.sim.llm`).
    O(p m v)."""
    fwd, bwd = _chunk_durations(c, e, c.chunk_layers, [1.0] * e.pp, c.chunk_dense)
    extra = stretch_s / (2 * e.virtual_stages)
    if extra:
        fwd = [[t + extra for t in row] for row in fwd]
        bwd = [[t + extra for t in row] for row in bwd]
    return schedule_pipeline(fwd, bwd, e.micro_batches, transit_s=c.boundary_hidden_s or c.p2p_hidden_s).makespan_s


def simulate_ranks(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                   slowdown: Mapping[int, float] | None = None, layers_per_stage: Sequence[int] | None = None,
                   precision: str = DEFAULT_PRECISION) -> RanksResult:
    """Schedule every rank of one iteration (module docstring, NOTE [rank schedule]).

    ``slowdown``: rank -> compute time factor (>= 1 for a straggler; 2 = twice as slow). ``layers_per_stage``:
    layers of each pipeline stage (sum = the model's layers, each a multiple of the virtual stages); default the
    execution's split (:func:`~mcdla.workload.execution.chunk_layers`).
    """
    e = execution
    ops = e.dp * e.pp * e.micro_batches * e.virtual_stages
    if e.gpus > MAX_RANK_GPUS or ops > MAX_SCHEDULED_OPS:
        raise ConfigError(f"execution: got {e.gpus} GPUs and dp*pp*micro_batches*virtual_stages = {ops} for the "
                          f"per-rank engine; must be at most {MAX_RANK_GPUS} GPUs and {MAX_SCHEDULED_OPS} "
                          "(use the symmetric fast path, without --ranks/--slowdown)")
    c = stage_costs(spec, e, cluster, precision=precision)
    p, v = e.pp, e.virtual_stages
    layout = ParallelDims.of(e)
    slowdown = dict(slowdown or {})
    for rank, k in slowdown.items():
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < e.gpus:
            raise ConfigError(f"slowdown: got rank {brief(rank)}; must be an integer in [0, {e.gpus})")
        if isinstance(k, bool) or not isinstance(k, int | float) or not 0 < k < float("inf"):
            raise ConfigError(f"slowdown[{rank}]: got {brief(k)}; must be a finite factor > 0")
    layers = list(layers_per_stage) if layers_per_stage is not None else list(c.stage_layers)
    if layers_per_stage is not None and (
            len(layers) != p or sum(layers) != spec.layers
            or any(isinstance(n, bool) or not isinstance(n, int) or n < v or n % v for n in layers)):
        raise ConfigError(f"layers_per_stage: got {brief(layers_per_stage)}; must be {p} integers summing to "
                          f"{spec.layers}, each a positive multiple of virtual_stages={v}")
    chunks = [[n // v] * v for n in layers] if layers_per_stage is not None else c.chunk_layers
    dense = (dense_chunk_layers(tuple(tuple(row) for row in chunks), spec.dense_layers)
             if layers_per_stage is not None and c.chunk_dense else c.chunk_dense)

    def group(s: int, d: int) -> list[int]:
        """The TP x CP ranks of stage ``s`` in replica ``d``."""
        return [layout.rank(tp=t, cp=x, dp=d, pp=s) for x in range(e.cp) for t in range(e.tp)]

    factor = [[max(slowdown.get(r, 1.0) for r in group(s, d)) for s in range(p)] for d in range(e.dp)]
    pipelines: list[PipelineSchedule] = []
    for d in range(e.dp):
        fwd, bwd = _chunk_durations(c, e, chunks, factor[d], dense)
        pipelines.append(schedule_pipeline(fwd, bwd, e.micro_batches, transit_s=c.boundary_hidden_s or c.p2p_hidden_s))
    # The DP reduction of stage s waits for the slowest replica's last backward of that stage.
    if c.dp_full_s > 0 or c.dp_tail_s > 0:
        reduced = [max(pl.end_s[s] for pl in pipelines) + c.dp_exposed_s for s in range(p)]
    else:
        reduced = [0.0] * p
    rank_end = [0.0] * e.gpus
    for d, pl in enumerate(pipelines):
        for s in range(p):
            done = max(pl.end_s[s], reduced[s]) + c.optimizer_s + c.offload_step_s
            for r in group(s, d):
                rank_end[r] = done
    return RanksResult(iteration_s=max(rank_end), rank_end_s=tuple(rank_end),
                       pipeline_s=tuple(pl.makespan_s for pl in pipelines), costs=c)


def ranks_step(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
               slowdown: Mapping[int, float] | None = None, layers_per_stage: Sequence[int] | None = None,
               precision: str = DEFAULT_PRECISION) -> LlmStep:
    """:func:`simulate_ranks` as an :class:`~mcdla.sim.llm.LlmStep`: ``iteration_s`` from the schedule; the
    steady-state parts (compute, recompute, TP, PP, offload) are the nominal slowest stage's, as in the fast path,
    and ``bubble_s`` is the rest of the schedule (fill, drain and any wait on a straggler), so the parts still
    add up to ``iteration_s`` (to rounding: a schedule with no idle time gives ``bubble_s`` 0, never a
    negative remainder of the float sum)."""
    e = execution
    result = simulate_ranks(spec, e, cluster, slowdown=slowdown, layers_per_stage=layers_per_stage,
                            precision=precision)
    c = result.costs
    _, parts = pacing_stage_parts(c, e)
    rest = sum(parts.values()) + c.dp_exposed_s + c.optimizer_s
    bubble = result.iteration_s - rest
    assert bubble > -1e-9 * result.iteration_s, (bubble, rest)  # the schedule never beats its busy time
    if abs(bubble) <= _ROUNDING * result.iteration_s:  # no idle time: what is left is the float sums' rounding
        bubble = 0.0
    return step_record(spec, e, cluster, c, precision=precision, iteration=result.iteration_s, bubble=bubble,
                       **parts)
