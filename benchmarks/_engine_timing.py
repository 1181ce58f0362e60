"""CPU time of one execution in engine mode against its analytical evaluation, measured in the same run: the
timing both engine benchmarks share (``bench_llm_engine``, ``bench_llm_engine_zero``)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster
from mcdla.sim import LlmStep, llm_step
from mcdla.sim.llm_lower import EngineStep, engine_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec

ANALYTICAL_CALLS = 100


@dataclass(frozen=True)
class EngineTiming:
    """CPU seconds of ``time.process_time``: the analytical evaluation's mean over :data:`ANALYTICAL_CALLS`
    calls, the engine's median over ``samples``, and the two results."""

    analytical_s: float
    engine_s: float
    samples: tuple[float, ...]
    analytical: LlmStep
    run: EngineStep


def time_engine(spec: TransformerSpec, e: Execution, cluster: Cluster, repeats: int) -> EngineTiming:
    """Time ``e`` on ``cluster`` both ways (module docstring)."""
    t0 = time.process_time()
    for _ in range(ANALYTICAL_CALLS):
        analytical = llm_step(spec, e, cluster)
    analytical_s = (time.process_time() - t0) / ANALYTICAL_CALLS
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        run = engine_step(spec, e, cluster)
        samples.append(time.process_time() - t0)
    return EngineTiming(analytical_s, statistics.median(samples), tuple(samples), analytical, run)
