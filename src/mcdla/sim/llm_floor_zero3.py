"""The per-link floor's ZeRO-3 part without offload (NOTE [link floor] in :mod:`mcdla.sim.llm_floor`): the last
backward's per-layer gathers and reduce-scatters and its layer communication beside the overlapped reduction's
once-per-iteration collectives, drained on the floor's path tables (NOTE [fair drain] in :mod:`mcdla.sim.llm_floor_drain`) and stepped as the
engine issues the layers' collectives. Apart from :mod:`mcdla.sim.llm_floor` for its size; it calls this
module only for a ZeRO-3 execution whose reduction is overlapped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcdla.sim.collective_models import collective_time
from mcdla.sim.llm_floor import _dims_bytes, _ring_attention_s, _shared, zero3_bytes_per_micro_batch
from mcdla.sim.llm_floor_drain import _DRAINED, Ends, Flow, _drain_ends, _flows, _table

if TYPE_CHECKING:
    from mcdla.hardware.cluster import Cluster
    from mcdla.sim.llm_floor_drain import _PathTable
    from mcdla.sim.llm import StageCosts, Zero3Traffic
    from mcdla.workload.execution import Execution

__all__ = ["drain_left", "layers_beside", "zero3_beside"]


def zero3_beside(execution: Execution, cluster: Cluster, costs: StageCosts,
                 comm: dict[tuple[str, str, int], Flow], dp: dict[tuple[str, str, int], Flow],
                  zero3: Zero3Traffic) -> tuple[float, float] | None:
    """Without offload under ZeRO-3, the last backward chunk's per-layer gathers and reduce-scatters, then its
    layer communication ``comm`` (one stage's, as :func:`class_bytes_per_micro_batch` moves it), beside the
    reduction's once-per-iteration collectives ``dp`` (NOTE [link floor]): ``(dp_exposed_s, last_backward_s)``
    of :class:`LinkFloors`, or None where no flow ends later for sharing.

    The chunk's gathers and reduce-scatters are one flow per class and way from its layers' start (the earliest
    they run), drained beside what the reduction has left then: it starts with the pass, ``head`` seconds
    before the layers (the logits' backward less the CP ring's attention, which the engine runs beside the
    ring's sends after the layers; a stage without the logits starts both at once), and moves at most its
    bytes alone over that head start. The layers end no earlier than their last reduce-scatter, nor than
    :func:`layers_beside` steps them; the chunk's TP, CP and EP calls run after them (the engine's order)
    beside what the reduction still has left. The first stage ends with the later of its pass and its
    reduction; each stage after it (``head``: its logits' backward without interleaving) delays the pass on the
    critical path by its own lateness."""
    e, c = execution, costs
    v = e.virtual_stages
    moved = zero3_bytes_per_micro_batch(cluster, c, zero3)["backward"]
    own = _flows({cls: (out / v, inward / v) for cls, (out, inward) in moved.items()}, "fsdp")
    if not own:
        return None
    comm = {key: (cls, way, got / v) for key, (cls, way, got) in comm.items()}
    chunk = c.layers_per_stage / v
    # the layers as the engine runs them: the ring's attention moved out beside its sends, after the layers
    ring_s = chunk * _ring_attention_s(e, c)
    layers_s = chunk * (c.layer_bwd_s + c.layer_recompute_s) + c.fsdp_bwd_s / v - ring_s
    after_s = c.layers_per_stage / v * c.layer_comm_bwd_s  # the chunk's TP, CP and EP calls, closed form
    table = _table(cluster, e.gpus)
    comm_alone = _drain_ends(table, comm) if comm else {}
    apart = _drain_ends(table, dp)

    def late(head: float) -> tuple[float, float, float]:
        """The pass's lateness, the reduction's end beyond the closed-form pass and its slowdown (both from
        the layers' start), with a head start of ``head``."""
        left = {key: (cls, way, got * (1 - head / apart[key])) for key, (cls, way, got) in dp.items()
                if apart[key] > head}
        ends = _drain_ends(table, {**own, **left})
        gathered = max(ends[key] for key in own)
        stepped, rest, dp_end = layers_beside(e, cluster, c, zero3, left)
        layers_end = max(gathered, layers_s + stepped)
        if gathered > layers_s + stepped:  # the drain binds: what it leaves, then alone while the layers compute
            rest = drain_left(table, drain_left(table, left, gathered, own), layers_end - gathered)
            dp_end = max([0.0, *(ends[key] for key in left if key not in rest)])
        joint = _drain_ends(table, {**comm, **rest}) if comm or rest else {}
        comm_end = max([after_s, *(joint[key] - comm_alone[key] + after_s for key in comm)])
        pass_late = layers_end + comm_end - layers_s - after_s
        red_end = max([dp_end, *(layers_end + joint[key] for key in rest)])
        alone_end = max([0.0, *(_drain_ends(table, left).values())]) if left else 0.0
        return pass_late, red_end - layers_s - after_s, red_end - alone_end

    logits_head = max(0.0, c.last_bwd_s - ring_s)  # the logits' backward, less the ring's attention
    first_head = logits_head if e.pp == 1 and v == 1 else 0.0
    pass_late, red_late, slow_dp = late(first_head)
    if pass_late <= _DRAINED * layers_s and red_late <= 0:
        return None
    # the closed form's first stage: the reduction starts its hiding pass before the pass's end
    first = max(c.dp_exposed_s + pass_late, red_late + layers_s + after_s + first_head - c.dp_hidden_s + c.dp_tail_s,
                c.dp_full_s + slow_dp - c.dp_hidden_s + c.dp_tail_s)
    others = late(logits_head if v == 1 else 0.0)[0] if e.pp > 1 else 0.0
    return max(0.0, first), max(0.0, others)


def layers_beside(execution: Execution, cluster: Cluster, costs: StageCosts, zero3: Zero3Traffic,
                  dp: dict[tuple[str, str, int], Flow]) -> tuple[float, dict[tuple[str, str, int], Flow], float]:
    """How much later a backward chunk's layers end under ZeRO-3 with the reduction's flows ``dp`` in flight
    from their start, what the reduction has left when they end and when it is through (0 if it is not).

    The chunk's layers as the engine issues their collectives (NOTE [ZeRO lowering] in
    :mod:`mcdla.sim.llm_lower_zero`, :func:`mcdla.sim.llm.fsdp_exposed_s`): each layer waits for its gather
    and the layer before it, the gathers ``fsdp_prefetch`` layers ahead, each reduce-scatter when its layer
    ends, one collective at a time on the group's links; the reduction drains alone while they idle and beside
    each collective (which takes its closed-form time plus what the reduction slows its flows); the same
    steps without the reduction give the layers' end it is compared with."""
    e, c = execution, costs
    layers = max(1, c.layers_per_stage // e.virtual_stages)
    compute_s = c.layer_bwd_s + c.layer_recompute_s - _ring_attention_s(e, c)

    def op(colls: tuple) -> tuple[float, dict[tuple[str, str, int], Flow]]:
        moved: dict[str, float] = {}
        seconds = 0.0
        for coll in colls:
            dims = cluster.group_dims(coll.size, coll.stride)
            seconds += collective_time(coll.kind, coll.nbytes, dims)
            for cls, got in _dims_bytes(cluster, coll.kind, coll.nbytes, dims).items():
                moved[cls] = moved.get(cls, 0.0) + got
        return seconds, _flows({cls: (got, got) for cls, got in moved.items()}, "fsdp")

    gather, reduce = op(zero3.gathers), op(zero3.reduces)
    table = _table(cluster, e.gpus)

    def run(flows: dict[tuple[str, str, int], Flow] | None) -> tuple[float, float, dict[tuple[str, str, int], Flow]]:
        left, dp_now, dp_end = dict(flows or {}), 0.0, 0.0

        def on_link(start: float, item: tuple[float, dict]) -> float:
            nonlocal left, dp_now, dp_end
            seconds, own = item
            if not left or not own:
                return start + seconds
            left = drain_left(table, left, start - dp_now)  # alone while the links idle
            if not left:
                dp_end = dp_end or start
                return start + seconds
            alone, ends = _drain_ends(table, own), _drain_ends(table, {**own, **left})
            took = max(ends[key] for key in own)
            late = max(0.0, took - max(alone.values()))
            rest = drain_left(table, left, took, own)
            if not rest:
                dp_end = start + max(ends[key] for key in left)
            left, dp_now = rest, start + took
            return start + seconds + late

        link = compute = 0.0
        ahead: list[float] = []
        d = e.fsdp_prefetch
        for _ in range(min(d, layers)):
            link = on_link(link, gather)
            ahead.append(link)
        for i in range(layers):
            if d:
                gathered = ahead.pop(0)
            else:
                link = on_link(max(link, compute), gather)
                gathered = link
            start = max(compute, gathered)
            if d and i + d < layers:
                link = on_link(max(link, start), gather)
                ahead.append(link)
            compute = start + compute_s
            link = on_link(max(link, compute), reduce)
        end = max(link, compute)
        return end, dp_end, drain_left(table, left, end - dp_now) if left else {}

    got, dp_end, left = run(dp)
    base = run(None)[0]
    return max(0.0, got - base), left, dp_end if not left else 0.0


def drain_left(table: _PathTable, flows: dict[tuple[str, str, int], Flow], until_s: float,
               beside: dict[tuple[str, str, int], Flow] | None = None) -> dict[tuple[str, str, int], Flow]:
    """What is left of ``flows`` after ``until_s`` seconds of the fair drain (NOTE [fair drain]) on the path table
    ``table`` (the job's, :func:`mcdla.sim.llm_floor_drain._table`) beside the flows ``beside`` (started with them, not
    returned): each a flow with the bytes it still has to move, those through left out."""
    both = {**(beside or {}), **flows}
    keys = tuple(both)
    left = [flow[2] for flow in both.values()]
    drain = table.drain(keys)
    live, now = drain.mask, 0.0
    while live and now < until_s:
        rates = drain.rates(live)
        step = min(until_s - now, *(left[i] / rate for i, rate in rates))
        now += step
        for i, rate in rates:
            left[i] -= rate * step
            if left[i] <= _DRAINED * both[keys[i]][2]:
                left[i] = 0.0
                live &= ~(1 << i)
    return {key: (cls, way, left[i]) for i, (key, (cls, way, _got)) in enumerate(both.items())
            if key in flows and left[i] > 0 and i in drain.loaded}
