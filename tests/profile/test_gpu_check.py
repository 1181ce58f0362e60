"""The prepared GPU check runs its CPU smoke path (--tiny) end to end."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_validate_check


def test_gpu_check_tiny_writes_results(tmp_path: Path) -> None:
    """--tiny validates both models on this machine and writes the JSON, the table and the timelines."""
    assert gpu_validate_check.main(["--tiny", "--out", str(tmp_path), "--steps", "1", "--warmup", "0"]) == 0
    rows = json.loads((tmp_path / "gpu_validate.json").read_text())
    assert [r["label"] for r in rows] == ["MLP", "transformer"]
    assert all(r["measured_offload_bytes"] == r["planned_offload_bytes"] for r in rows)
    assert "| MLP |" in (tmp_path / "gpu_validate.md").read_text()
    assert (tmp_path / "timeline-mlp.png").stat().st_size > 0
