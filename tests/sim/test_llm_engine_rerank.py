"""Re-ranking a search's top rows on the engine (plan/llm_rerank.py)."""

from __future__ import annotations

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import load_cluster
from mcdla.plan.llm_rerank import rerank
from mcdla.plan.llm_search import SearchRow
from mcdla.sim.llm import llm_step
from mcdla.sim.llm_lower import engine_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset


def test_rerank_orders_the_top_rows_by_the_engine() -> None:
    """Rows whose analytical order the engine reverses (an offload slowed on the shared PCIe x16 against one
    without offload) come back ordered by each one's own engine run; rows past k are not run."""
    spec, cluster = preset("gpt3-175b"), load_cluster("dgx-h100").for_gpus(16)
    executions = [Execution(gpus=16, tp=8, pp=2, micro_batch=1, global_batch=4, **kw) for kw in (
        {"offload_activations": True}, {"recompute": "full"}, {"recompute": "selective"})]
    rows = [SearchRow(index=i, execution=e, step=llm_step(spec, e, cluster), fits=True)
            for i, e in enumerate(executions)]
    got = rerank(spec, cluster, rows, 2)
    engine_s = [engine_step(spec, e, cluster).iteration_s for e in executions[:2]]
    assert [r.row.index for r in got] == sorted(range(2), key=lambda i: (engine_s[i], i))
    assert [r.engine.iteration_s for r in got] == sorted(engine_s)
    assert {r.analytical_rank for r in got} == {1, 2}


def test_rerank_bad_k_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"rerank.k: got 0; must be an integer >= 1"):
        rerank(preset("megatron-1.7b"), load_cluster("dgx-a100"), [], 0)
