"""Step reports: byte counts agree with independent sums, the timeline is consistent, the Chrome trace is valid."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from mcdla.errors import ConfigError
from mcdla.runtime import virtualize

from ._models import MLP


def _run(tmp_path, **kw):
    torch.manual_seed(0)
    model = MLP(width=96, depth=3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 96, generator=g), torch.randint(0, 10, (24,), generator=g)
    with virtualize(f"file:{tmp_path / 'blocks'}", model=model, min_bytes=0, **kw) as vm:
        F.cross_entropy(model(x * 1.0), y).backward()
    return vm, vm.report


def test_bytes_add_up(tmp_path):
    """Offloading everything: offloaded == managed bytes == sum over layers == sum over transfer spans."""
    _, r = _run(tmp_path)
    assert r.complete and not r.aborted
    assert r.offloaded_bytes == r.managed_bytes == sum(r.offloaded_bytes_by_layer.values())
    assert r.offloaded_bytes == sum(s.nbytes for s in r.transfers if s.kind == "offload")
    assert r.fetched_bytes == sum(s.nbytes for s in r.transfers if s.kind == "fetch") <= r.offloaded_bytes
    assert r.stored_bytes_by_tier == r.offloaded_bytes_by_tier  # no compression


def test_timeline_is_ordered_and_ends_at_zero(tmp_path):
    """Samples are in time order, never negative, peak matches their maximum, and the step ends at 0."""
    _, r = _run(tmp_path)
    times = [t for t, _ in r.timeline]
    assert times == sorted(times)
    assert min(b for _, b in r.timeline) >= 0
    assert r.peak_resident_saved_bytes == max(b for _, b in r.timeline)
    assert r.timeline[-1][1] == 0


def test_chrome_trace_is_valid_json_with_tracks(tmp_path):
    """The trace has one complete event per transfer and per wait, a counter per sample and named tracks."""
    _, r = _run(tmp_path)
    trace = json.loads(json.dumps(r.chrome_trace()))
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["cat"] in ("offload", "fetch")]
    waits = [e for e in events if e["ph"] == "X" and e["cat"] in ("pack wait", "unpack wait")]
    assert len(spans) == len(r.transfers) and len(waits) == len(r.waits)
    assert len(spans) + len(waits) == sum(e["ph"] == "X" for e in events)
    assert all(e["dur"] >= 0 and e["args"]["bytes"] > 0 for e in spans + waits)
    assert sum(e["ph"] == "C" for e in events) == len(r.timeline)
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert any(n.startswith("offload file:") for n in names) and any(n.startswith("fetch file:") for n in names)


def test_trace_file_per_step(tmp_path):
    """trace= writes one Chrome trace per finished step, {step} replaced by its index."""
    vm, _ = _run(tmp_path, trace=str(tmp_path / "step{step}.trace.json"))
    data = json.loads((tmp_path / "step0.trace.json").read_text())
    assert data["otherData"]["step"] == 0


def test_summary_names_tiers_and_waits(tmp_path):
    """summary() gives the state, the peak, the waits and one line per tier."""
    _, r = _run(tmp_path)
    text = r.summary()
    assert "step 0 (complete)" in text and "peak resident saved" in text and "file:" in text


def test_report_is_frozen(tmp_path):
    """A report is a value: its fields cannot be reassigned, its mappings cannot be changed."""
    _, r = _run(tmp_path)
    with pytest.raises(AttributeError):
        r.step = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.offloaded_bytes_by_tier["host"] = 1  # type: ignore[index]


def test_report_before_any_step_is_an_error():
    """Asking for a report before the first step is a ConfigError."""
    with pytest.raises(ConfigError, match="no step"):
        virtualize("host").report
