"""Measure real PyTorch models and this machine into mcdla's workload and hardware models.

Imports are lazy: ``import mcdla.profile.models`` (the torch zoo) does not import the profiler, and
``import mcdla.profile`` imports nothing heavy until a name is used.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

__all__ = ["ProfileResult", "profile", "profile_run", "probe_tiers", "probe_system", "probe_machine"]

_WHERE = MappingProxyType({
    "ProfileResult": "mcdla.profile.profiler",
    "profile": "mcdla.profile.profiler",
    "profile_run": "mcdla.profile.profiler",
    "probe_tiers": "mcdla.profile.probe",
    "probe_system": "mcdla.profile.probe",
    "probe_machine": "mcdla.profile.probe",
})


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'mcdla.profile' has no attribute {name!r}")
