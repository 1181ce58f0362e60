"""The progress bar and the callbacks of the slow calls (profile, reproduce, --modern)."""

import io

import torch
from rich.console import Console
from torch import nn

from mcdla.profile import profile, profile_run
from mcdla.profile.progress import progress_bar
from mcdla.report import experiments


def _calls():
    seen: list[tuple[int, int, str]] = []
    return seen, lambda done, total, what="": seen.append((done, total, what))


def test_bar_draws_on_a_terminal_and_stays_off_elsewhere():
    """On a terminal console the bar shows the phase and done/total; on a plain file it writes nothing."""
    tty = io.StringIO()
    with progress_bar("work", console=Console(file=tty, force_terminal=True, width=100)) as update:
        update(3, 4, "phase one")
    assert "phase one" in tty.getvalue() and "3/4" in tty.getvalue()
    plain = io.StringIO()
    with progress_bar("work", console=Console(file=plain, force_terminal=False)) as update:
        update(3, 4, "phase one")
    assert plain.getvalue() == ""


def test_profile_writes_no_bar_when_stderr_is_not_a_terminal(capfd):
    """profile() under captured (non-terminal) stderr prints nothing there."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    profile(model, torch.randn(4, 8), lambda out: out.sum(), warmup_steps=0, measured_steps=1)
    assert capfd.readouterr().err == ""


def test_profile_run_reports_every_timed_step():
    """on_progress hears of warmup + measured steps, ending at total/total."""
    seen, on_progress = _calls()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    profile_run(model, torch.randn(4, 8), lambda out: out.sum(), warmup_steps=2, measured_steps=3,
                on_progress=on_progress)
    steps = [(d, t) for d, t, what in seen if "timed" in what]
    assert steps == [(i, 5) for i in range(1, 6)]


def test_run_matrix_reports_each_simulation():
    """run_matrix calls on_progress once per record, counting up to workloads x systems x parallelisms."""
    seen, on_progress = _calls()
    records = experiments.run_matrix(["lstm"], workers=1, on_progress=on_progress)
    assert len(records) == 1 * 3 * 2
    assert [(d, t) for d, t, _ in seen] == [(i, 6) for i in range(0, 7)]


def test_probe_machine_reports_compute_then_each_tier(tmp_path):
    """probe_machine hears of compute first, then of each tier, ending at 1 + tiers."""
    from mcdla.profile.probe import probe_machine

    seen, on_progress = _calls()
    probe_machine(tmp_path, sizes_bytes=(1 << 16,), repeats=1, kinds=("host", "file"), on_progress=on_progress)
    assert [(d, t) for d, t, _ in seen] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert [w for _, _, w in seen][1:3] == ["probing: host tier", "probing: file tier"]
