"""The compute-stream program of one device: the ordered operations of one iteration, with the memory each
allocates and frees, the transfers it triggers and the collective it launches (``docs/timing-model.md``).

The program is plain data computed once per simulation (per distinct device model): forward ``F_0..F_{L-1}``,
then for each layer from the last down, the recomputation ``R_j..R_{i-1}`` a recompute segment needs, then
``B_i``. The engine (:mod:`mcdla.sim.device`) only walks it.

NOTE [state in the program]
    A plan's ``state`` entries (NOTE [four classes] in :mod:`mcdla.workload.plan`) change the program the way
    ``mcdla.offload_parameters`` and ``mcdla.offload_optimizer`` run them:

    - the static bytes count only the classes kept on the device (weights ``P``, gradients ``P``, optimizer
      state ``r * P`` per layer of ``P`` parameter bytes, ``r = optimizer_bytes_per_param_byte``);
    - offloaded weights, in forward order ``u_0..u_{m-1}``, each with the prefetch depth ``k_p`` of its
      plan entry: ``F(u_p)`` fetches its own weights when the stream reaches it unless an earlier one started
      that fetch, and when it starts, those of ``u_{p+1}..u_{p+k_p}`` not started yet (with one depth ``k``:
      ``F(u_0)`` starts ``u_1..u_k``, every later ``F(u_p)`` starts ``u_{p+k}``), as
      ``offload_parameters`` runs them; each waits for its own fetch, allocates the bytes of what it fetched
      and frees its own weights when it ends. Backward does the same in its own order (fetches do not cross from forward
      to backward, as the runtime releases each layer after its forward). Weight fetches run one at a time
      over the prefetch route; a recomputation of such a layer fetches on demand and releases after;
    - offloaded optimizer state: when ``B_i`` ends its gradient (``P``) is copied out over the offload route
      then updated on the CPU, one layer at a time (the optimizer's one worker thread), for
      ``P * update_s_per_param_byte`` (a measured rate: the host's update speed is not part of the system
      model, so it is 0 unless given). An offloaded gradient takes ``P`` on the device from ``B_i`` until its
      copy out lands. ``OffloadedOptimizer.step()`` then runs once the last operation has ended and every
      update has run: it copies each new value (``P``) in, one after another in update order, over the
      prefetch route into the device's weights, or, with the weights offloaded too, over the offload route
      into the pool (a new block). The iteration ends when the last is in place;
    - the pool memories hold what the runtime keeps in its tiers: the offloaded weights and optimizer state
      for the whole step (``Program.pool_state_bytes``; a fetch leaves a weight's block in place), and for
      each offloaded optimizer ``P`` on the host from the start of its gradient's copy out until ``step()``
      has copied its new value in (the gradient, then the new value), besides the offloaded activations; so ``SimResult.peak_bytes_by_tier`` and ``memory_timeline`` of the pool's kind
      (``"host"``, ``"memory-node"``) count them. They take room from offloaded activations (which wait for
      room) but never wait themselves: state alone above the pool's capacity shows as a peak above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.errors import PlanError, WorkloadError
from mcdla.hardware.model import Device
from mcdla.workload.model import LayerKind, Workload
from mcdla.workload.plan import Action, Plan

__all__ = ["FORWARD", "RECOMPUTE", "BACKWARD", "PHASES", "ALL_REDUCE", "ALL_GATHER", "Op", "Program",
           "roofline_s", "build_program"]

SPLIT_WEIGHT_KINDS = frozenset({LayerKind.CONV, LayerKind.FC, LayerKind.RNN_CELL, LayerKind.ATTENTION,
                                LayerKind.EMBEDDING})
"""Layer kinds whose weights model parallelism splits across devices (NOTE [model-parallel exchanges])."""

FORWARD, RECOMPUTE, BACKWARD = 0, 1, 2
PHASES = ("F", "R", "B")
ALL_REDUCE, ALL_GATHER = "all-reduce", "all-gather"
"""The collective kinds a program launches: names of :data:`mcdla.sim.collective_models.KINDS`."""


def roofline_s(flops: float, bytes_moved: float, device: Device, precision: str) -> float:
    """Time of one operation (s): ``max(flops / (peak * compute_eff), bytes / (hbm_bw * memory_eff))``."""
    peak = device.flops_per_s(precision) * device.compute_efficiency
    bandwidth = device.effective_hbm_bytes_per_s
    return max(flops / peak, bytes_moved / bandwidth)


class Op:
    """One compute-stream operation (see the module docstring); plain attributes, read by the engine.

    Attributes:
        kind: FORWARD, RECOMPUTE (a re-run of a forward) or BACKWARD; layer: its layer index; label: name.
        duration_s: roofline time; flops, bytes_moved: the FLOP and bytes it executes (for traces).
        alloc_bytes: allocated when it starts; free_bytes: freed when it ends.
        need_data: layer whose prefetch must have completed before it starts (-1: none).
        reach_prefetch: layers whose prefetch is issued when the stream reaches this op (recompute base).
        start_prefetch / end_prefetch: layers whose prefetch is issued when it starts / ends.
        offload: layer whose saved tensor is offloaded when it starts (-1: none); that tensor is released when
            both the offload and this op have completed.
        coll_bytes: size of the collective launched when it ends (0: none); coll_kind: ALL_REDUCE / ALL_GATHER
        (the :class:`~mcdla.sim.collective_models.Collective` kind :mod:`mcdla.sim.collectives` runs it as);
        coll_label: its name; coll_blocks: whether the next op waits for it (model parallel).
        reach_fetch / start_fetch: weight fetches (indices into ``Program.fetch_bytes``) issued when the stream
            reaches this op (the on-demand fetch of its own weights) / when it starts (those ``prefetch`` ahead);
            need_fetch: the weight fetch that must have landed before it starts (-1: none).
        update_bytes: parameter bytes of the layer whose gradient leaves for a CPU update when it ends (0: none);
            update_back: whether the updated parameter comes back over the link (its weights stay on the device);
            update_frees: whether the gradient's device bytes are freed once it has left (offloaded gradients);
            update_s: the CPU update's duration (s).
        (NOTE [state in the program].)
    """

    __slots__ = ("kind", "layer", "label", "duration_s", "flops", "bytes_moved", "alloc_bytes", "free_bytes", "need_data",
                 "reach_prefetch", "start_prefetch", "end_prefetch", "offload", "coll_bytes", "coll_kind",
                 "coll_label", "coll_blocks", "reach_fetch", "start_fetch", "need_fetch", "update_bytes",
                 "update_back", "update_frees", "update_s")

    def __init__(self, kind: int, layer: int, label: str, duration_s: float, alloc_bytes: float,
                 free_bytes: float) -> None:
        self.kind = kind
        self.layer = layer
        self.label = label
        self.duration_s = duration_s
        self.flops = 0.0
        self.bytes_moved = 0.0
        self.alloc_bytes = alloc_bytes
        self.free_bytes = free_bytes
        self.need_data = -1
        self.reach_prefetch: tuple[int, ...] = ()
        self.start_prefetch: tuple[int, ...] = ()
        self.end_prefetch: tuple[int, ...] = ()
        self.offload = -1
        self.coll_bytes = 0.0
        self.coll_kind = ALL_REDUCE
        self.coll_label = ""
        self.coll_blocks = False
        self.reach_fetch: tuple[int, ...] = ()
        self.start_fetch: tuple[int, ...] = ()
        self.need_fetch = -1
        self.update_bytes = 0.0
        self.update_back = False
        self.update_frees = False
        self.update_s = 0.0


@dataclass(frozen=True, slots=True)
class Program:
    """A device's operations for one iteration plus the per-layer facts the engine needs.

    Attributes:
        ops: compute-stream operations in order.
        saved_bytes: ``S_i`` of each layer as this device holds it (bytes; NOTE [model-parallel saved bytes]).
        layer_names: layer names.
        static_bytes: resident throughout (weights, gradients, optimizer state; per device).
        offloaded: whether each layer's tensor is offloaded (after zero-byte offloads became keeps).
        fetch_bytes: bytes of each weight fetch (NOTE [state in the program]); fetch_layer: its layer index.
        pool_state_bytes: bytes of weights and optimizer state the plan keeps in the pool for the whole step.
        cpu_sharing: (compute, update) stretch factors while both run on one CPU (NOTE [CPU sharing] in
            :mod:`mcdla.sim.device`); (1, 1): the updates have a core of their own.
    """

    ops: tuple[Op, ...]
    saved_bytes: tuple[float, ...]
    layer_names: tuple[str, ...]
    static_bytes: float
    offloaded: tuple[bool, ...]
    fetch_bytes: tuple[float, ...] = ()
    fetch_layer: tuple[int, ...] = ()
    pool_state_bytes: float = 0.0
    cpu_sharing: tuple[float, float] = (1.0, 1.0)


def _actions(workload: Workload, plan: Plan) -> tuple[list[Action], list[int]]:
    """Each layer's action and its prefetch trigger layer (-1 = end of forward; only for offloads)."""
    plan.check_matches(workload.layer_names, workload.name)
    n = len(workload.layers)
    actions = [Action.KEEP] * n
    trigger = [-1] * n
    for d in plan.decisions:
        i = workload.index_of(d.layer)
        saved = workload.layers[i].saved_bytes
        if d.action is Action.OFFLOAD and saved <= 0:
            continue  # a zero-byte offload moves nothing: it is a keep
        actions[i] = d.action
        if d.action is Action.RECOMPUTE and i == 0:
            raise PlanError(f"plan decision for {d.layer!r}.action: got 'recompute'; layer 0's tensor is the "
                            "input and cannot be recomputed")
        if d.action is Action.OFFLOAD:
            if d.prefetch_at is None:
                trigger[i] = i + 1 if i + 1 < n else -1
            else:
                j = workload.index_of(d.prefetch_at)
                if j <= i:
                    raise PlanError(f"plan decision for {d.layer!r}.prefetch_at: got {d.prefetch_at!r}; must name "
                                    f"a later layer (its backward must run before B of {d.layer!r})")
                trigger[i] = j
    return actions, trigger


def recompute_base(actions: list[Action], saved: tuple[float, ...], i: int) -> int:
    """The checkpoint a recomputation of ``S_i`` re-runs forward from.

    NOTE [recompute base]
    It is the nearest layer ``j < i`` that is not recomputed *and* stashes something (or layer 0, whose input
    is the batch). A layer that stashes nothing (a ReLU whose output is counted as the next layer's saved
    input) holds no input to re-run from, so the re-run starts further back; the layers in between, whatever
    their action, are regenerated by the same re-run.
    """
    base = i - 1
    while base > 0 and (actions[base] is Action.RECOMPUTE or saved[base] <= 0):
        base -= 1
    return base


def _input_bytes(workload: Workload, i: int) -> float:
    """Bytes of layer ``i``'s input (its input gradient in backward): its producers' outputs."""
    layer = workload.layers[i]
    if layer.inputs:
        return sum(workload.layers[workload.index_of(src)].output_bytes for src in layer.inputs)
    return workload.layers[i - 1].output_bytes if i > 0 else 0.0


def _exchanges(workload: Workload, i: int) -> bool:
    """Whether layer ``i`` exchanges activations under model parallelism.

    NOTE [model-parallel exchanges]
    As in the paper's and Megatron-style model parallelism, only layers whose weights are split over the
    devices (conv, fc, recurrent cells, attention, embeddings) exchange: after ``F_i`` its output is
    all-gathered, after ``B_i`` its input gradient is all-reduced (partial sums over the split weights).
    Element-wise layers (ReLU, batch-norm, pooling, dropout, the loss) work on each device's slice of the
    tensor, with their time divided like the rest, and exchange nothing.
    """
    return workload.layers[i].kind in SPLIT_WEIGHT_KINDS


def _device_saved_bytes(workload: Workload, i: int, share: int) -> float:
    """Bytes of layer ``i``'s saved tensors that one of ``share`` model-parallel devices holds.

    NOTE [model-parallel saved bytes]
    A split-weight layer is split by output channels (output features, hidden units), which is what the
    all-gather of its output and the all-reduce of its input gradient (NOTE [model-parallel exchanges])
    model: device ``d`` computes ``Y_d = X W_d`` and its weight gradient ``X^T dY_d``, so it needs the
    *whole* input ``X`` in forward and in backward and saves all of it. An element-wise layer works on the
    device's channel slice (its time is divided like its FLOPs), so what it saves (a batch-norm input and
    statistics, a pool's input, a dropout mask) is a ``1 / share`` slice. Split by input channels instead,
    each device would hold only its input slice but every output would need an all-reduce in forward;
    that is not the scheme simulated here. A storage saved by an element-wise layer and by the next
    split-weight layer (a ReLU output feeding a conv) is counted once, whole, for the split layer
    (NOTE [saved-bytes attribution]); the ReLU's own slice, a separate buffer before the all-gather on a real
    system, is left out (an under-count of ``1 / share`` of that tensor). A recurrent chunk
    split by hidden units needs every step's previous hidden state whole (``h W_hh^T`` and its weight
    gradient read all of ``h``) but keeps only its slice of the cell state and gates: its whole part is its
    hidden states, bounded by its output bytes (the hidden states it produces, plus the final cell state
    for an LSTM), and the rest is a slice.
    """
    layer = workload.layers[i]
    saved = layer.saved_bytes
    if share == 1:
        return saved
    if not _exchanges(workload, i):
        return saved / share
    if layer.kind is LayerKind.RNN_CELL:
        whole = min(saved, layer.output_bytes)
        return whole + (saved - whole) / share
    return saved


def _state_placements(workload: Workload, plan: Plan) -> tuple[list[bool], list[bool], list[bool], list[int]]:
    """Per layer: whether the plan offloads its weights, its gradients, its optimizer state; its weights' prefetch
    depth."""
    n = len(workload.layers)
    weights, grads, opt = [False] * n, [False] * n, [False] * n
    depth = [0] * n
    known = set(workload.layer_names)
    for sd in plan.state:
        if sd.layer not in known:
            raise PlanError(f"plan.state: layer {sd.layer!r} is not a layer of {workload.name!r}")
        i = workload.index_of(sd.layer)
        weights[i], grads[i], opt[i] = (sd.offloads("weights"), sd.offloads("gradients"),
                                        sd.offloads("optimizer_state"))
        depth[i] = sd.prefetch
        if grads[i] and not opt[i]:
            raise PlanError(f"plan state for {sd.layer!r}.gradients: got 'offload' with optimizer_state 'device'; a "
                            "gradient leaves the device only for an update on the CPU (offload optimizer_state too)")
    return weights, grads, opt, depth


def _apply_state(workload: Workload, plan: Plan, ops: list[Op], share: int, update_s_per_byte: float
                 ) -> tuple[float, tuple[float, ...], tuple[int, ...], float]:
    """Add the plan's state to ``ops`` (NOTE [state in the program]); returns the static bytes, each weight
    fetch's bytes and layer, and the bytes of state kept in the pool."""
    layers = workload.layers
    param = [l.param_bytes / share for l in layers]
    r = workload.optimizer_bytes_per_param_byte
    if not plan.state:
        return workload.static_bytes / share, (), (), 0.0
    weights, grads, opt, depth = _state_placements(workload, plan)
    static = sum(p * ((not w) + (not g) + r * (not o)) for p, w, g, o in zip(param, weights, grads, opt))
    pool = sum(p * (w + r * o) for p, w, o in zip(param, weights, opt))
    fetch_bytes: list[float] = []
    fetch_layer: list[int] = []

    def new_fetch(i: int) -> int:
        fetch_bytes.append(param[i])
        fetch_layer.append(i)
        return len(fetch_bytes) - 1

    for kind in (FORWARD, BACKWARD):
        stream = [op for op in ops if op.kind == kind and weights[op.layer] and param[op.layer] > 0]
        ids = [new_fetch(op.layer) for op in stream]
        started = [False] * len(stream)
        for p, op in enumerate(stream):
            if not started[p]:  # on demand: nothing fetched it ahead
                op.reach_fetch = (ids[p],)
                op.alloc_bytes += param[op.layer]
                started[p] = True
            ahead = [q for q in range(p + 1, min(p + depth[op.layer], len(stream) - 1) + 1) if not started[q]]
            for q in ahead:
                started[q] = True
            op.start_fetch = tuple(ids[q] for q in ahead)
            op.alloc_bytes += sum(param[stream[q].layer] for q in ahead)
            op.need_fetch = ids[p]
            op.free_bytes += param[op.layer]
    for op in ops:
        if op.kind == RECOMPUTE and weights[op.layer] and param[op.layer] > 0:
            op.reach_fetch = (new_fetch(op.layer),)
            op.need_fetch = op.reach_fetch[0]
            op.alloc_bytes += param[op.layer]
            op.free_bytes += param[op.layer]
        elif op.kind == BACKWARD and opt[op.layer] and param[op.layer] > 0:
            op.update_bytes = param[op.layer]
            op.update_s = param[op.layer] * update_s_per_byte
            op.update_back = not weights[op.layer]
            if grads[op.layer]:
                op.alloc_bytes += param[op.layer]
                op.update_frees = True
    return static, tuple(fetch_bytes), tuple(fetch_layer), pool


def build_program(workload: Workload, plan: Plan, device: Device, *, model_parallel: bool, n_devices: int,
                  bucket_bytes: float, update_s_per_param_byte: float = 0.0) -> Program:
    """The program of one device of ``n_devices`` (see ``docs/timing-model.md`` and ``docs/simulator.md``).

    Operation times come from the device roofline, or from a layer's measured ``fwd_time_s`` / ``bwd_time_s``
    when it has them (divided by ``n_devices`` under model parallelism, like the FLOPs).

    Args:
        model_parallel: split each layer over the devices (FLOPs, bytes moved, params, output and workspace
            divided by ``n_devices``; saved tensors per NOTE [model-parallel saved bytes]); otherwise data
            parallel.
        bucket_bytes: gradient bucket size of the data-parallel all-reduce (bytes).
        update_s_per_param_byte: CPU time of an offloaded optimizer's update per parameter byte (s/B; 0: untimed).
    """
    layers = workload.layers
    n = len(layers)
    share = n_devices if model_parallel else 1
    actions, trigger = _actions(workload, plan)
    saved = tuple(_device_saved_bytes(workload, i, share) for i in range(n))
    names = workload.layer_names
    prec = workload.precision
    fwd = [roofline_s(l.fwd_flops / share, l.fwd_bytes_moved / share, device, prec) if l.fwd_time_s is None
           else l.fwd_time_s / share for l in layers]
    bwd = [roofline_s(l.bwd_flops / share, l.bwd_bytes_moved / share, device, prec) if l.bwd_time_s is None
           else l.bwd_time_s / share for l in layers]
    transient = [(l.output_bytes + l.workspace_bytes) / share for l in layers]
    collectives = n_devices > 1

    def forward(kind: int, k: int) -> Op:
        if kind == FORWARD:
            op = Op(FORWARD, k, f"F {names[k]}", fwd[k], saved[k] + transient[k], transient[k])
            op.flops, op.bytes_moved = layers[k].fwd_flops / share, layers[k].fwd_bytes_moved / share
            if actions[k] is Action.RECOMPUTE:
                op.free_bytes += saved[k]
            elif actions[k] is Action.OFFLOAD:
                op.offload = k
        else:  # re-run of F_k: regenerates S_{k+1}
            op = Op(RECOMPUTE, k, f"R {names[k]}", fwd[k], saved[k + 1] + transient[k], transient[k])
            op.flops, op.bytes_moved = layers[k].fwd_flops / share, layers[k].fwd_bytes_moved / share
        if model_parallel and collectives and layers[k].output_bytes > 0 and _exchanges(workload, k):
            op.coll_bytes, op.coll_kind, op.coll_blocks = layers[k].output_bytes, ALL_GATHER, True
            op.coll_label = f"all-gather {names[k]}"
        return op

    ops = [forward(FORWARD, i) for i in range(n)]
    end_of_forward = tuple(i for i in range(n) if actions[i] is Action.OFFLOAD and trigger[i] == -1)
    ops[-1].end_prefetch = end_of_forward
    issued_at: dict[int, list[int]] = {}
    for i in range(n - 1, -1, -1):  # the layer needed first is issued first
        if actions[i] is Action.OFFLOAD and trigger[i] >= 0:
            issued_at.setdefault(trigger[i], []).append(i)
    bucket = 0.0
    n_buckets = 0
    covered = n  # layers >= covered were regenerated by an earlier (higher) re-run
    for i in range(n - 1, -1, -1):
        if actions[i] is Action.RECOMPUTE and i < covered:
            base = recompute_base(actions, saved, i)
            covered = base + 1
            for k in range(base, i):
                op = forward(RECOMPUTE, k)
                if k == base and actions[base] is Action.OFFLOAD:
                    op.need_data = base
                    op.reach_prefetch = (base,)
                ops.append(op)
        l = layers[i]
        back = 2 * l.output_bytes / share + l.workspace_bytes / share
        op = Op(BACKWARD, i, f"B {names[i]}", bwd[i], back, back + saved[i])
        op.flops, op.bytes_moved = l.bwd_flops / share, l.bwd_bytes_moved / share
        if actions[i] is Action.OFFLOAD:
            op.need_data = i
        op.start_prefetch = tuple(issued_at.get(i, ()))
        if collectives and not model_parallel:
            bucket += l.param_bytes
            if bucket > 0 and (bucket >= bucket_bytes or i == 0):
                op.coll_bytes, op.coll_kind, op.coll_label = bucket, ALL_REDUCE, f"all-reduce bucket {n_buckets}"
                bucket = 0.0
                n_buckets += 1
        elif collectives and _exchanges(workload, i):
            grad = _input_bytes(workload, i)
            if grad > 0:
                op.coll_bytes, op.coll_kind, op.coll_blocks = grad, ALL_REDUCE, True
                op.coll_label = f"all-reduce input grad {names[i]}"
        ops.append(op)
    static, fetch_bytes, fetch_layer, pool_state = _apply_state(workload, plan, ops, share, update_s_per_param_byte)
    if not math.isfinite(static):
        raise WorkloadError(f"workload {workload.name!r}.static_bytes: got {static}; parameters x (2 + "
                            f"optimizer_bytes_per_param_byte) must be finite (each layer's bytes at most 2**60)")
    return Program(tuple(ops), saved, names, static, tuple(a is Action.OFFLOAD for a in actions), fetch_bytes,
                   fetch_layer, pool_state)
