"""Physical bounds on a system file's figures (NOTE [physical bounds] in hardware/io.py): a figure outside them
is one line naming the field and the range; a figure at the edge gives a finite prediction."""

import json

import pytest
import yaml

from mcdla.hardware.io import (BANDWIDTH_BOUNDS_BYTES_PER_S, CAPACITY_BOUNDS_BYTES, LATENCY_BOUNDS_S,
                               PEAK_BOUNDS_FLOPS_PER_S)

_EXECUTION = {"gpus": 8, "tp": 8, "pp": 1, "micro_batch": 1, "global_batch": 8, "recompute": "selective"}


def _nested(path: str, value: str) -> dict:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    out: dict = {"extends": "dgx-h100"}
    where = out
    keys = path.split(".")
    for key in keys[:-1]:
        where = where.setdefault(key, {})
    where[keys[-1]] = value
    return out


def _predict(run_cli, tmp_path, path: str, value: str):
    system = tmp_path / "s.yaml"
    system.write_text(yaml.safe_dump(_nested(path, value)))
    record = tmp_path / "e.json"
    record.write_text(json.dumps(_EXECUTION))
    return run_cli("llm-predict", "--model", "llama3-8b", "--execution", str(record), "--system", str(system),
                   "--json")


_BEYOND = [
    ("node.scale_up.bandwidth", "1e-300B/s", BANDWIDTH_BOUNDS_BYTES_PER_S),
    ("node.scale_up.bandwidth", "1e20B/s", BANDWIDTH_BOUNDS_BYTES_PER_S),
    ("node.scale_up.latency", "1e9s", LATENCY_BOUNDS_S),
    ("node.gpu.hbm_bandwidth", "1B/s", BANDWIDTH_BOUNDS_BYTES_PER_S),
    ("node.gpu.peak_flops_per_s.bf16", "1FLOP/s", PEAK_BOUNDS_FLOPS_PER_S),
    ("node.gpu.hbm", "1B", CAPACITY_BOUNDS_BYTES),
    ("node.sockets.memory.dram_bandwidth", "1e-9B/s", BANDWIDTH_BOUNDS_BYTES_PER_S),
]


@pytest.mark.parametrize(("path", "value", "bounds"), _BEYOND)
def test_a_figure_beyond_its_physical_bound_is_one_line(run_cli, tmp_path, path, value, bounds):
    """A bandwidth, latency, capacity or peak outside its range is refused with the field and the range."""
    code, out, err = _predict(run_cli, tmp_path, path, value)
    assert code == 2 and not out and err.count("\n") == 1
    field = path.removesuffix(".bf16").rsplit(".", 1)[-1]
    assert f"{field}: got " in err and f"{bounds[0]:g}" in err and f"{bounds[1]:g}" in err


@pytest.mark.parametrize(("path", "value"), [
    ("node.scale_up.bandwidth", f"{BANDWIDTH_BOUNDS_BYTES_PER_S[0]:g}B/s"),
    ("node.gpu.hbm_bandwidth", f"{BANDWIDTH_BOUNDS_BYTES_PER_S[0]:g}B/s"),
    ("node.gpu.peak_flops_per_s.bf16", f"{PEAK_BOUNDS_FLOPS_PER_S[0]:g}FLOP/s"),
    ("node.scale_up.latency", f"{LATENCY_BOUNDS_S[1]:g}s"),
])
def test_a_figure_at_its_bound_gives_a_finite_slower_prediction(run_cli, tmp_path, path, value):
    """At the edge of its range a figure is accepted and the prediction is strict JSON, finite, and slower than
    on the unmodified preset (the figure is the worst the range allows)."""
    code, out, err = _predict(run_cli, tmp_path, path, value)
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    record = tmp_path / "e.json"
    base = json.loads(run_cli("llm-predict", "--model", "llama3-8b", "--execution", str(record), "--system",
                              "dgx-h100", "--json")[1])
    assert code == 0 and not err and data["iteration_s"] > base["iteration_s"]
