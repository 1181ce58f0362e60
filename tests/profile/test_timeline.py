"""Memory timelines of real steps and the measured-vs-predicted PNG."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ProfileError
from mcdla.profile.timeline import MemoryTimeline, cuda_step_timeline, timeline_from_report
from mcdla.report.timeline_plot import plot_memory_timelines
from mcdla.runtime import virtualize


def test_runtime_accounting_timeline_peaks_at_the_saved_bytes() -> None:
    """Keeping everything on a CPU, the runtime's resident-saved timeline peaks at its managed bytes and
    returns to zero after backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    x = torch.randn(512, 256)
    vm = virtualize(pool="host", budget=float("inf"), model=model)
    with vm:
        F.cross_entropy(model(x), torch.zeros(512, dtype=torch.long)).backward()
    report = vm.report
    vm.close()
    line = timeline_from_report(report, step_time_s=1.0)
    assert line.peak_bytes == report.peak_resident_saved_bytes == report.managed_bytes > 0
    assert line.bytes[0] == 0 and line.bytes[-1] == 0 and line.times_s[-1] == 1.0


def test_timeline_rejects_mismatched_or_decreasing_samples() -> None:
    """Times and bytes must pair up, and times must not go back."""
    with pytest.raises(ProfileError, match="as many"):
        MemoryTimeline(times_s=(0.0, 1.0), bytes=(1.0,))
    with pytest.raises(ProfileError, match="decreasing"):
        MemoryTimeline(times_s=(1.0, 0.5), bytes=(1.0, 2.0))


def test_cuda_timeline_needs_a_cuda_model() -> None:
    """Device-memory snapshots of a CPU model are a one-line ProfileError."""
    with pytest.raises(ProfileError, match="need a CUDA device"):
        cuda_step_timeline(nn.Linear(2, 2), torch.randn(1, 2), lambda o: o.sum())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_timeline_sees_activations_come_and_go() -> None:
    """On CUDA the allocated bytes rise during forward and fall back after backward."""
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
    x = torch.randn(4096, 1024, device="cuda")
    line = cuda_step_timeline(model, x, lambda o: o.square().mean())
    assert line.peak_bytes >= line.bytes[0] + 3 * 4096 * 1024 * 4
    assert line.bytes[-1] < line.peak_bytes


def test_plot_writes_a_png(tmp_path: Path) -> None:
    """The measured-vs-predicted plot is a PNG file."""
    measured = MemoryTimeline.from_pairs([(0.0, 0.0), (0.01, 3e6), (0.02, 1e6), (0.03, 0.0)])
    predicted = MemoryTimeline.from_pairs([(0.0, 0.0), (0.012, 2.8e6), (0.025, 0.0)])
    out = plot_memory_timelines(measured, predicted, tmp_path / "t.png", measured_step_s=0.03, predicted_step_s=0.028)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
