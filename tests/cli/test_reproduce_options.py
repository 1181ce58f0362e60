"""``mcdla reproduce --compute-efficiency / --pcie-share / --variants``, run in-process."""

from __future__ import annotations

import json

import pytest

from mcdla.report.experiments import run_matrix


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--compute-efficiency", "0"), "--compute-efficiency: got 0.0; must be > 0 and <= 1"),
        (("--compute-efficiency", "1.5"), "--compute-efficiency: got 1.5; must be > 0 and <= 1"),
        (("--pcie-share", "12.8"), "--pcie-share: got '12.8'; must be a bandwidth with its unit"),
        (("--pcie-share", "25GB/s"), "--pcie-share: got '25GB/s'; must be at most 19.2 GB/s on dc-dla"),
        (("--variants", "fp64"), "--variants: got 'fp64'; must be a comma-separated list of fp32, conv, lp, pofo"),
    ],
)
def test_reproduce_refuses_bad_levers(tmp_path, run_cli, argv, needle) -> None:
    """A bad lever value is one line naming the option, the value and what is allowed, exit status 2."""
    code, _, err = run_cli("reproduce", "--out", str(tmp_path), *argv)
    assert code == 2 and needle in err and "Traceback" not in err


def test_reproduce_levers_reach_every_record(tmp_path, run_cli) -> None:
    """--compute-efficiency 0.3 --pcie-share 12.8GB/s give the iterations of run_matrix at those settings."""
    code, _, _ = run_cli("reproduce", "--out", str(tmp_path), "--no-sweep", "--no-sensitivity", "--variants", "fp32",
                         "--workers", "1", "--compute-efficiency", "0.3", "--pcie-share", "12.8GB/s")
    assert code == 0
    got = {(r["workload"], r["parallel"], r["system"]): r["iteration_time_s"]
           for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    direct = run_matrix(["alexnet", "gru"], compute_efficiency=0.3, pcie_share_bytes_per_s=12.8e9, workers=1)
    for r in direct:
        assert got[(r.workload, r.parallel, r.system)] == pytest.approx(r.iteration_time_s, rel=1e-12)
    assert list(json.loads((tmp_path / "variants.json").read_text())) == ["fp32, vDNN-all"]
