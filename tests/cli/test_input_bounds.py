"""Bounds on workload figures and output paths: a value past its bound is one line naming the field or option."""

import pytest
import yaml

from mcdla.workload.io import MAX_LAYER_BYTES

_LONG = "a" * 300


def _workload(tmp_path, param_bytes):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"format": "mcdla-workload/1", "name": "big", "batch": 4, "layers": [
        {"name": "a", "kind": "fc", "fwd_flops": 1e6, "bwd_flops": 2e6, "param_bytes": param_bytes, "saved_bytes": 64},
        {"name": "b", "kind": "fc", "fwd_flops": 1e6, "bwd_flops": 2e6, "inputs": ["a"]}]}))
    return path


@pytest.mark.parametrize("command", [("simulate", "--system", "mc-dla"),
                                     ("plan", "--system", "mc-dla", "--budget", "1GiB")])
def test_param_bytes_past_the_bound_is_one_line_not_an_assertion(run_cli, tmp_path, command):
    """param_bytes: 1e308 (finite, but inf as static bytes) is refused with the field and the bound."""
    code, out, err = run_cli(*command, "--workload", str(_workload(tmp_path, 1e308)))
    assert code == 2 and not out and err.count("\n") == 1
    assert "layers[0].param_bytes" in err and f"{MAX_LAYER_BYTES:g}" in err


def test_param_bytes_at_the_bound_simulates(run_cli, tmp_path):
    """param_bytes at the bound is accepted: the simulation runs to a result (it does not fit, exit 1)."""
    code, out, err = run_cli("simulate", "--system", "mc-dla", "--workload", str(_workload(tmp_path, MAX_LAYER_BYTES)))
    assert code in (0, 1) and out and "Traceback" not in err


def test_a_workload_built_in_python_past_the_bound_is_a_workload_error():
    """The program builder refuses static bytes that overflow to inf with a WorkloadError, not an assertion."""
    from mcdla.errors import WorkloadError
    from mcdla.hardware import load_system
    from mcdla.plan import policy_plan
    from mcdla.sim.program import build_program
    from mcdla.workload import Layer, LayerKind, Workload

    w = Workload(name="huge", batch=1, layers=(
        Layer(name="a", kind=LayerKind.FC, fwd_flops=1.0, bwd_flops=1.0, param_bytes=1e308),))
    with pytest.raises(WorkloadError, match=r"'huge'.static_bytes: got inf"):
        build_program(w, policy_plan(w, "none"), load_system("mc-dla").devices[0], model_parallel=False, n_devices=1,
                      bucket_bytes=2**20)


@pytest.mark.parametrize("argv, option", [
    (("search", "--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", "8", "--global-batch", "16",
      "--out", "{dir}/" + _LONG + ".csv"), "--out"),
    (("export-chakra", "--system", "mc-dla", "--workload", "alexnet", "--prefix", "{dir}/" + _LONG), "--prefix"),
    (("simulate", "--system", "mc-dla", "--workload", "alexnet", "--trace", "{dir}/" + _LONG + ".json"), "--trace"),
    (("plan", "--system", "mc-dla", "--workload", "alexnet", "--budget", "1GiB", "--out",
      "{dir}/" + _LONG + ".json"), "--out"),
])
def test_a_300_byte_file_name_names_its_option(run_cli, tmp_path, argv, option):
    """A file name longer than the filesystem allows is one line naming the option and the limit."""
    import os

    code, out, err = run_cli(*(a.replace("{dir}", str(tmp_path)) for a in argv))
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith(f"mcdla: error: {option}: got ") and f"must be at most {limit}" in err
