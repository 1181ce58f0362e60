"""Re-ranking of a configuration search's best rows on the contention-aware engine.

The search (:mod:`mcdla.plan.llm_search`) ranks every configuration by the analytical model, cheap enough for
10^5 of them; its top ``k`` are then run on the engine (:func:`mcdla.sim.engine_step`), which shares
each link among the traffic classes that cross it, and ranked again by the engine's iteration time (ties by
the analytical rank). A configuration the engine slows more than its neighbours (an offload that shares the
PCIe x16 with the NIC, prefetches on the NVLink ports of a memory-node rack) moves down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.plan.llm_search import SearchRow
from mcdla.sim import EngineStep, engine_step, lowering_rejection
from mcdla.workload.transformer import TransformerSpec

__all__ = ["RerankedRow", "rerank"]


@dataclass(frozen=True, slots=True)
class RerankedRow:
    """One of the search's top rows with its engine run; ``analytical_rank`` is its place in the search (1 =
    best)."""

    row: SearchRow
    analytical_rank: int
    engine: EngineStep


def rerank(spec: TransformerSpec, cluster: Cluster, ranked: Sequence[SearchRow], k: int) -> tuple[RerankedRow, ...]:
    """The first ``k`` of ``ranked`` (a search's fitting rows, fastest first) that the engine lowers
    (:func:`~mcdla.sim.lowering_rejection`: rows it refuses, such as an NVMe tier it cannot fold, are passed
    over) run on the engine and ordered by its iteration time, ties by the analytical rank. One-line ConfigError
    for ``k`` below 1."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"rerank.k: got {brief(k)}; must be an integer >= 1")
    lowered = [(i, row) for i, row in enumerate(ranked, 1) if lowering_rejection(spec, row.execution, cluster) is None]
    runs = [RerankedRow(row=row, analytical_rank=i, engine=engine_step(spec, row.execution, cluster))
            for i, row in lowered[:k]]
    return tuple(sorted(runs, key=lambda r: (r.engine.iteration_s, r.analytical_rank)))
