"""Measured layer times on other hardware: provenance in the workload file, the warning, and ``--scale-to``."""

import json

import pytest
import torch
from torch import nn

from mcdla.cli import main
from mcdla.errors import ConfigError, WorkloadError
from mcdla.hardware import load_system
from mcdla.profile import profile
from mcdla.sim.measured import measurement_mismatch, scale_measured_times
from mcdla.workload import load_workload, save_workload

FWD_S, BWD_S, PEAK = 1e-3, 2e-3, 2e12


def _write(tmp_path, measured_on: str = "{device: 'cpu: test box', peak_flops_per_s: 2TFLOP/s}", *,
           times: tuple[float, float] | None = (FWD_S, BWD_S), name: str = "measured") -> str:
    """A one-layer workload file; ``times`` are its measured (fwd, bwd) seconds, None for none (analytical)."""
    path = tmp_path / f"{name}.yaml"
    measured = "" if times is None else f", fwd_time_s: {times[0]}, bwd_time_s: {times[1]}"
    path.write_text(f"""format: mcdla-workload/1
name: measured
batch: 4
measured_on: {measured_on if times is not None else "null"}
layers:
  - {{name: a, kind: fc, fwd_flops: 1e9, bwd_flops: 2e9, fwd_bytes_moved: 1MiB, bwd_bytes_moved: 2MiB,
      saved_bytes: 1MiB{measured}}}
""")
    return str(path)


def _simulate(capsys, *argv: str) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--policy", "none", "--json", *argv])
    out = capsys.readouterr()
    return info.value.code, json.loads(out.out) if out.out else {}, out.err


def test_measured_on_round_trips_through_a_file(tmp_path) -> None:
    """The device and peak written in ``measured_on`` load back, and save/load keeps them."""
    w = load_workload(_write(tmp_path))
    assert (w.measured_on.device, w.measured_on.peak_flops_per_s) == ("cpu: test box", PEAK)
    again = load_workload(save_workload(w, tmp_path / "again.json"))
    assert again.measured_on == w.measured_on


def test_bad_measured_peak_is_one_line(tmp_path) -> None:
    """A non-positive peak is refused naming the field and the allowed values."""
    with pytest.raises(WorkloadError, match=r"measured_on\.peak_flops_per_s: got 0; must be a finite peak"):
        load_workload(_write(tmp_path, "{device: x, peak_flops_per_s: 0}"))


def test_scale_to_peak_multiplies_times_by_the_peak_ratio(tmp_path, capsys) -> None:
    """--scale-to peak: compute = (fwd + bwd) x measured peak / target peak, by hand."""
    target = load_system("mc-dla").devices[0].flops_per_s("fp16")
    code, got, err = _simulate(capsys, "--system", "mc-dla", "--workload", _write(tmp_path), "--scale-to", "peak")
    assert code == 0 and "warning" not in err
    assert got["compute_s"] == pytest.approx((FWD_S + BWD_S) * PEAK / target)


def test_scale_to_roofline_times_layers_from_flops_and_bytes(tmp_path, capsys) -> None:
    """--scale-to roofline: compute = sum of max(FLOP / (peak x eff), bytes / (HBM x eff)), by hand."""
    d = load_system("mc-dla").devices[0]
    rate, bw = d.flops_per_s("fp16") * d.compute_efficiency, d.hbm_bytes_per_s * d.memory_efficiency
    expected = max(1e9 / rate, 2**20 / bw) + max(2e9 / rate, 2 * 2**20 / bw)
    code, got, _ = _simulate(capsys, "--system", "mc-dla", "--workload", _write(tmp_path), "--scale-to", "roofline")
    assert code == 0 and got["compute_s"] == pytest.approx(expected)


def test_unscaled_measured_times_warn_once_on_other_hardware(tmp_path, capsys) -> None:
    """Without --scale-to the measured times are simulated as they are, with one warning line on stderr."""
    code, got, err = _simulate(capsys, "--system", "mc-dla", "--workload", _write(tmp_path))
    assert code == 0 and got["compute_s"] == pytest.approx(FWD_S + BWD_S)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcdla: warning:") and "cpu: test box" in lines[0]
    assert "--scale-to" in lines[0]


def test_no_warning_on_the_measuring_hardware_or_for_analytical_workloads(tmp_path) -> None:
    """Same peak as every target device: no warning; a zoo workload (no measured times): no warning."""
    system = load_system("mc-dla")
    peak = system.devices[0].flops_per_s("fp16")
    same = load_workload(_write(tmp_path, f"{{device: gpu, peak_flops_per_s: {peak}}}"))
    assert measurement_mismatch(same, system) is None
    assert measurement_mismatch(load_workload("alexnet"), system) is None
    unrecorded = load_workload(_write(tmp_path, "null"))
    assert "an unrecorded device" in measurement_mismatch(unrecorded, system)


def test_scale_to_peak_without_a_recorded_peak_is_one_line(tmp_path) -> None:
    """--scale-to peak needs measured_on.peak_flops_per_s; without it the error names that field."""
    w = load_workload(_write(tmp_path, "{device: 'cpu: x'}"))
    with pytest.raises(ConfigError, match=r"measured_on\.peak_flops_per_s"):
        scale_measured_times(w, load_system("mc-dla").devices[0], "peak")


def test_profile_records_where_it_measured() -> None:
    """A profiled workload names its device kind and host in measured_on, with the peak it was given."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    w = profile(model, torch.randn(4, 8), lambda out: out.sum(), warmup_steps=0, measured_steps=1,
                peak_flops_per_s=1e12)
    assert w.measured_on.device.startswith("cpu: ") and w.measured_on.peak_flops_per_s == 1e12
    assert w.has_measured_times


def test_cli_scale_to_choices_are_the_scale_modes() -> None:
    """The CLI's --scale-to offers exactly the modes scale_measured_times accepts."""
    from mcdla.cli._app import ScaleTo
    from mcdla.sim.measured import SCALE_MODES

    assert tuple(m.value for m in ScaleTo) == SCALE_MODES


def _run(capsys, *argv: str) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--json"])
    out = capsys.readouterr()
    return info.value.code, json.loads(out.out) if out.out else {}, out.err


def _command(name: str, tmp_path, workload: str) -> list[str]:
    """The argv of ``plan`` or ``export-chakra`` on mc-dla for ``workload``; both print iteration_time_s."""
    if name == "plan":
        return ["plan", "--system", "mc-dla", "--workload", workload, "--planner", "lp"]
    return ["export-chakra", "--system", "mc-dla", "--workload", workload, "--policy", "none",
            "--prefix", str(tmp_path / "trace")]


@pytest.mark.parametrize("command", ["plan", "export-chakra"])
def test_plan_and_export_chakra_warn_on_unscaled_measured_times(command, tmp_path, capsys) -> None:
    """plan and export-chakra warn once on stderr, like simulate, when measured times meet other hardware."""
    code, _, err = _run(capsys, *_command(command, tmp_path, _write(tmp_path)))
    lines = err.splitlines()
    assert code == 0 and len(lines) == 1 and lines[0].startswith("mcdla: warning:") and "--scale-to" in lines[0]


@pytest.mark.parametrize("command", ["plan", "export-chakra"])
def test_plan_and_export_chakra_scale_to_match_rescaled_files(command, tmp_path, capsys) -> None:
    """--scale-to peak gives the time of a file whose times are scaled by hand by measured/target peak, and
    --scale-to roofline the time of the same layer without measured times; neither warns."""
    target = load_system("mc-dla").devices[0].flops_per_s("fp16")
    by_hand = _write(tmp_path, times=(FWD_S * PEAK / target, BWD_S * PEAK / target), name="by_hand")
    analytical = _write(tmp_path, times=None, name="analytical")
    measured = _write(tmp_path)
    for mode, reference in (("peak", by_hand), ("roofline", analytical)):
        code, got, err = _run(capsys, *_command(command, tmp_path, measured), "--scale-to", mode)
        assert code == 0 and err == ""
        _, expected, _ = _run(capsys, *_command(command, tmp_path, reference))
        assert got["iteration_time_s"] == pytest.approx(expected["iteration_time_s"]), mode
