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
    """A published run: model, execution and the measured seconds per iteration with their source."""

    name: str
    model: str
    execution: Execution
    measured_s: float
    source: str
    system: str = "dgx-a100"
    precision: str = "bf16"
    choices: str = ""
    family: str = "megatron-a100"
