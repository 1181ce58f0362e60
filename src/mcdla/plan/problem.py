"""One planning problem: the workload, its chain, the link, the budget and the engine scorer, passed to planners."""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.hardware.model import Device
from mcdla.hardware.pool_link import PoolLink
from mcdla.plan.chain import Chain, LinkTimes, build_chain, build_plan, link_times
from mcdla.plan.evaluate import Scorer
from mcdla.workload.model import Workload
from mcdla.workload.plan import Action, Plan

__all__ = ["Problem", "make_problem"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Everything a planner needs. ``budget_bytes`` bounds total device bytes (static + saved + transient)."""

    workload: Workload
    chain: Chain
    link: PoolLink
    times: LinkTimes
    budget_bytes: float
    scorer: Scorer
    planner: str
    device: Device | None = None

    def plan(self, actions, triggers=None, notes: str = "") -> Plan:
        """A Plan for this problem from an action per layer index and trigger indices."""
        return build_plan(self.chain, actions, triggers, budget_bytes=self.budget_bytes, planner=self.planner,
                          notes=notes)

    def offload_plan(self, triggers: dict[int, int], notes: str = "") -> Plan:
        """A Plan that offloads exactly the layers of ``triggers`` (with those triggers) and keeps the rest."""
        return self.plan({i: Action.OFFLOAD for i in triggers}, triggers, notes)

    def score(self, plan: Plan) -> float:
        """Engine makespan of ``plan`` at this budget (seconds; ``inf`` when infeasible)."""
        return self.scorer.score(plan)


def make_problem(
    workload: Workload,
    link: PoolLink,
    budget_bytes: float,
    *,
    planner: str,
    device: Device | None = None,
    chain: Chain | None = None,
) -> Problem:
    """Build the chain (engine compute times) and the scorer for ``workload`` on ``link`` at ``budget_bytes``."""
    chain = chain if chain is not None else build_chain(workload, device)
    scorer = Scorer(workload=workload, chain=chain, link=link, budget_bytes=budget_bytes, device=device)
    return Problem(workload=workload, chain=chain, link=link, times=link_times(chain, link),
                   budget_bytes=budget_bytes, scorer=scorer, planner=planner, device=device)
