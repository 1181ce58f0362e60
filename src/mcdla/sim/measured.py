"""Measured layer times on other hardware: the mismatch warning and the rescaling behind ``--scale-to``.

A profiled workload carries the times its layers took on the device that measured them (``fwd_time_s`` /
``bwd_time_s``, where ``Workload.measured_on`` says which device), and the simulator uses them instead of its
roofline. Simulated on another system they would be that device's times, not the system's; so the CLI warns,
and ``--scale-to`` rescales them:

- ``peak``: each measured time times ``measured peak / target peak`` (FLOP/s in the workload's precision), so
  a layer keeps the fraction of peak it reached when measured. Needs the measuring device's peak.
- ``roofline``: the measured times are dropped and the simulator times every layer from its FLOPs and bytes
  at the target's rates (its roofline), as for an analytical workload.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from mcdla.errors import ConfigError

if TYPE_CHECKING:
    from mcdla.hardware import Device, System
    from mcdla.workload import Workload

__all__ = ["SCALE_MODES", "ScaleTo", "measurement_mismatch", "scale_measured_times"]

ScaleTo = Literal["peak", "roofline"]
SCALE_MODES: tuple[ScaleTo, ...] = ("peak", "roofline")
_SAME_PEAK = 0.01  # peaks within 1% are the same hardware


def _rate(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.4g} TFLOP/s"


def measurement_mismatch(workload: Workload, system: System) -> str | None:
    """One line saying that ``workload``'s measured times would be simulated on other hardware, or None.

    None when the workload has no measured times, or when it records the measuring device's peak and every
    device of ``system`` has that peak (within 1%) in the workload's precision.
    """
    if not workload.has_measured_times:
        return None
    measured = workload.measured_on
    precision = workload.precision
    peaks = {d.flops_per_s(precision) for d in system.devices}
    known = measured is not None and measured.peak_flops_per_s is not None
    if known and all(abs(p / measured.peak_flops_per_s - 1.0) <= _SAME_PEAK for p in peaks):
        return None
    where = "an unrecorded device" if measured is None else measured.device
    if known:
        where += f" ({_rate(measured.peak_flops_per_s)} {precision})"
    target = system.devices[0]
    return (f"workload {workload.name!r}: its layer times were measured on {where}; simulating them unchanged on "
            f"{system.name} ({target.name}, {_rate(target.flops_per_s(precision))} {precision}); "
            f"rescale with --scale-to peak or --scale-to roofline")


def scale_measured_times(workload: Workload, device: Device, scale_to: ScaleTo) -> Workload:
    """``workload`` with its measured times made to hold on ``device`` (see the module docstring).

    A workload without measured times is returned unchanged. ``peak`` needs ``workload.measured_on`` with a
    peak; otherwise a one-line ConfigError names the missing field.
    """
    if scale_to not in SCALE_MODES:
        raise ConfigError(f"--scale-to: got {scale_to!r}; must be one of {', '.join(SCALE_MODES)}")
    if not workload.has_measured_times:
        return workload
    if scale_to == "roofline":
        layers = [dataclasses.replace(layer, fwd_time_s=None, bwd_time_s=None) for layer in workload.layers]
        return dataclasses.replace(workload, layers=tuple(layers), measured_on=None)
    measured = workload.measured_on
    if measured is None or measured.peak_flops_per_s is None:
        raise ConfigError(f"--scale-to peak: workload {workload.name!r} has no measured_on.peak_flops_per_s "
                          "(the measuring device's peak); add it to the workload file or use --scale-to roofline")
    factor = measured.peak_flops_per_s / device.flops_per_s(workload.precision)

    def scaled(t: float | None) -> float | None:
        return None if t is None else t * factor

    layers = [dataclasses.replace(layer, fwd_time_s=scaled(layer.fwd_time_s), bwd_time_s=scaled(layer.bwd_time_s))
              for layer in workload.layers]
    return dataclasses.replace(workload, layers=tuple(layers), measured_on=None)
