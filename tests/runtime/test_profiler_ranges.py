"""The runtime's copies show up as named ranges in a PyTorch profiler trace (NOTE [profiler ranges])."""

from __future__ import annotations

import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from mcdla.runtime import virtualize

from ._models import model_and_batch


def test_host_tier_copies_are_profiler_ranges():
    """A profiled host-tier step has one mcdla::offload and one mcdla::fetch range per storage it moved."""
    model, x, y = model_and_batch()
    vm = virtualize("host", min_bytes=1024, model=model)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with vm:
            F.cross_entropy(model(x), y).backward()
    names = [e.name for e in prof.events()]
    kinds = [t.kind for t in vm.report.transfers]
    assert kinds.count("offload") == vm.report.managed_count > 0
    assert names.count("mcdla::offload") == kinds.count("offload")
    assert names.count("mcdla::fetch") == kinds.count("fetch") > 0
