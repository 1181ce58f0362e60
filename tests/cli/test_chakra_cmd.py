"""``mcdla export-chakra`` and ``mcdla simulate --workload <trace>.et``, run in-process."""

import json

import pytest

from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.sim import simulate
from mcdla.workload import zoo


def test_export_then_simulate_the_trace_gives_the_same_iteration(tmp_path, run_cli) -> None:
    prefix = tmp_path / "alex"
    code, out, err = run_cli("export-chakra", "--system", "mc-dla", "--workload", "alexnet", "--batch", "256",
                             "--parallel", "model", "--prefix", str(prefix), "--json")
    assert code == 0, err
    exported = json.loads(out)
    assert exported["files"] == [str(prefix) + f".{r}.et" for r in range(8)]
    w = zoo.build("alexnet", batch=256)
    direct = simulate(load_system("mc-dla"), w, policy_plan(w, "all"), parallel="model")
    assert exported["iteration_time_s"] == direct.iteration_time_s
    code, out, err = run_cli("simulate", "--system", "mc-dla", "--workload", exported["files"][3],
                             "--parallel", "model", "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] == direct.iteration_time_s


@pytest.mark.parametrize(("argv", "needle"), [
    (("--prefix", "/no/such/dir/t"), "--prefix: got '/no/such/dir/t.0.et'; directory"),
    (("--prefix", "PLACEHOLDER", "--planner", "nope"), "--planner: got 'nope'"),
    (("--prefix", "PLACEHOLDER", "--budget", "8GiB"), "--budget: only used with --planner"),
])
def test_bad_options_fail_in_one_line(tmp_path, run_cli, argv, needle) -> None:
    argv = tuple(str(tmp_path / "t") if a == "PLACEHOLDER" else a for a in argv)
    code, _, err = run_cli("export-chakra", "--system", "dc-dla", "--workload", "alexnet", *argv)
    assert code == 2
    assert err.count("\n") == 1 and needle in err


def test_an_infeasible_iteration_writes_nothing(tmp_path, run_cli) -> None:
    code, _, err = run_cli("export-chakra", "--system", "dc-dla", "--workload", "vgg-e", "--batch", "4096",
                           "--policy", "none", "--prefix", str(tmp_path / "t"))
    assert code == 1 and "infeasible" in err and "no trace written" in err
    assert not list(tmp_path.iterdir())


def test_a_bad_trace_as_workload_fails_in_one_line(tmp_path, run_cli) -> None:
    bad = tmp_path / "bad.0.et"
    bad.write_bytes(b"\x05abc")
    code, _, err = run_cli("simulate", "--system", "dc-dla", "--workload", str(bad))
    assert code == 2 and err.count("\n") == 1 and "truncated" in err


def test_a_full_disk_mid_export_leaves_no_trace(tmp_path, run_cli, monkeypatch) -> None:
    """ENOSPC while writing the third rank's trace: one line naming --prefix, and neither the two finished
    traces nor a temporary file are left."""
    import errno
    import os

    import mcdla.workload.chakra as chakra_io
    from mcdla._io_safety import atomic_output

    real = chakra_io.write_trace
    calls = []

    def fills_up(path, metadata, nodes):
        calls.append(path)
        if len(calls) == 3:
            with atomic_output(path, "wb") as f:
                f.write(b"partial")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, metadata, nodes)

    monkeypatch.setattr(chakra_io, "write_trace", fills_up)  # export-chakra imports it when it runs
    code, out, err = run_cli("export-chakra", "--system", "mc-dla", "--workload", "alexnet",
                             "--prefix", str(tmp_path / "t"))
    assert code == 2 and not out and err.count("\n") == 1 and "--prefix: got" in err and "No space left" in err
    assert len(calls) == 3 and list(tmp_path.iterdir()) == []


def test_a_trace_is_written_whole_or_not_at_all(tmp_path, monkeypatch) -> None:
    """write_trace puts its bytes under a temporary name and renames: a failing final sync leaves an existing
    trace as it was and no temporary file."""
    import errno
    import os

    from mcdla.workload.chakra import pb, write_trace

    path = tmp_path / "t.0.et"
    path.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        write_trace(path, pb.GlobalMetadata(version="0.0.4"), [pb.Node(id=1, name="n")])
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["t.0.et"]


def _export_seconds(tmp_path, nodes: int) -> float:
    """Seconds to build and write every rank's trace of alexnet on ``nodes`` DGX H100 nodes (not simulating)."""
    import gc
    import time

    import yaml

    from mcdla.report.chakra import iter_chakra_ranks, trace_paths
    from mcdla.workload.chakra import write_trace

    system_file = tmp_path / f"dgx{nodes}.yaml"
    system_file.write_text(yaml.safe_dump({"extends": "dgx-h100-ndr", "scale_out": {"nodes": nodes}}))
    system = load_system(system_file)
    w = zoo.build("alexnet", batch=64)
    plan = policy_plan(w, "all")
    result = simulate(system, w, plan, record_timeline=True)
    gc.collect()
    gc.disable()  # the export's own work: full collections over what a long test run has left alive grow with it
    try:
        t0 = time.perf_counter()
        for rank, path in zip(iter_chakra_ranks(system, w, plan, result),
                              trace_paths(tmp_path / f"n{nodes}", nodes * 8)):
            write_trace(path, rank.metadata, rank.nodes)
        return time.perf_counter() - t0
    finally:
        gc.enable()


@pytest.mark.slow
def test_export_time_grows_linearly_with_the_ranks(tmp_path) -> None:
    """Exporting 1,024 ranks takes about 8x (not 64x) what 128 ranks take: each rank's spans are found once,
    not by scanning every rank's (a quadratic scan took 18 s for 1,024 ranks)."""
    small = _export_seconds(tmp_path, 16)
    large = _export_seconds(tmp_path, 128)
    assert large < 14 * small, (small, large)
