"""One error base for the whole package, one subclass per layer.

Messages name the field, the value and what is allowed, e.g.
``hardware.links[0].bandwidth_bytes_per_s: got -3; must be > 0``. The CLI prints the message on one line
and exits 2; nothing below the CLI prints.
"""

__all__ = [
    "McdlaError",
    "ConfigError",
    "WorkloadError",
    "HardwareError",
    "PlanError",
    "SimError",
    "RuntimeTierError",
    "OffloadError",
    "ProfileError",
]


class McdlaError(Exception):
    """Base of every error mcdla raises on purpose (bad input, infeasible request, detected corruption)."""


class ConfigError(McdlaError, ValueError):
    """A value given at the boundary (file, CLI, API argument) is malformed or out of range."""


class WorkloadError(ConfigError):
    """A workload description is invalid or names an unknown workload."""


class HardwareError(ConfigError):
    """A system description is invalid: unknown preset, bad figure, disconnected topology, missing route."""


class PlanError(McdlaError):
    """A plan is malformed, infeasible, or made for a different workload."""


class SimError(McdlaError):
    """The simulator cannot run the request (e.g. a deadlock caused by an impossible memory budget)."""


class RuntimeTierError(McdlaError):
    """A memory-pool tier failed (I/O error, full disk, closed pool)."""


class OffloadError(McdlaError):
    """A saved tensor could not be restored exactly: lost, corrupted, truncated or fetched twice."""


class ProfileError(McdlaError):
    """Profiling a model failed: the model's forward raised, the loss is not a scalar, etc."""
