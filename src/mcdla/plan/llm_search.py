"""Search over LLM training configurations: every valid execution of a model on a cluster, judged by ``llm_step``.

Two steps, usable apart (``mcdla search`` and ``mcdla reproduce --modern`` share them):

* :func:`enumerate_executions` lists the candidate :class:`Execution` records of ``(model, cluster, GPUs,
  global batch)`` and keeps those the record's own validation accepts (``Execution.__post_init__``,
  :func:`check_execution`, and the cluster rules of :func:`mcdla.sim.cluster_rejection`: TP inside one
  NVLink domain, offload only with a second tier), counting the rejected candidates by reason. Candidates:
  TP over the divisors of the GPU count up to a node's GPUs, CP from ``cp`` (default 1; the CP group may
  span nodes), PP over the divisors of what is left, DP the rest, EP from ``ep`` (default 1; inside
  ``dp x cp``, so it adds no GPUs); virtual stages over the divisors of the layer count (``pp > 1`` only);
  micro-batch sizes dividing the per-replica batch; recompute none/selective/full (``selective-op`` when asked
  for); SP on/off when TP > 1;
  ZeRO 0-3; offload of activations/weights/optimizer on/off when the cluster has a second tier; with
  ``recompute_layers`` the layer counts of a partial (``block``) full recompute, with ``offload_layers`` those
  of a partial activation/weight offload (default: every layer; NOTE [partial recompute and offload]). Each
  choice can be narrowed (``tp``, ``micro_batch``, ``virtual_stages``, ``sequence_parallel``, ``zero``,
  ``offloads``, ``max_pp``, ``pp``), which is how ``reproduce --modern`` searches its grid.
* :func:`evaluate_executions` runs :func:`llm_step` (the fast path) on each in chunks, in this process
  (``backend="serial"``), a local process pool (``"process"``) or a Ray cluster (``"ray"``); the results are
  identical whatever the backend (each configuration is a pure function of its inputs, reassembled in
  enumeration order). A configuration *fits* by :attr:`LlmStep.fits` (HBM and the pool share per GPU), and
  within ``memory_limit_bytes`` when a smaller device budget is given.

:func:`search` does both and ranks: best = least iteration time among the configurations that fit, ties
broken by enumeration order.

NOTE [bounded search]
A highly composite global batch multiplies the candidates (2095133040 gives 36 M on 64 GPUs), so the search is
bounded in time and memory on any input. :func:`count_candidates` counts the candidates in closed form (one
product per TP x CP x PP structure) and :func:`search` refuses more than ``max_configurations`` of them
before enumerating any. Then the enumeration is streamed (:func:`iter_executions`): a validation pass counts
the valid ones and the rejections (the progress bar's total), a second pass feeds chunks to the workers with
at most two chunks per worker in flight, and only the ``top`` fastest rows that fit are kept (a bounded heap)
unless the caller asks for every row. The pool is never larger than the CPU count or the chunk count, and an
iteration time that is not finite is refused with the configuration that gave it, so that nothing ranks
``inf`` as fastest.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.plan._parallel_map import RAY_CONNECT_TIMEOUT_S, RAY_INSTALL_HINT, process_map, ray_map
from mcdla.sim import DEFAULT_PRECISION, LlmStep, cluster_precision, cluster_rejection, llm_step
from mcdla.workload.execution import OFFLOAD_TIERS, Execution, check_execution
from mcdla.workload.op_recompute import OP_RECOMPUTE
from mcdla.workload.transformer import TransformerSpec

__all__ = ["BACKENDS", "DEFAULT_MAX_CONFIGURATIONS", "DEFAULT_RECOMPUTE", "EXECUTION_FIELDS", "OFFLOAD_CHOICES",
           "RAY_CONNECT_TIMEOUT_S", "RAY_INSTALL_HINT", "RECOMPUTE_CHOICES", "STEP_FIELDS", "Enumeration", "SearchRow",
           "SearchResult",
           "count_candidates", "divisors", "enumerate_executions", "evaluate_executions", "execution_rejection",
           "iter_executions", "rank_rows", "search"]

DEFAULT_MAX_CONFIGURATIONS = 2_000_000
"""Most candidates :func:`search` takes on by default (NOTE [bounded search]): GPT-3 175B on 1,024 GPUs with
a global batch of 1536 has 843,360 (91,584 valid, evaluated in ~13 s on one core)."""

RECOMPUTE_CHOICES = ("none", "selective", OP_RECOMPUTE, "full")
"""Recompute choices a search accepts (``selective-op``, torchtitan's op policy, only where it is modelled:
NOTE [op-level selective recompute] in :mod:`mcdla.workload.op_recompute`)."""
DEFAULT_RECOMPUTE = ("none", "selective", "full")
"""The recompute choices tried unless narrowed: Megatron-LM's."""
BACKENDS = ("serial", "process", "ray")
EXECUTION_FIELDS = tuple(f.name for f in fields(Execution))
"""The fields of an execution record, in the order of the CSV columns."""
STEP_FIELDS = tuple(f.name for f in fields(LlmStep))
"""The fields of a prediction, in the order of the CSV columns."""
_OFFLOAD_OFF = ((False, False, False),)
OFFLOAD_CHOICES = tuple((a, w, o) for a in (False, True) for w in (False, True) for o in (False, True))
"""Every (activations, weights, optimizer) offload switch setting."""
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?![\w-])")


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _reason(message: str) -> str:
    """A rejection message without its values: ``execution.tp: must divide the N attention heads of gpt3-175b``."""
    text = re.sub(r"got [^;]*; ", "", message)
    return _NUMBER.sub("N", text)


def execution_rejection(spec: TransformerSpec, execution: Execution, cluster: Cluster) -> str | None:
    """Why ``llm_step`` would refuse ``execution`` (the message of its ConfigError), or None if it runs: the
    model checks of :func:`check_execution`, then the cluster checks of :func:`mcdla.sim.cluster_rejection`,
    without computing any cost."""
    try:
        check_execution(execution, spec)
    except ConfigError as exc:
        return str(exc)
    return cluster_rejection(execution, cluster)


@dataclass(frozen=True, slots=True)
class Enumeration:
    """The valid executions (in enumeration order) and what was rejected.

    Attributes:
        executions: the candidates that pass validation (empty after a streamed :func:`search`, which keeps
            only their count).
        candidates: candidates considered (valid + rejected).
        rejected: reason (the validation message without its values) -> number of candidates.
        valid: number of valid candidates.
    """

    executions: tuple[Execution, ...]
    candidates: int
    rejected: dict[str, int]
    valid: int

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"search.{name}: got {brief(value)}; must be an integer >= 1")
    return value


def _choices(name: str, values: Sequence[int] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    return tuple(_positive(name, v) for v in values)


@dataclass(frozen=True, slots=True)
class _Space:
    """The checked search space: the structure choices and the per-structure choices."""

    gpus: int
    global_batch: int
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    tp_only: tuple[int, ...] | None
    mb_only: tuple[int, ...] | None
    max_pp: int | None
    pp_only: tuple[int, ...] | None
    v_choices: tuple[int, ...]
    v_one: bool  # whether an unpipelined structure may run (virtual_stages 1 allowed)
    sp_tp: tuple[bool, ...]
    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    offload_sets: tuple[tuple[bool, bool, bool], ...]
    no_tier: bool
    dp_overlap: bool
    tiers: tuple[str, ...] = ("host",)
    cpu_optimizer: tuple[bool, ...] = (False,)
    recompute_layers: tuple[int | None, ...] = (None,)
    offload_layers: tuple[int | None, ...] = (None,)

    def recompute_counts(self, recompute: str) -> tuple[int | None, ...]:
        """The ``recompute_num_layers`` tried with one recompute choice (only ``full`` takes a count)."""
        return self.recompute_layers if recompute == "full" else (None,)

    def offload_counts(self, activations: bool, weights: bool) -> tuple[int | None, ...]:
        """The ``offload_num_layers`` tried with one offload choice (only activations or weights take one)."""
        return self.offload_layers if activations or weights else (None,)

    def variants(self, weights: bool, optimizer: bool) -> list[dict[str, Any]]:
        """The (tier, CPU optimizer) settings one offload choice is tried with, as Execution fields beyond the
        defaults (an empty dict: host tier, Adam on the GPU)."""
        out: list[dict[str, Any]] = []
        for tier in dict.fromkeys(self.tiers if weights or optimizer else ("host",)):
            for cpu in dict.fromkeys(self.cpu_optimizer if optimizer else (False,)):
                out.append({k: v for k, v in (("offload_tier", tier), ("cpu_optimizer", cpu))
                            if v != {"offload_tier": "host", "cpu_optimizer": False}[k]})
        return out

    @property
    def tail(self) -> int:
        """Candidates per structure: recompute choices with their layer counts x offload choices with their layer
        counts and tier variants."""
        return (sum(len(self.recompute_counts(r)) for r in self.recompute)
                * sum(len(self.offload_counts(a, w)) * len(self.variants(w, o)) for a, w, o in self.offload_sets))


def _space(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int, cp: Sequence[int] = (1,),
           max_virtual_stages: int | None = None, recompute: Sequence[str] = DEFAULT_RECOMPUTE,
           zero: Sequence[int] = (0, 1, 2, 3), offload: bool | None = None, dp_overlap: bool = False,
           tp: Sequence[int] | None = None, micro_batch: Sequence[int] | None = None,
           virtual_stages: Sequence[int] | None = None, sequence_parallel: Sequence[bool] = (False, True),
           offloads: Sequence[tuple[bool, bool, bool]] | None = None, max_pp: int | None = None,
           ep: Sequence[int] = (1,), pp: Sequence[int] | None = None, tiers: Sequence[str] = ("host",),
           cpu_optimizer: Sequence[bool] = (False,), recompute_layers: Sequence[int | None] = (None,),
           offload_layers: Sequence[int | None] = (None,)) -> _Space:
    """Check the search arguments (the options of :func:`enumerate_executions`) into a :class:`_Space`."""
    _positive("gpus", gpus)
    _positive("global_batch", global_batch)
    for value in cp:
        _positive("cp", value)
    for value in ep:
        _positive("ep", value)
    if max_virtual_stages is not None:
        _positive("max_virtual_stages", max_virtual_stages)
    if max_pp is not None:
        _positive("max_pp", max_pp)
    pp_only = _choices("pp", pp)
    tp_only, mb_only, v_only = (_choices("tp", tp), _choices("micro_batch", micro_batch),
                                _choices("virtual_stages", virtual_stages))
    for r in recompute:
        if r not in RECOMPUTE_CHOICES:
            raise ConfigError(f"search.recompute: got {brief(r)}; must be one of {', '.join(RECOMPUTE_CHOICES)}")
    for z in zero:
        if isinstance(z, bool) or z not in (0, 1, 2, 3):
            raise ConfigError(f"search.zero: got {brief(z)}; must be 0, 1, 2 or 3")
    for sp in sequence_parallel:
        if not isinstance(sp, bool):
            raise ConfigError(f"search.sequence_parallel: got {brief(sp)}; must be true or false")
    for switches in offloads or ():
        if len(switches) != 3 or not all(isinstance(x, bool) for x in switches):
            raise ConfigError(f"search.offloads: got {brief(switches)}; must be (activations, weights, optimizer) booleans")
    for tier in tiers:
        if tier not in OFFLOAD_TIERS:
            raise ConfigError(f"search.tiers: got {brief(tier)}; must be one of {', '.join(OFFLOAD_TIERS)}")
    for cpu in cpu_optimizer:
        if not isinstance(cpu, bool):
            raise ConfigError(f"search.cpu_optimizer: got {brief(cpu)}; must be true or false")
    for name, counts in (("recompute_layers", recompute_layers), ("offload_layers", offload_layers)):
        if not counts:
            raise ConfigError(f"search.{name}: got none; must list layer counts (integers >= 0) or all")
        for n in counts:
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
                raise ConfigError(f"search.{name}: got {brief(n)}; must be an integer >= 0 or all (None)")
    no_tier = cluster.offload is None
    use_offload = not no_tier if offload is None else offload
    tried = tuple(offloads) if offloads is not None else OFFLOAD_CHOICES
    v_choices = tuple(v for v in divisors(spec.layers) if (max_virtual_stages is None or v <= max_virtual_stages)
                      and (v_only is None or v in v_only))
    return _Space(gpus=gpus, global_batch=global_batch, cp=tuple(sorted(set(cp))), ep=tuple(sorted(set(ep))),
                  tp_only=tp_only, mb_only=mb_only,
                  max_pp=max_pp, pp_only=pp_only, v_choices=v_choices, v_one=v_only is None or 1 in v_only,
                  sp_tp=tuple(dict.fromkeys(sequence_parallel)), zero=tuple(zero), recompute=tuple(recompute),
                  offload_sets=tried if use_offload else _OFFLOAD_OFF, no_tier=no_tier, dp_overlap=dp_overlap,
                  tiers=tuple(tiers), cpu_optimizer=tuple(cpu_optimizer),
                  recompute_layers=tuple(dict.fromkeys(recompute_layers)),
                  offload_layers=tuple(dict.fromkeys(offload_layers)))


def _structures(cluster: Cluster, sp: _Space) -> Iterator[tuple[int, int, int, int, tuple[int, ...], list[int]]]:
    """Every ``(tp, cp, pp, dp, virtual-stage choices, micro-batch choices)`` of the enumeration, in order."""
    gpus = sp.gpus
    for t in (d for d in divisors(gpus) if d <= cluster.gpus_per_node and (sp.tp_only is None or d in sp.tp_only)):
        for c in sp.cp:
            if (gpus // t) % c:
                continue  # tp * cp must divide the GPU count: not a factorisation, not a candidate
            rest = gpus // (t * c)
            for pp in (d for d in divisors(rest) if (sp.max_pp is None or d <= sp.max_pp)
                       and (sp.pp_only is None or d in sp.pp_only)):
                dp = rest // pp
                mbs = divisors(sp.global_batch // dp) if sp.global_batch % dp == 0 else [1]
                if sp.mb_only is not None:
                    mbs = [mb for mb in mbs if mb in sp.mb_only] or [min(sp.mb_only)]
                yield t, c, pp, dp, (sp.v_choices if pp > 1 else (1,) if sp.v_one else ()), mbs


def count_candidates(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int, **space: Any) -> int:
    """How many candidates :func:`enumerate_executions` considers (same options), in closed form per structure
    (no candidate is built): the bound :func:`search` checks first (NOTE [bounded search])."""
    sp = _space(spec, cluster, gpus=gpus, global_batch=global_batch, **space)
    tail = sp.tail
    return sum(len(vs) * (len(sp.sp_tp) if t > 1 else 1) * len(sp.zero) * len(mbs) * len(sp.ep) * tail
               for t, _, _, _, vs, mbs in _structures(cluster, sp))


def iter_executions(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int,
                    rejected: Counter[str] | None = None, **space: Any) -> Iterator[Execution]:
    """The valid candidates of :func:`enumerate_executions` (same options), one at a time, in the same order;
    each rejected candidate is counted in ``rejected`` (by reason) as the iteration passes it."""
    sp = _space(spec, cluster, gpus=gpus, global_batch=global_batch, **space)
    rejected = Counter() if rejected is None else rejected
    # recompute and offload rarely decide validity on their own (offload only with no tier, selective-op only
    # where it is modelled: checked per candidate below), so a structure rejected counts once per (recompute,
    # offload) choice
    tail = sp.tail
    for t, c, pp, dp, vs, mbs in _structures(cluster, sp):
        for v in vs:
            for seq_par in (sp.sp_tp if t > 1 else (False,)):
                for z, mb, x in itertools.product(sp.zero, mbs, sp.ep):
                    base = dict(gpus=gpus, tp=t, pp=pp, dp=dp, cp=c, virtual_stages=v, sequence_parallel=seq_par,
                                zero=z, micro_batch=mb, global_batch=global_batch, dp_overlap=sp.dp_overlap, ep=x)
                    try:
                        probe = Execution(**base)  # type: ignore[arg-type]
                    except ConfigError as exc:
                        rejected[_reason(str(exc))] += tail
                        continue
                    why = execution_rejection(spec, probe, cluster)
                    if why is not None:
                        rejected[_reason(why)] += tail
                        continue
                    for r in sp.recompute:
                        for act, wts, opt in sp.offload_sets:
                            for rn, on, variant in itertools.product(sp.recompute_counts(r),
                                                                     sp.offload_counts(act, wts),
                                                                     sp.variants(wts, opt)):
                                try:
                                    e = Execution(**base, recompute=r, offload_activations=act,  # type: ignore[arg-type]
                                                  offload_weights=wts, offload_optimizer=opt,
                                                  recompute_num_layers=rn, offload_num_layers=on, **variant)
                                except ConfigError as exc:  # both layer counts at once
                                    rejected[_reason(str(exc))] += 1
                                    continue
                                counted = rn is not None or on is not None
                                why = (execution_rejection(spec, e, cluster)
                                       if (sp.no_tier and (act or wts or opt)) or variant or counted
                                       or r == OP_RECOMPUTE else None)
                                if why is not None:
                                    rejected[_reason(why)] += 1
                                else:
                                    yield e


def enumerate_executions(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int,
                         **space: Any) -> Enumeration:
    """Every candidate execution of ``spec`` on ``gpus`` GPUs of ``cluster`` (module docstring), validated.

    Options (``space``): ``cp`` and ``ep`` degrees (default (1,) each); ``max_virtual_stages`` bounds the
    interleaving (None: any divisor of the layer count); ``recompute`` and ``zero`` choices; ``offload=None``
    tries the offload switches when the cluster has a second tier, ``False`` never, ``True`` always (and they
    are rejected without a tier); ``dp_overlap``. The narrowing options keep only the listed values (None: all): ``tp`` degrees,
    ``micro_batch`` sizes, ``virtual_stages``, ``sequence_parallel`` settings tried when TP > 1 (TP 1 runs
    without), ``offloads`` as (activations, weights, optimizer) switches in the order to try, ``pp`` depths,
    and ``max_pp`` the deepest pipeline. ``tiers`` (``host``, ``nvme``) are tried for every candidate that
    offloads weights or optimizer state, and ``cpu_optimizer`` settings (ZeRO-Offload's Adam on the CPU) for every
    one that offloads optimizer state; the defaults keep the host tier and the GPU's Adam. ``recompute_layers``
    (layer counts per model chunk, None = every layer) are tried for every ``full`` recompute (Megatron's
    ``block`` method), ``offload_layers`` for every candidate that offloads activations or weights; a count past
    a chunk's layers, or both counts at once, is a rejected candidate.
    """
    rejected: Counter[str] = Counter()
    valid = tuple(iter_executions(spec, cluster, gpus=gpus, global_batch=global_batch, rejected=rejected, **space))
    return Enumeration(executions=valid, candidates=len(valid) + sum(rejected.values()),
                       rejected=dict(rejected.most_common()), valid=len(valid))


@dataclass(frozen=True, slots=True)
class SearchRow:
    """One evaluated configuration: its index in the enumeration, the execution, the prediction, and whether it
    fits the memory limits."""

    index: int
    execution: Execution
    step: LlmStep
    fits: bool


@dataclass(frozen=True, slots=True)
class _Context:
    spec: TransformerSpec
    cluster: Cluster
    memory_limit_bytes: float
    precision: str = DEFAULT_PRECISION


def _evaluate_steps(context: _Context, executions: Iterable[Execution]) -> list[tuple[LlmStep, bool]]:
    """``llm_step`` of each execution -> (step, fits within the memory limits).

    An iteration time that is not finite is refused (NOTE [bounded search]), naming the configuration.
    """
    out = []
    for e in executions:
        step = llm_step(context.spec, e, context.cluster, precision=context.precision)
        if not math.isfinite(step.iteration_s):
            raise ConfigError(f"search: got iteration_s = {step.iteration_s} for tp={e.tp} pp={e.pp} dp={e.dp} "
                              f"cp={e.cp} micro_batch={e.micro_batch}; the system's figures give no finite time")
        out.append((step, step.fits and step.device_bytes <= context.memory_limit_bytes))
    return out


def _evaluate_chunk(context: _Context, chunk: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """:func:`_evaluate_steps` of executions given as their field values (what a worker is sent) -> (step field
    values..., fits)."""
    executions = (Execution(**dict(zip(EXECUTION_FIELDS, values))) for values in chunk)
    return [tuple(getattr(step, name) for name in STEP_FIELDS) + (fits,)
            for step, fits in _evaluate_steps(context, executions)]


def _pool_size(workers: int, chunks: int | None) -> int:
    """Workers actually started: at most the CPU count and (when known) the number of chunks."""
    return max(1, min(workers, os.cpu_count() or 1, chunks if chunks is not None else workers))


def _evaluate_stream(spec: TransformerSpec, cluster: Cluster, executions: Iterable[Execution], *,
                     expected: int, memory_limit_bytes: float | None, backend: str, workers: int | None, chunk_size: int | None,
                     ray_address: str | None, precision: str = DEFAULT_PRECISION) -> Iterator[list[SearchRow]]:
    """Evaluate ``executions`` (about ``expected`` of them, to size the chunks) chunk by chunk, in order, at
    ``precision``."""
    if backend not in BACKENDS:
        raise ConfigError(f"search.backend: got {brief(backend)}; must be one of {', '.join(BACKENDS)}")
    workers = os.cpu_count() or 1 if workers is None else _positive("workers", workers)
    limit = cluster.device.hbm_bytes if memory_limit_bytes is None else memory_limit_bytes
    if not limit > 0:
        raise ConfigError(f"search.memory_limit_bytes: got {brief(limit)}; must be > 0")
    cluster_precision(cluster, precision)  # a GPU without that peak fails here, once, not in every worker
    context = _Context(spec=spec, cluster=cluster, memory_limit_bytes=limit, precision=precision)
    size = chunk_size if chunk_size is not None else max(
        32, min(2048, math.ceil(expected / (min(workers, os.cpu_count() or 1) * 8)) if expected else 1))
    _positive("chunk_size", size)
    pool = _pool_size(workers, math.ceil(expected / size) if expected else 1)
    source = iter(executions)
    batches = iter(lambda: list(itertools.islice(source, size)), [])
    held: dict[int, list[Execution]] = {}  # chunk number -> its executions, until its results come back

    def as_values(numbered: Iterator[tuple[int, list[Execution]]]) -> Iterator[list[tuple[Any, ...]]]:
        for i, batch in numbered:
            held[i] = batch
            yield [tuple(getattr(e, name) for name in EXECUTION_FIELDS) for e in batch]

    if backend == "serial":  # in this process: the executions and steps themselves, no round trip as values
        index = 0
        for batch in batches:
            rows = [SearchRow(index=index + k, execution=e, step=step, fits=fits)
                    for k, (e, (step, fits)) in enumerate(zip(batch, _evaluate_steps(context, batch)))]
            index += len(rows)
            yield rows
        return
    values = as_values(enumerate(batches))
    results: Iterator[list[tuple[Any, ...]]]
    if backend == "process":
        results = process_map(_evaluate_chunk, context, values, pool)
    else:
        results = ray_map(_evaluate_chunk, context, values, pool, ray_address)
    index = 0
    try:
        for i, out in enumerate(results):
            rows = []
            for e, step_values in zip(held.pop(i), out):
                step = LlmStep(**dict(zip(STEP_FIELDS, step_values[:-1])))
                rows.append(SearchRow(index=index, execution=e, step=step, fits=bool(step_values[-1])))
                index += 1
            yield rows
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # now, not when a traceback lets go of it: stops the pool or shuts Ray down


def evaluate_executions(spec: TransformerSpec, cluster: Cluster, executions: Sequence[Execution], *,
                        memory_limit_bytes: float | None = None, backend: str = "serial",
                        workers: int | None = None, chunk_size: int | None = None, ray_address: str | None = None,
                        progress: Callable[[int], None] | None = None,
                        precision: str = DEFAULT_PRECISION) -> list[SearchRow]:
    """``llm_step`` (fast path) of every execution at ``precision``, in the given order (module docstring).

    ``workers`` (default ``os.cpu_count()``) sizes the process pool or the local Ray instance, capped at the
    CPU count and the number of chunks; ``progress`` is called with the number of configurations each
    finished chunk held.
    """
    rows: list[SearchRow] = []
    for chunk in _evaluate_stream(spec, cluster, executions, expected=len(executions),
                                  memory_limit_bytes=memory_limit_bytes, backend=backend, workers=workers,
                                  chunk_size=chunk_size, ray_address=ray_address, precision=precision):
        rows += chunk
        if progress is not None:
            progress(len(chunk))
    return rows


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A search: the enumeration, the evaluated rows and the ranking.

    ``ranked`` holds the rows that fit, fastest first (ties by enumeration order): all of them, or the ``top``
    fastest when the search was given ``top``; ``best`` is its first or None when nothing fits. ``rows`` is
    every evaluated row in enumeration order when the search kept them (``keep_rows``), else empty.
    ``fitting`` counts the rows that fit and ``least_device_bytes`` is the least device memory of any row (None
    without rows).
    """

    enumeration: Enumeration
    rows: tuple[SearchRow, ...]
    ranked: tuple[SearchRow, ...]
    fitting: int
    least_device_bytes: float | None

    @property
    def best(self) -> SearchRow | None:
        return self.ranked[0] if self.ranked else None


def rank_rows(rows: Iterable[SearchRow]) -> tuple[SearchRow, ...]:
    """The rows that fit, by iteration time then enumeration index."""
    return tuple(sorted((r for r in rows if r.fits), key=lambda r: (r.step.iteration_s, r.index)))


class _TopRows:
    """The ``top`` fastest fitting rows seen so far (all when ``top`` is None), in a heap of bounded size."""

    def __init__(self, top: int | None) -> None:
        self.top = top
        self.heap: list[tuple[float, int, SearchRow]] = []  # (-iteration_s, -index, row): the slowest on top
        self.fitting = 0

    def add(self, row: SearchRow) -> None:
        if not row.fits:
            return
        self.fitting += 1
        item = (-row.step.iteration_s, -row.index, row)
        if self.top is None or len(self.heap) < self.top:
            heapq.heappush(self.heap, item)
        elif item > self.heap[0]:
            heapq.heapreplace(self.heap, item)

    def ranked(self) -> tuple[SearchRow, ...]:
        return rank_rows(row for _, _, row in self.heap)


def search(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int,
           memory_limit_bytes: float | None = None, backend: str = "serial", workers: int | None = None,
           chunk_size: int | None = None, ray_address: str | None = None,
           progress: Callable[[int], None] | None = None,
           on_enumerated: Callable[[Enumeration], None] | None = None,
           max_configurations: int = DEFAULT_MAX_CONFIGURATIONS, top: int | None = None, keep_rows: bool = True,
           precision: str = DEFAULT_PRECISION,
           on_row: Callable[[SearchRow], None] | None = None, **space: Any) -> SearchResult:
    """Enumerate (``space``: the options of :func:`enumerate_executions`), evaluate and rank, bounded (module
    docstring, NOTE [bounded search]).

    More than ``max_configurations`` candidates (:func:`count_candidates`) is a ConfigError before any work.
    ``on_enumerated`` sees the enumeration's counts (``executions`` empty) before the evaluation starts (to
    size a progress bar), and the result's enumeration holds the executions only with ``keep_rows``;
    ``on_row`` sees every evaluated row in enumeration order (to stream them to a file); ``top`` keeps only the
    fastest ``top`` rows that fit; ``keep_rows=False`` keeps no other row.
    """
    space = dict(gpus=gpus, global_batch=global_batch, **space)
    _positive("max_configurations", max_configurations)
    if top is not None:
        _positive("top", top)
    candidates = count_candidates(spec, cluster, **space)  # type: ignore[arg-type]
    if candidates > max_configurations:
        raise ConfigError(f"search: got {candidates} candidate configurations of {spec.name} on {gpus} GPUs with a "
                          f"global batch of {global_batch}; must be at most max_configurations = "
                          f"{max_configurations} (narrow the space or raise the limit)")
    rejected: Counter[str] = Counter()
    valid = sum(1 for _ in iter_executions(spec, cluster, rejected=rejected, **space))
    enumeration = Enumeration(executions=(), candidates=candidates, rejected=dict(rejected.most_common()),
                              valid=valid)
    if on_enumerated is not None:
        on_enumerated(enumeration)
    kept: list[SearchRow] = []
    best = _TopRows(top)
    least: float | None = None
    stream = iter_executions(spec, cluster, **space)
    chunks = _evaluate_stream(spec, cluster, stream, expected=valid, memory_limit_bytes=memory_limit_bytes,
                              backend=backend, workers=workers,
                              chunk_size=chunk_size, ray_address=ray_address, precision=precision)
    try:
        for chunk in chunks:
            for row in chunk:
                best.add(row)
                least = row.step.device_bytes if least is None else min(least, row.step.device_bytes)
                if on_row is not None:
                    on_row(row)
            if keep_rows:
                kept += chunk
            if progress is not None:
                progress(len(chunk))
    finally:
        chunks.close()
    if keep_rows:
        enumeration = dataclasses.replace(enumeration, executions=tuple(r.execution for r in kept))
    return SearchResult(enumeration=enumeration, rows=tuple(kept), ranked=best.ranked(), fitting=best.fitting,
                        least_device_bytes=least)
