"""The record of a published run that ``validate-llm`` predicts: model, execution, measured time, source.

Its own module so that the families' data modules (:mod:`mcdla.report.llm_validation`,
:mod:`mcdla.report.llm_validation_runs`) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.workload.execution import Execution

__all__ = ["MeasuredRun"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """A published run: model, execution and the measured seconds per iteration with their source;
    ``gpus_per_node``: the GPUs of each node of ``system`` the run's job took when the scheduler left the rest
    of every node to others (0 = all of them; :meth:`~mcdla.hardware.cluster.Cluster.with_gpus_per_node`)."""

    name: str
    model: str
    execution: Execution
    measured_s: float
    source: str
    system: str = "dgx-a100"
    precision: str = "bf16"
    choices: str = ""
    family: str = "megatron-a100"
    gpus_per_node: int = 0
