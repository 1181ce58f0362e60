"""mcdla: deep-learning training past the device-memory wall.

Four parts share one model of workloads (:mod:`mcdla.workload`) and hardware (:mod:`mcdla.hardware`):
:mod:`mcdla.sim` simulates multi-accelerator training with memory virtualization, :mod:`mcdla.plan` decides
what to offload, prefetch or recompute, :mod:`mcdla.runtime` executes such plans on real PyTorch models and
:mod:`mcdla.profile` measures real models back into the workload model.
"""

from mcdla.errors import McdlaError

__all__ = ["McdlaError", "__version__", "virtualize", "offload_optimizer", "offload_parameters"]
_RUNTIME_ENTRY_POINTS = ("virtualize", "offload_optimizer", "offload_parameters")


def __getattr__(name: str):  # lazy: importing mcdla must not import torch
    if name == "__version__":  # the one copy is pyproject.toml's, read from the installed metadata
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("mcdla")
        except PackageNotFoundError:
            return "0+unknown"
    if name in _RUNTIME_ENTRY_POINTS:
        import mcdla.runtime

        return getattr(mcdla.runtime, name)
    raise AttributeError(f"module 'mcdla' has no attribute {name!r}")
