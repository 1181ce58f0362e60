"""Chunked evaluation on a local process pool or a Ray cluster, results in submission order.

The configuration search (:mod:`mcdla.plan.llm_search`) streams its candidates through one of these; each
keeps at most two chunks per worker in flight (NOTE [bounded search] there), so memory stays bounded whatever
the number of candidates. Ray is optional: a missing package, an unreachable address or a failed start is a
one-line ConfigError, and a Ctrl-C or SIGTERM shuts down what was started here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mcdla.errors import ConfigError, brief

__all__ = ["RAY_CONNECT_TIMEOUT_S", "RAY_INSTALL_HINT", "process_map", "ray_map"]

RAY_CONNECT_TIMEOUT_S = 5.0
"""Seconds to reach a Ray cluster's address before giving up (Ray itself retries for minutes)."""


_Chunk = list[tuple[Any, ...]]
_Evaluate = Callable[[Any, Sequence[tuple[Any, ...]]], _Chunk]
_WORKER: tuple[_Evaluate, Any] | None = None


def _init_worker(evaluate: _Evaluate, context: Any) -> None:
    global _WORKER
    _WORKER = (evaluate, context)


def _evaluate_in_worker(chunk: Sequence[tuple[Any, ...]]) -> _Chunk:
    assert _WORKER is not None
    evaluate, context = _WORKER
    return evaluate(context, chunk)


def _windowed(chunks: Iterator[_Chunk], window: int, submit: Callable[[_Chunk], Any],
              wait_one: Callable[[list[Any]], list[Any]], result: Callable[[Any], _Chunk]) -> Iterator[_Chunk]:
    """Results of ``chunks`` in order, with at most ``window`` submitted and not yet yielded."""
    pending: dict[Any, int] = {}
    finished: dict[int, _Chunk] = {}
    submitted = yielded = 0
    exhausted = False
    while True:
        while not exhausted and submitted - yielded < window:
            chunk = next(chunks, None)
            if chunk is None:
                exhausted = True
                break
            pending[submit(chunk)] = submitted
            submitted += 1
        while yielded in finished:
            yield finished.pop(yielded)
            yielded += 1
        if not pending:
            if exhausted and yielded == submitted:
                return
            continue
        for handle in wait_one(list(pending)):
            finished[pending.pop(handle)] = result(handle)


def process_map(evaluate: _Evaluate, context: Any, chunks: Iterator[_Chunk], workers: int) -> Iterator[_Chunk]:
    """``evaluate(context, chunk)`` of each chunk in a spawned local process pool, results in order, at most two
    chunks per worker in flight (``evaluate`` a module-level function, ``context`` picklable)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn, not fork: the caller may run threads (a progress bar), which fork would copy mid-lock
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(evaluate, context)) as pool:
        yield from _windowed(chunks, 2 * workers, lambda chunk: pool.submit(_evaluate_in_worker, chunk),
                             lambda handles: list(wait(handles, return_when=FIRST_COMPLETED)[0]),
                             lambda future: future.result())


RAY_INSTALL_HINT = "pip install 'mcdla[ray]' (or pip install ray)"


def _check_reachable(address: str) -> None:
    """Fail in :data:`RAY_CONNECT_TIMEOUT_S` unless ``address`` (``host:port`` or ``ray://host:port``) accepts a
    TCP connection; ``auto`` and other forms are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except (OSError, OverflowError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"search.ray_address: got {brief(address)}; cannot reach it within "
                          f"{RAY_CONNECT_TIMEOUT_S:g} s ({reason})") from None


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while Ray runs (main thread only), so that the ``finally`` that shuts
    Ray down runs on SIGTERM as on Ctrl-C instead of leaving its agents behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _stdout_fd_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointing at stderr for the block (what child processes inherit), restored after."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def ray_map(evaluate: _Evaluate, context: Any, chunks: Iterator[_Chunk], workers: int,
            address: str | None) -> Iterator[_Chunk]:
    """``evaluate(context, chunk)`` of each chunk on Ray (started here with ``workers`` CPUs, or the cluster at
    ``address``), results in order, at most two chunks per worker in flight; Ray is shut down after if started
    here."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"search.backend: got 'ray' but the ray package is not installed; install it with "
                          f"{RAY_INSTALL_HINT}") from None
    started = not ray.is_initialized()
    if started and address:
        _check_reachable(address)
    # Ray's own lines (a dead worker, a lost connection) go to stderr: stdout carries the results only, for this
    # process (redirect_stdout) and for the raylet, GCS and agents it starts (_stdout_fd_to_stderr).
    with _terminate_as_interrupt(), contextlib.redirect_stdout(sys.stderr):
        try:
            if started:
                try:
                    with _stdout_fd_to_stderr():  # the processes Ray starts inherit stderr as their stdout
                        if address:
                            ray.init(address=address, log_to_driver=False)
                        else:
                            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    first = " ".join(str(exc).split())[:200]
                    raise ConfigError(f"search.ray_address: got {brief(address)}; cannot start or reach Ray "
                                      f"({first})") from None
            remote = ray.remote(evaluate)
            context_ref = ray.put(context)
            yield from _windowed(chunks, 2 * workers, lambda chunk: remote.remote(context_ref, chunk),
                                 lambda refs: ray.wait(refs, num_returns=1)[0], ray.get)
        finally:
            if started:
                _shut_down_ray(ray)


def _shut_down_ray(ray: Any) -> None:
    """``ray.shutdown()``, then stop whatever Ray process this one started that outlives it.

    Interrupted inside ``ray.init`` (Ctrl-C, SIGTERM), Ray's shutdown does not reach the agents its raylet
    has started (``ray::RuntimeEnvAgent``, ``ray::DashboardAgent``), which then linger for minutes, orphaned.
    They are children of this process until the raylet goes, so they are listed first and terminated after.
    """
    import psutil

    def ray_process(p: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return p.name().startswith(("ray::", "raylet", "gcs_server")) or "ray" in " ".join(p.cmdline()[:3])
        return False

    ours = [p for p in psutil.Process().children(recursive=True) if ray_process(p)]
    ray.shutdown()
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=3)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
