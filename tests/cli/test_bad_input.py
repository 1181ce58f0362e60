"""Bad command lines and bad input files: one ``mcdla: error:`` line on stderr, never a traceback, box or hang."""

import json

import pytest

BIG = "9" * 400
_BOMB = "\n".join(  # about 300 bytes; its aliases expand to 9**9 nodes
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["name: *i", "format: *i", "layers: *i", "devices: *i"]
) + "\n"


def _one_line(err: str) -> str:
    assert err.startswith("mcdla: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "╭" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (("simulate", "--system", "mc-dla"), ("--workload", "missing")),
        (("simulate", "--system", "mc-dla", "--workload", "lstm", "--batch", "abc"), ("--batch: got 'abc'", "integer")),
        (("simulate", "--system", "mc-dla", "--workload", "lstm", "--parallel=foo"), ("--parallel: got 'foo'", "'data'")),
        (("simulate", "--bogus"), ("--bogus",)),
        (("nosuchcmd",), ("nosuchcmd", "simulate")),
        (("simulate", "--system", "mc-dla", "--workload", "lstm", "--batch", BIG), ("--batch", "400", "2147483647")),
    ],
)
def test_usage_errors_are_one_line_not_boxes(run_cli, argv, needles) -> None:
    """Option errors typer used to draw as boxes are one line naming the option and the value, exit 2."""
    code, out, err = run_cli(*argv)
    assert code == 2 and out == ""
    line = _one_line(err)
    assert all(n in line for n in needles), line


def test_bare_number_budget_needs_a_unit(run_cli) -> None:
    """--budget 12 is ambiguous: refused, saying to write a unit (12B for bytes)."""
    code, _, err = run_cli("plan", "--workload", "lstm", "--system", "mc-dla", "--budget", "12")
    assert code == 2 and "--budget: got '12'" in _one_line(err) and "'12B'" in err


def test_budget_in_explicit_bytes_is_taken_as_bytes(run_cli) -> None:
    """--budget 12B means 12 bytes: the planner says it is infeasible for 12 B."""
    code, _, err = run_cli("plan", "--workload", "lstm", "--system", "mc-dla", "--budget", "12B")
    assert code == 2 and "12 B is infeasible" in _one_line(err)


@pytest.mark.parametrize("budget", ["1PiB", "inf", BIG + "GiB"])
def test_budget_above_device_memory_is_refused(run_cli, budget) -> None:
    """A budget above the device's memory exits 2 naming the device memory (it exited 0 before)."""
    for cmd in (("plan",), ("simulate", "--planner", "lp")):
        code, out, err = run_cli(*cmd, "--workload", "lstm", "--system", "mc-dla", "--budget", budget, "--json")
        assert code == 2 and out == "" and "--budget" in _one_line(err)
    code, _, err = run_cli("plan", "--workload", "lstm", "--system", "mc-dla", "--budget", "1PiB")
    assert "at most the memory of mc-dla gpu0 (14.90 GiB)" in err


def test_infeasible_simulation_exits_1_with_strict_json(run_cli) -> None:
    """An infeasible run prints strict JSON (null, not Infinity), its reason on stderr, and exits 1."""
    code, out, err = run_cli("simulate", "--system", "dc-dla", "--workload", "vgg-e", "--batch", "512",
                             "--policy", "none", "--json")
    assert code == 1 and "infeasible: device gpu0 needs" in _one_line(err)
    assert "Infinity" not in out and "NaN" not in out
    got = json.loads(out, parse_constant=lambda name: pytest.fail(name))
    assert got["feasible"] is False and got["iteration_time_s"] is None


@pytest.mark.parametrize(("option", "cmd"), [("--trace", ("simulate",)), ("--out", ("plan",))])
def test_unwritable_output_paths(tmp_path, run_cli, option, cmd) -> None:
    """An output path that is a directory or in a missing directory is refused before any work."""
    for path, needle in ((tmp_path, "is a directory"), (tmp_path / "no" / "f.json", "does not exist")):
        code, _, err = run_cli(*cmd, "--system", "mc-dla", "--workload", "lstm", option, str(path))
        assert code == 2 and f"{option}: got" in _one_line(err) and needle in err


def test_unwritable_plot_and_bogus_device_for_validate_and_probe(tmp_path, run_cli) -> None:
    """validate --plot in a missing directory, --device bogus for validate and probe: one line, exit 2."""
    code, _, err = run_cli("validate", "--model", "mlp", "--pool", "host", "--budget", "50%",
                           "--plot", str(tmp_path / "no" / "p.png"))
    assert code == 2 and "--plot" in _one_line(err)
    code, _, err = run_cli("validate", "--model", "mlp", "--pool", "host", "--budget", "50%", "--device", "bogus")
    assert code == 2 and "--device: got 'bogus'" in _one_line(err)
    code, _, err = run_cli("probe", "--out", str(tmp_path / "m.yaml"), "--device", "bogus")
    assert code == 2 and "--device: got 'bogus'" in _one_line(err)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["bomb", "dev-zero", "directory", "deep", "binary"])
@pytest.mark.parametrize("option", ["--workload", "--system"])
def test_hostile_input_files(tmp_path, run_cli, kind, option) -> None:
    """A 300-byte alias bomb, /dev/zero, a directory, 100k-deep nesting, binary bytes: one line, exit 2, fast."""
    path = tmp_path / "x.yaml"
    if kind == "bomb":
        path.write_text(_BOMB)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        path.write_bytes(bytes(range(256)))
    args = {"--workload": "lstm", "--system": "mc-dla", option: str(path)}
    code, _, err = run_cli("simulate", *(x for kv in args.items() for x in kv))
    assert code == 2 and "x.yaml" in _one_line(err)


_OFFLOAD_RECORD = {"gpus": 1, "micro_batch": 1, "global_batch": 2, "offload_optimizer": True, "cpu_optimizer": True}


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("reduce_bucket_numel", 0, "greater than or equal to 1"),
    ("reduce_bucket_numel", 1.5, "valid integer"),
    ("fp8_scaling", "mx", "'delayed', 'current' or 'mxfp8'"),
    ("ep_dispatcher", "deepep", "'alltoall' or 'hybridep'"),
    ("activation_offload_sync", "sometimes", "valid boolean"),
    ("activation_offload_sync", True, "set offload_activations"),
])
def test_llm_predict_refuses_a_bad_execution_field_naming_it(run_cli, tmp_path, field, value, allowed) -> None:
    """Each execution field of DeepSpeed's offload, the fp8 recipe and the MoE dispatcher: one line naming the
    field, the value and what is allowed, exit 2."""
    path = tmp_path / "e.json"
    path.write_text(json.dumps({**_OFFLOAD_RECORD, field: value}))
    code, out, err = run_cli("llm-predict", "--model", "gpt2-10b", "--execution", str(path), "--system", "dgx-2-v100")
    shown = json.dumps(value) if isinstance(value, bool) else repr(value)
    assert code == 2 and not out
    assert f"execution.{field}: got {shown}" in _one_line(err) and allowed in err


@pytest.mark.parametrize(("node", "needles"), [
    ("sockets: {cpu_adam: {params_per_s: 0}}", ("node.sockets.cpu_adam.params_per_s: got 0", "greater than 0")),
    ("sockets: {cpu_adam: {params_per_s: .inf}}", ("node.sockets.cpu_adam.params_per_s: got inf", "finite")),
    ("sockets: {cpu_adam: 3900000000}", ("node.sockets.cpu_adam: got 3900000000", "must be a mapping of its fields")),
    ("sockets: {cpu_adam: {rate: 1e9}}", ("node.sockets.cpu_adam.", "unknown field")),
    ("sockets: {sustained_dram: {bandwidth: 0, source: t}}",
     ("node.sockets.sustained_dram.bandwidth: got 0B/s", "a physical figure")),
    ("sockets: {sustained_dram: 190GB/s}", ("node.sockets.sustained_dram: got '190GB/s'", "must be a mapping")),
    ("sockets: {first_touch_copy: {bandwidth: -1GB/s, source: t}}",
     ("node.sockets.first_touch_copy.bandwidth: got '-1GB/s'", "must be >= 0")),
    ("gemm_efficiency: {peak_fraction: 0.5, half_width: 150, fp8_tn_only: maybe, source: test}",
     ("node.gemm_efficiency.fp8_tn_only: got 'maybe'", "valid boolean")),
])
def test_llm_predict_refuses_a_bad_cpu_adam_or_fp8_tn_only_naming_it(run_cli, tmp_path, node, needles) -> None:
    """A system file laying a bad node.sockets.cpu_adam, node.sockets.sustained_dram,
    node.sockets.first_touch_copy or gemm_efficiency.fp8_tn_only on a preset: one line
    naming the file, the field and the value, exit 2."""
    system, record = tmp_path / "s.yaml", tmp_path / "e.json"
    system.write_text(f"format: mcdla-system/1\nextends: dgx-2-v100\nnode: {{{node}}}\n")
    record.write_text(json.dumps(_OFFLOAD_RECORD))
    code, out, err = run_cli("llm-predict", "--model", "gpt2-10b", "--execution", str(record), "--system", str(system))
    assert code == 2 and not out and "s.yaml" in _one_line(err)
    assert all(n in err for n in needles), err
