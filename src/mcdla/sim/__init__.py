"""The simulation engine: one training iteration on a multi-device system with memory virtualization.

Every device has a compute stream and two copy streams; every transfer is a flow along its route sharing links
max-min fairly; collectives are ring algorithms over the system's rings. Semantics: ``docs/timing-model.md``;
design, breakdown and assumptions: ``docs/simulator.md``.
"""

from mcdla.sim.engine import simulate
from mcdla.sim.flows import max_min_rates
from mcdla.sim.llm import DEFAULT_PRECISION, LlmStep, cluster_precision, cluster_rejection, llm_step
from mcdla.sim.llm_lower import EngineStep, engine_step, lowering_rejection
from mcdla.sim.pool_link import pool_link
from mcdla.sim.program import BACKWARD, FORWARD, build_program, roofline_s
from mcdla.sim.result import SimResult
from mcdla.sim.single import default_device, evaluate_plan, one_device_system

__all__ = [
    "simulate",
    "SimResult",
    "evaluate_plan",
    "one_device_system",
    "pool_link",
    "default_device",
    "roofline_s",
    "build_program",
    "FORWARD",
    "BACKWARD",
    "max_min_rates",
    "LlmStep",
    "llm_step",
    "cluster_rejection",
    "cluster_precision",
    "DEFAULT_PRECISION",
    "EngineStep",
    "engine_step",
    "lowering_rejection",
]
