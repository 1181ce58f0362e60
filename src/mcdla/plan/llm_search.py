"""Search over LLM training configurations: every valid execution of a model on a cluster, judged by ``llm_step``.

Two steps, usable apart (``mcdla search`` and ``mcdla reproduce --modern`` share them):

* :func:`enumerate_executions` lists the candidate :class:`Execution` records of ``(model, cluster, GPUs,
  global batch)`` and keeps those the record's own validation accepts (``Execution.__post_init__``,
  :func:`check_execution`, and the cluster rules of :func:`mcdla.sim.cluster_rejection`: TP x CP inside one
  NVLink domain, offload only with a second tier), counting the rejected candidates by reason. Candidates:
  TP over the divisors of the GPU count up to a node's GPUs, CP from ``cp`` (default 1), PP over the divisors
  of what is left, DP the rest; virtual stages over the divisors of the layer count (``pp > 1`` only);
  micro-batch sizes dividing the per-replica batch; recompute none/selective/full; SP on/off when TP > 1;
  ZeRO 0-3; offload of activations/weights/optimizer on/off when the cluster has a second tier. Each choice
  can be narrowed (``tp``, ``micro_batch``, ``virtual_stages``, ``sequence_parallel``, ``zero``, ``offloads``,
  ``max_pp``), which is how ``reproduce --modern`` searches its grid.
* :func:`evaluate_executions` runs :func:`llm_step` (the fast path) on each in chunks, in this process
  (``backend="serial"``), a local process pool (``"process"``) or a Ray cluster (``"ray"``); the results are
  identical whatever the backend (each configuration is a pure function of its inputs, reassembled in
  enumeration order). A configuration *fits* by :attr:`LlmStep.fits` (HBM and the pool share per GPU), and
  within ``memory_limit_bytes`` when a smaller device budget is given.

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
from mcdla.hardware.cluster import Cluster
from mcdla.sim import LlmStep, cluster_rejection, llm_step
from mcdla.workload.execution import OFFLOAD_TIERS, Execution, check_execution
from mcdla.workload.transformer import TransformerSpec

__all__ = ["BACKENDS", "EXECUTION_FIELDS", "OFFLOAD_CHOICES", "RAY_INSTALL_HINT", "RECOMPUTE_CHOICES", "STEP_FIELDS",
           "Enumeration", "SearchRow", "SearchResult", "divisors", "enumerate_executions", "evaluate_executions",
           "execution_rejection", "rank_rows", "search"]

RECOMPUTE_CHOICES = ("none", "selective", "full")
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


def _choices(name: str, values: Sequence[int] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    return tuple(_positive(name, v) for v in values)


def _tier_variants(weights: bool, optimizer: bool, tiers: Sequence[str],
                   cpu_optimizer: Sequence[bool]) -> list[dict[str, Any]]:
    """The (tier, CPU optimizer) settings one offload choice is tried with, as Execution fields beyond the
    defaults (an empty dict: host tier, Adam on the GPU)."""
    out: list[dict[str, Any]] = []
    for tier in dict.fromkeys(tiers if weights or optimizer else ("host",)):
        for cpu in dict.fromkeys(cpu_optimizer if optimizer else (False,)):
            out.append({k: v for k, v in (("offload_tier", tier), ("cpu_optimizer", cpu))
                        if v != {"offload_tier": "host", "cpu_optimizer": False}[k]})
    return out


def enumerate_executions(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int,
                         cp: Sequence[int] = (1,), max_virtual_stages: int | None = None,
                         recompute: Sequence[str] = RECOMPUTE_CHOICES, zero: Sequence[int] = (0, 1, 2, 3),
                         offload: bool | None = None, dp_overlap: bool = False, tp: Sequence[int] | None = None,
                         micro_batch: Sequence[int] | None = None, virtual_stages: Sequence[int] | None = None,
                         sequence_parallel: Sequence[bool] = (False, True),
                         offloads: Sequence[tuple[bool, bool, bool]] | None = None,
                         max_pp: int | None = None, tiers: Sequence[str] = ("host",),
                         cpu_optimizer: Sequence[bool] = (False,)) -> Enumeration:
    """Every candidate execution of ``spec`` on ``gpus`` GPUs of ``cluster`` (module docstring), validated.

    ``offload=None`` tries the offload switches when the cluster has a second tier, ``False`` never, ``True``
    always (and they are rejected without a tier). ``max_virtual_stages`` bounds the interleaving (None: any
    divisor of the layer count). The narrowing options keep only the listed values (None: all):
    ``tp`` degrees, ``micro_batch`` sizes, ``virtual_stages``, ``sequence_parallel`` settings tried when TP > 1
    (TP 1 runs without), ``offloads`` as (activations, weights, optimizer) switches in the order to try, and
    ``max_pp`` the deepest pipeline. ``tiers`` (``host``, ``nvme``) are tried for every candidate that
    offloads weights or optimizer state, and ``cpu_optimizer`` settings (ZeRO-Offload's Adam on the CPU) for
    every one that offloads optimizer state; the defaults keep the host tier and the GPU's Adam.
    """
    _positive("gpus", gpus)
    _positive("global_batch", global_batch)
    for value in cp:
        _positive("cp", value)
    if max_virtual_stages is not None:
        _positive("max_virtual_stages", max_virtual_stages)
    if max_pp is not None:
        _positive("max_pp", max_pp)
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
    no_tier = cluster.offload is None
    use_offload = not no_tier if offload is None else offload
    tried = tuple(offloads) if offloads is not None else OFFLOAD_CHOICES
    offload_sets = tried if use_offload else _OFFLOAD_OFF
    # recompute and offload never decide validity on their own (offload only with no tier, checked per
    # candidate below when asked for), so a structure rejected counts once per (recompute, offload) choice
    tail = len(recompute) * len(offload_sets)
    v_choices = [v for v in divisors(spec.layers) if (max_virtual_stages is None or v <= max_virtual_stages)
                 and (v_only is None or v in v_only)]
    sp_tp = tuple(dict.fromkeys(sequence_parallel))

    valid: list[Execution] = []
    rejected: Counter[str] = Counter()
    candidates = 0
    for t in (d for d in divisors(gpus) if d <= cluster.gpus_per_node and (tp_only is None or d in tp_only)):
        for c in sorted(set(cp)):
            if (gpus // t) % c:
                continue  # tp * cp must divide the GPU count: not a factorisation, not a candidate
            rest = gpus // (t * c)
            for pp in (d for d in divisors(rest) if max_pp is None or d <= max_pp):
                dp = rest // pp
                mbs = divisors(global_batch // dp) if global_batch % dp == 0 else [1]
                if mb_only is not None:
                    mbs = [mb for mb in mbs if mb in mb_only] or [min(mb_only)]
                for v in (v_choices if pp > 1 else [1] if v_only is None or 1 in v_only else []):
                    for sp in (sp_tp if t > 1 else (False,)):
                        for z in zero:
                            for mb in mbs:
                                base = dict(gpus=gpus, tp=t, pp=pp, dp=dp, cp=c, virtual_stages=v,
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
                                    for act, wts, opt in offload_sets:
                                        variants = _tier_variants(wts, opt, tiers, cpu_optimizer)
                                        candidates += len(variants) - 1
                                        for variant in variants:
                                            e = Execution(**base, recompute=r, offload_activations=act,  # type: ignore[arg-type]
                                                          offload_weights=wts, offload_optimizer=opt, **variant)
                                            why = (execution_rejection(spec, e, cluster)
                                                   if (no_tier and (act or wts or opt)) or variant else None)
                                            if why is not None:
                                                rejected[_reason(why)] += 1
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
    cluster: Cluster
    memory_limit_bytes: float


def _evaluate_chunk(context: _Context, chunk: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``llm_step`` of each execution (given as its field values) -> (step field values..., fits)."""
    out = []
    for values in chunk:
        e = Execution(**dict(zip(EXECUTION_FIELDS, values)))
        step = llm_step(context.spec, e, context.cluster)
        fits = step.fits and step.device_bytes <= context.memory_limit_bytes
        out.append(tuple(getattr(step, name) for name in STEP_FIELDS) + (fits,))
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


def evaluate_executions(spec: TransformerSpec, cluster: Cluster, executions: Sequence[Execution], *,
                        memory_limit_bytes: float | None = None, backend: str = "serial",
                        workers: int | None = None, chunk_size: int | None = None,
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
    context = _Context(spec=spec, cluster=cluster, memory_limit_bytes=limit)
    n = len(executions)
    size = chunk_size if chunk_size is not None else max(32, min(2048, math.ceil(n / (workers * 8)) if n else 1))
    _positive("chunk_size", size)
    rows_in = [tuple(getattr(e, name) for name in EXECUTION_FIELDS) for e in executions]
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
            step = LlmStep(**dict(zip(STEP_FIELDS, values[:-1])))
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


def search(spec: TransformerSpec, cluster: Cluster, *, gpus: int, global_batch: int,
           memory_limit_bytes: float | None = None, backend: str = "serial", workers: int | None = None,
           chunk_size: int | None = None, ray_address: str | None = None,
           progress: Callable[[int], None] | None = None,
           on_enumerated: Callable[[Enumeration], None] | None = None, **space: Any) -> SearchResult:
    """Enumerate (``space``: the options of :func:`enumerate_executions`), evaluate and rank (module
    docstring); ``on_enumerated`` sees the enumeration before the evaluation starts (to size a progress bar)."""
    enumeration = enumerate_executions(spec, cluster, gpus=gpus, global_batch=global_batch, **space)
    if on_enumerated is not None:
        on_enumerated(enumeration)
    rows = evaluate_executions(spec, cluster, enumeration.executions, memory_limit_bytes=memory_limit_bytes,
                               backend=backend, workers=workers, chunk_size=chunk_size, ray_address=ray_address,
                               progress=progress)
    return SearchResult(enumeration=enumeration, rows=tuple(rows), ranked=rank_rows(rows))

