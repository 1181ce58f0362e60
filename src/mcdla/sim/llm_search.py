"""Search over LLM training configurations: every valid execution of a model on a cluster, judged by ``llm_step``.

Two steps, usable apart (``mcdla search`` and ``mcdla reproduce --modern`` share them):

* :func:`enumerate_executions` lists the candidate :class:`Execution` records of ``(model, cluster, GPUs,
  global batch)`` and keeps those the record's own validation accepts (``Execution.__post_init__``,
  :func:`check_execution`, and the two cluster rules of :func:`mcdla.sim.llm.stage_costs`: TP x CP inside one
  NVLink domain, offload only with a second tier), counting the rejected candidates by reason. Candidates:
  TP over the divisors of the GPU count up to a node's GPUs, CP from ``cp`` (default 1), PP over the divisors
  of what is left, DP the rest; virtual stages over the divisors of the layer count (``pp > 1`` only);
  micro-batch sizes dividing the per-replica batch; recompute none/selective/full; SP on/off when TP > 1;
  ZeRO 0-3; offload of activations/weights/optimizer on/off when the cluster has a second tier.
* :func:`evaluate_executions` runs :func:`llm_step` (the fast path) on each in chunks, in this process
  (``backend="serial"``), a local process pool (``"process"``) or a Ray cluster (``"ray"``); the results are
  identical whatever the backend (each configuration is a pure function of its inputs, reassembled in
  enumeration order). A configuration *fits* when one rank's device bytes are within ``memory_limit_bytes``
  (default: the device's HBM) and what it offloads within ``offload_capacity_bytes`` (when given).

:func:`search` does both and ranks: best = least iteration time among the configurations that fit, ties
broken by enumeration order.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from mcdla.errors import ConfigError, brief
from mcdla.sim.llm import GpuCluster, LlmStep, llm_step
from mcdla.workload.execution import Execution, check_execution
from mcdla.workload.transformer import TransformerSpec

__all__ = ["BACKENDS", "RAY_INSTALL_HINT", "RECOMPUTE_CHOICES", "Enumeration", "SearchRow", "SearchResult", "divisors",
           "enumerate_executions", "evaluate_executions", "execution_rejection", "rank_rows", "search"]

RECOMPUTE_CHOICES = ("none", "selective", "full")
BACKENDS = ("serial", "process", "ray")
_EXEC_FIELDS = tuple(f.name for f in fields(Execution))
_STEP_FIELDS = tuple(f.name for f in fields(LlmStep))
_OFFLOAD_OFF = ((False, False, False),)
_OFFLOAD_ALL = tuple((a, w, o) for a in (False, True) for w in (False, True) for o in (False, True))
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?![\w-])")


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _reason(message: str) -> str:
    """A rejection message without its values: ``execution.tp: must divide the N attention heads of gpt3-175b``."""
    text = re.sub(r"got [^;]*; ", "", message)
    return _NUMBER.sub("N", text)


def execution_rejection(spec: TransformerSpec, execution: Execution, cluster: GpuCluster) -> str | None:
    """Why ``llm_step`` would refuse ``execution`` (the message of its ConfigError), or None if it runs.

    The model checks are :func:`check_execution`; the cluster checks repeat the two of
    :func:`mcdla.sim.llm.stage_costs` (with the same wording) without computing any cost.
    """
    try:
        check_execution(execution, spec)
    except ConfigError as exc:
        return str(exc)
    e = execution
    if e.tp * e.cp > cluster.gpus_per_node:
        return (f"execution.tp: got tp*cp = {e.tp * e.cp}; must fit one NVLink domain "
                f"({cluster.gpus_per_node} GPUs per node)")
    if (e.offload_activations or e.offload_weights or e.offload_optimizer) and cluster.offload_bytes_per_s == 0:
        return "execution.offload_*: offload asked but the cluster has no second tier (offload_bytes_per_s = 0)"
    return None


@dataclass(frozen=True, slots=True)
class Enumeration:
    """The valid executions (in enumeration order) and what was rejected.

    Attributes:
        executions: the candidates that pass validation.
        candidates: candidates considered (valid + rejected).
        rejected: reason (the validation message without its values) -> number of candidates.
    """

    executions: tuple[Execution, ...]
    candidates: int
    rejected: dict[str, int]

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"search.{name}: got {brief(value)}; must be an integer >= 1")
    return value


def enumerate_executions(spec: TransformerSpec, cluster: GpuCluster, *, gpus: int, global_batch: int,
                         cp: Sequence[int] = (1,), max_virtual_stages: int | None = None,
                         recompute: Sequence[str] = RECOMPUTE_CHOICES, zero: Sequence[int] = (0, 1, 2, 3),
                         offload: bool | None = None, dp_overlap: bool = False) -> Enumeration:
    """Every candidate execution of ``spec`` on ``gpus`` GPUs of ``cluster`` (module docstring), validated.

    ``offload=None`` tries the offload switches when the cluster has a second tier (``offload_bytes_per_s >
    0``), ``False`` never, ``True`` always (and they are rejected without a tier). ``max_virtual_stages``
    bounds the interleaving (None: any divisor of the layer count).
    """
    _positive("gpus", gpus)
    _positive("global_batch", global_batch)
    for value in cp:
        _positive("cp", value)
    if max_virtual_stages is not None:
        _positive("max_virtual_stages", max_virtual_stages)
    for r in recompute:
        if r not in RECOMPUTE_CHOICES:
            raise ConfigError(f"search.recompute: got {brief(r)}; must be one of {', '.join(RECOMPUTE_CHOICES)}")
    for z in zero:
        if isinstance(z, bool) or z not in (0, 1, 2, 3):
            raise ConfigError(f"search.zero: got {brief(z)}; must be 0, 1, 2 or 3")
    use_offload = cluster.offload_bytes_per_s > 0 if offload is None else offload
    offloads = _OFFLOAD_ALL if use_offload else _OFFLOAD_OFF
    no_tier = cluster.offload_bytes_per_s == 0
    # recompute and offload never decide validity on their own (offload only with no tier, checked per
    # candidate below when asked for), so a structure rejected counts once per (recompute, offload) choice
    tail = len(recompute) * len(offloads)
    v_choices = [v for v in divisors(spec.layers) if max_virtual_stages is None or v <= max_virtual_stages]

    valid: list[Execution] = []
    rejected: Counter[str] = Counter()
    candidates = 0
    for tp in (d for d in divisors(gpus) if d <= cluster.gpus_per_node):
        for c in sorted(set(cp)):
            if (gpus // tp) % c:
                continue  # tp * cp must divide the GPU count: not a factorisation, not a candidate
            rest = gpus // (tp * c)
            for pp in divisors(rest):
                dp = rest // pp
                mbs = divisors(global_batch // dp) if global_batch % dp == 0 else [1]
                for v in (v_choices if pp > 1 else [1]):
                    for sp in ((False, True) if tp > 1 else (False,)):
                        for z in zero:
                            for mb in mbs:
                                base = dict(gpus=gpus, tp=tp, pp=pp, dp=dp, cp=c, virtual_stages=v,
                                            sequence_parallel=sp, zero=z, micro_batch=mb, global_batch=global_batch,
                                            dp_overlap=dp_overlap)
                                candidates += tail
                                try:
                                    probe = Execution(**base)  # type: ignore[arg-type]
                                except ConfigError as exc:
                                    rejected[_reason(str(exc))] += tail
                                    continue
                                why = execution_rejection(spec, probe, cluster)
                                if why is not None:
                                    rejected[_reason(why)] += tail
                                    continue
                                for r in recompute:
                                    for act, wts, opt in offloads:
                                        e = Execution(**base, recompute=r, offload_activations=act,  # type: ignore[arg-type]
                                                      offload_weights=wts, offload_optimizer=opt)
                                        if no_tier and (act or wts or opt):
                                            rejected[_reason(str(execution_rejection(spec, e, cluster)))] += 1
                                        else:
                                            valid.append(e)
    return Enumeration(executions=tuple(valid), candidates=candidates, rejected=dict(rejected.most_common()))


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
    cluster: GpuCluster
    memory_limit_bytes: float
    offload_capacity_bytes: float | None


def _evaluate_chunk(context: _Context, chunk: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``llm_step`` of each execution (given as its field values) -> (step field values..., fits)."""
    out = []
    for values in chunk:
        e = Execution(**dict(zip(_EXEC_FIELDS, values)))
        step = llm_step(context.spec, e, context.cluster)
        fits = step.device_bytes <= context.memory_limit_bytes and (
            context.offload_capacity_bytes is None or step.offloaded_bytes <= context.offload_capacity_bytes)
        out.append(tuple(getattr(step, name) for name in _STEP_FIELDS) + (fits,))
    return out


_WORKER_CONTEXT: _Context | None = None


def _init_worker(context: _Context) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = context


def _evaluate_in_worker(chunk: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    assert _WORKER_CONTEXT is not None
    return _evaluate_chunk(_WORKER_CONTEXT, chunk)


def _process_map(context: _Context, chunks: list[list[tuple[Any, ...]]], workers: int,
                 done: Callable[[int, list[tuple[Any, ...]]], None]) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn, not fork: the caller may run threads (a progress bar), which fork would copy mid-lock
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(context,)) as pool:
        pending = {pool.submit(_evaluate_in_worker, chunk): i for i, chunk in enumerate(chunks)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                done(pending.pop(future), future.result())


RAY_INSTALL_HINT = "pip install 'mcdla[ray]' (or pip install ray)"


def _ray_map(context: _Context, chunks: list[list[tuple[Any, ...]]], workers: int, address: str | None,
             done: Callable[[int, list[tuple[Any, ...]]], None]) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"search.backend: got 'ray' but the ray package is not installed; install it with "
                          f"{RAY_INSTALL_HINT}") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = " ".join(str(exc).split())[:200]
            raise ConfigError(f"search.ray_address: got {brief(address)}; cannot start or reach Ray ({first})") from None
    try:
        remote = ray.remote(_evaluate_chunk)
        context_ref = ray.put(context)
        pending = {remote.remote(context_ref, chunk): i for i, chunk in enumerate(chunks)}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                done(pending.pop(ref), ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def evaluate_executions(spec: TransformerSpec, cluster: GpuCluster, executions: Sequence[Execution], *,
                        memory_limit_bytes: float | None = None, offload_capacity_bytes: float | None = None,
                        backend: str = "serial", workers: int | None = None, chunk_size: int | None = None,
                        ray_address: str | None = None,
                        progress: Callable[[int], None] | None = None) -> list[SearchRow]:
    """``llm_step`` (fast path) of every execution, in the given order (module docstring).

    ``workers`` (default ``os.cpu_count()``) sizes the process pool or the local Ray instance; ``progress``
    is called with the number of configurations each finished chunk held.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"search.backend: got {brief(backend)}; must be one of {', '.join(BACKENDS)}")
    workers = os.cpu_count() or 1 if workers is None else _positive("workers", workers)
    limit = cluster.device.hbm_bytes if memory_limit_bytes is None else memory_limit_bytes
    if not limit > 0:
        raise ConfigError(f"search.memory_limit_bytes: got {brief(limit)}; must be > 0")
    if offload_capacity_bytes is not None and not offload_capacity_bytes >= 0:
        raise ConfigError(f"search.offload_capacity_bytes: got {brief(offload_capacity_bytes)}; must be >= 0")
    context = _Context(spec=spec, cluster=cluster, memory_limit_bytes=limit,
                       offload_capacity_bytes=offload_capacity_bytes)
    n = len(executions)
    size = chunk_size if chunk_size is not None else max(32, min(2048, math.ceil(n / (workers * 8)) if n else 1))
    _positive("chunk_size", size)
    rows_in = [tuple(getattr(e, name) for name in _EXEC_FIELDS) for e in executions]
    chunks = [rows_in[i:i + size] for i in range(0, n, size)]
    results: list[list[tuple[Any, ...]] | None] = [None] * len(chunks)

    def done(i: int, out: list[tuple[Any, ...]]) -> None:
        results[i] = out
        if progress is not None:
            progress(len(out))

    if backend == "serial" or not chunks:
        for i, chunk in enumerate(chunks):
            done(i, _evaluate_chunk(context, chunk))
    elif backend == "process":
        _process_map(context, chunks, workers, done)
    else:
        _ray_map(context, chunks, workers, ray_address, done)
    rows = []
    index = 0
    for out in results:
        assert out is not None
        for values in out:
            step = LlmStep(**dict(zip(_STEP_FIELDS, values[:-1])))
            rows.append(SearchRow(index=index, execution=executions[index], step=step, fits=bool(values[-1])))
            index += 1
    return rows


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A search: the enumeration, every evaluated row (enumeration order) and the ranking.

    ``ranked`` holds the rows that fit, fastest first (ties by enumeration order); ``best`` is its first or
    None when nothing fits.
    """

    enumeration: Enumeration
    rows: tuple[SearchRow, ...]
    ranked: tuple[SearchRow, ...]

    @property
    def best(self) -> SearchRow | None:
        return self.ranked[0] if self.ranked else None

    @property
    def fitting(self) -> int:
        return len(self.ranked)


def rank_rows(rows: Iterable[SearchRow]) -> tuple[SearchRow, ...]:
    """The rows that fit, by iteration time then enumeration index."""
    return tuple(sorted((r for r in rows if r.fits), key=lambda r: (r.step.iteration_s, r.index)))


def search(spec: TransformerSpec, cluster: GpuCluster, *, gpus: int, global_batch: int, cp: Sequence[int] = (1,),
           max_virtual_stages: int | None = None, recompute: Sequence[str] = RECOMPUTE_CHOICES,
           zero: Sequence[int] = (0, 1, 2, 3), offload: bool | None = None, dp_overlap: bool = False,
           memory_limit_bytes: float | None = None, offload_capacity_bytes: float | None = None,
           backend: str = "serial", workers: int | None = None, chunk_size: int | None = None,
           ray_address: str | None = None, progress: Callable[[int], None] | None = None,
           on_enumerated: Callable[[Enumeration], None] | None = None) -> SearchResult:
    """Enumerate, evaluate and rank (module docstring); ``on_enumerated`` sees the enumeration before the
    evaluation starts (to size a progress bar)."""
    enumeration = enumerate_executions(spec, cluster, gpus=gpus, global_batch=global_batch, cp=cp,
                                       max_virtual_stages=max_virtual_stages, recompute=recompute, zero=zero,
                                       offload=offload, dp_overlap=dp_overlap)
    if on_enumerated is not None:
        on_enumerated(enumeration)
    rows = evaluate_executions(spec, cluster, enumeration.executions, memory_limit_bytes=memory_limit_bytes,
                               offload_capacity_bytes=offload_capacity_bytes, backend=backend, workers=workers,
                               chunk_size=chunk_size, ray_address=ray_address, progress=progress)
    return SearchResult(enumeration=enumeration, rows=tuple(rows), ranked=rank_rows(rows))

