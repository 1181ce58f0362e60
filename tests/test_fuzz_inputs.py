"""Fuzzing the input files: any workload, system or plan file gives a clean one-line error or a success.

"Clean error" means an :class:`mcdla.errors.McdlaError` (the CLI prints it as one line and exits 2) whose
message is one line of bounded length; never a traceback (any other exception fails the test), a hang (the
hostile cases below run under a timeout) or an error message that prints the unbounded input back.
Each document starts valid and is mutated: a field replaced by a hostile value (huge integers, inf/NaN,
containers, long strings), a field deleted or added, then written as JSON (with NaN/Infinity tokens) or YAML,
or as raw bytes with some replaced.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.cli import main
from mcdla.errors import McdlaError
from mcdla.hardware import load_system
from mcdla.workload import Layer, LayerKind, Workload, load_workload_file
from mcdla.workload.io import workload_to_dict
from mcdla.workload.plan import Plan

MAX_MESSAGE = 700

_WORKLOAD = workload_to_dict(Workload(name="tiny", batch=4, layers=(
    Layer(name="a", kind=LayerKind.FC, fwd_flops=1.5e6, bwd_flops=3e6, param_bytes=1024, saved_bytes=4096),
    Layer(name="b", kind=LayerKind.ELEMENTWISE, fwd_flops=10, bwd_flops=20, output_bytes=64, inputs=("a",)),
)))
_SYSTEM = {
    "format": "mcdla-system/1",
    "name": "tiny",
    "devices": [{"name": "gpu0", "peak_flops_per_s": {"fp16": "100TFLOP/s"}, "hbm": "16GiB",
                 "hbm_bandwidth": "900GB/s", "compute_efficiency": 0.7, "source": "test"}],
    "memories": [{"name": "host0", "kind": "host", "capacity": "64GiB", "dram_bandwidth": "80GB/s", "source": "t"}],
    "links": [{"a": "gpu0", "b": "host0", "bandwidth": "16GB/s", "latency": "1us", "kind": "pcie", "source": "t"}],
    "pools": {"gpu0": ["host0"]},
}
_PLAN = Plan.from_actions(workload="tiny", batch=4, layer_names=("a", "b"), actions={"a": "offload"},
                          budget_bytes=2**30, prefetch_at={"a": "b"}).to_dict()

_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=10**300, max_value=10**420),  # 400-digit integers
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0, 0.0]),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["inf", "nan", "-1GiB", "1e999GiB", "16GiB", "25GB/s", "1us", "keep", "offload", "x" * 5000,
                     "9" * 400]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=12)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``doc`` (keys and list indices), the root excluded."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(_paths(value, prefix + (key,)))
    return out


@st.composite
def _mutated(draw, base: dict) -> Any:
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(doc)
        if not paths or not isinstance(doc, dict):
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if how == "replace":
            parent[path[-1]] = draw(_values)
        elif how == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(_values)
    return doc


@st.composite
def _file_bytes(draw, base: dict) -> tuple[str, bytes]:
    """(suffix, content) of a mutated document, as JSON, YAML or corrupted bytes."""
    doc = draw(_mutated(base))
    kind = draw(st.sampled_from(["json", "yaml", "bytes"]))
    if kind == "json":
        return ".json", json.dumps(doc, allow_nan=True).encode()
    text = yaml.safe_dump(doc, sort_keys=False).encode()
    if kind == "bytes" and text:
        data = bytearray(text)
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] = draw(st.integers(min_value=0, max_value=255))
        text = bytes(data)
    return draw(st.sampled_from([".yaml", ".yml"])), text


def _clean(load, suffix: str, content: bytes) -> None:
    """``load(path)`` succeeds or raises a one-line, bounded McdlaError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"f{suffix}"
        path.write_bytes(content)
        try:
            load(path)
        except McdlaError as exc:
            message = str(exc)
            assert "\n" not in message and len(message) <= MAX_MESSAGE, message[:1000]


# The file loaders' fuzz: 50 examples each in the default suite, 200 in the slow suite.
_FUZZ = [pytest.param(settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
                      id=name, marks=marks) for n, name, marks in ((50, "quick", ()), (200, "long", pytest.mark.slow))]


@pytest.mark.parametrize("profile", _FUZZ)
def test_fuzzed_workload_files_load_or_fail_cleanly(profile) -> None:
    """A mutated workload file loads or raises one bounded-length WorkloadError line."""
    profile(given(_file_bytes(_WORKLOAD))(lambda case: _clean(load_workload_file, *case)))()


@pytest.mark.parametrize("profile", _FUZZ)
def test_fuzzed_system_files_load_or_fail_cleanly(profile) -> None:
    """A mutated system file loads or raises one bounded-length HardwareError line."""
    profile(given(_file_bytes(_SYSTEM))(lambda case: _clean(load_system, *case)))()


def test_huge_pool_memory_name_is_cut_in_the_message(tmp_path: Path) -> None:
    """A pool naming an unknown memory of 5,000 characters (a case the fuzzer found) gets one bounded line that
    still names the field."""
    doc = json.loads(json.dumps(_SYSTEM))
    device = doc["devices"][0]["name"]
    doc["pools"] = {device: ["x" * 5000]}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(McdlaError) as info:
        load_system(path)
    message = str(info.value)
    assert f"pools[{device}]" in message and "must name a memory" in message
    assert len(message) <= MAX_MESSAGE, len(message)


@pytest.mark.parametrize("profile", _FUZZ)
def test_fuzzed_plan_files_load_or_fail_cleanly(profile) -> None:
    """A mutated plan file (always read as JSON) loads or raises one bounded-length PlanError line."""
    profile(given(_file_bytes(_PLAN))(lambda case: _clean(Plan.load, ".json", case[1])))()


@pytest.mark.examples(10, 30)
def test_fuzzed_files_through_the_cli(examples) -> None:
    """``mcdla simulate --json`` on mutated files: exit 0 with strict JSON, 1 (infeasible) or 2, one stderr line."""
    settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])(
        given(_file_bytes(_WORKLOAD), _file_bytes(_SYSTEM))(_simulate_cleanly))()


def _simulate_cleanly(workload, system) -> None:
    import contextlib
    import io

    with tempfile.TemporaryDirectory() as tmp:
        wpath, spath = Path(tmp) / f"w{workload[0]}", Path(tmp) / f"s{system[0]}"
        wpath.write_bytes(workload[1])
        spath.write_bytes(system[1])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
            main(["simulate", "--workload", str(wpath), "--system", str(spath), "--json"])
    code, stderr = info.value.code, err.getvalue()
    assert code in (0, 1, 2), (code, stderr)
    if code == 0:
        json.loads(out.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
        assert stderr == ""
    else:
        assert stderr.startswith("mcdla: error: ") and stderr.count("\n") == 1 and len(stderr) <= MAX_MESSAGE


# -- hostile files, each under a time limit ------------------------------------------------------------------

_BOMB = "\n".join(  # about 300 bytes; its aliases expand to 9**9 nodes
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["name: *i", "format: *i", "layers: *i", "devices: *i"]
) + "\n"


def _hostile(tmp: Path, kind: str, suffix: str) -> Path:
    path = tmp / f"f{suffix}"
    if kind == "alias-bomb":
        path.write_text(_BOMB)
    elif kind == "deep-nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "deep-mapping":
        path.write_text("{a: " * 100_000 + "1" + "}" * 100_000)
    elif kind == "non-utf8":
        path.write_bytes(b"format: \xff\xfe\x00\x81 binary\n")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge-integer":
        path.write_text('{"format": "mcdla-plan/1", "batch": ' + "9" * 5000 + "}")
    elif kind == "nan":
        path.write_text('{"format": "mcdla-plan/1", "workload": "w", "batch": 1, "budget_bytes": NaN, "decisions": []}')
    return path


_KINDS = ["alias-bomb", "deep-nesting", "deep-mapping", "non-utf8", "binary", "directory", "dev-zero", "fifo",
          "huge-integer", "nan"]
_LOADERS = {"workload": load_workload_file, "system": load_system, "plan": Plan.load}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("what", sorted(_LOADERS))
@pytest.mark.parametrize("kind", _KINDS)
def test_hostile_files_fail_fast_with_one_line(tmp_path, kind, what) -> None:
    """Alias bombs, 100k-deep nesting, non-UTF-8 bytes, directories, /dev/zero, FIFOs: one-line error, fast."""
    path = _hostile(tmp_path, kind, ".json" if what == "plan" or kind in ("huge-integer", "nan") else ".yaml")
    with pytest.raises(McdlaError) as info:
        _LOADERS[what](path)
    message = str(info.value)
    assert "\n" not in message and len(message) <= MAX_MESSAGE


# -- the LLM surfaces: execution records, generated systems, llm-predict, search, export-chakra, Chakra import ----
# Each case must end in a clean error (one bounded line, exit 2), an infeasible answer (exit 1) or a finite
# success (strict JSON), within a time and a memory bound. The quick profile runs in the default suite (about
# 5 s in all); the long one, with 25 times the examples (about 3 min), in the slow suite.

_EXECUTION = {"gpus": 16, "tp": 8, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 16, "recompute": "selective",
              "fp8_scaling": "mxfp8", "ep_dispatcher": "hybridep", "reduce_bucket_numel": 50000000,
              "activation_offload_sync": False}
_GENERATOR = {
    "format": "mcdla-system/1", "name": "fuzz",
    "node": {"gpus": 8, "source": "t",
             "gpu": {"peak_flops_per_s": {"bf16": "989TFLOP/s", "fp16": "989TFLOP/s"}, "hbm": "80GB",
                     "hbm_bandwidth": "3.35TB/s", "source": "t"},
             "gemm_efficiency": {"peak_fraction": 0.7, "half_width": 150, "fp8_tn_only": True, "source": "t"},
             "scale_up": {"bandwidth": "450GB/s", "latency": "1us", "algorithm": "in-network", "source": "t"},
             "sockets": {"count": 2, "source": "t",
                         "memory": {"kind": "host", "capacity": "1TB", "dram_bandwidth": "307.2GB/s", "source": "t"},
                         "gpu_link": {"kind": "pcie", "bandwidth": "51.2GB/s", "latency": "1us", "source": "t"},
                         "cpu_adam": {"params_per_s": 3.9e9, "source": "t"}}},
    "scale_out": {"nodes": 2, "bandwidth": "50GB/s", "latency": "5us", "source": "t"},
}
#: Seconds and resident bytes one case may take (the bound a user's typo must fail within).
_CASE_SECONDS = 30.0
_CASE_RSS_BYTES = 3 * 2**30
#: Largest node the fuzzed generator files keep: the largest scale-up domain a file may describe is far past any
#: built (an NVL72 rack, a 256-GPU DGX GH200); 16,384 GPUs in one node is priced in well under a second (the
#: offload path's closed form, tests/hardware/test_traffic.py).
_MAX_FUZZ_NODE_GPUS = 16_384

_QUICK = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
_LONG = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
_PROFILES = [pytest.param(_QUICK, id="quick"), pytest.param(_LONG, id="long", marks=pytest.mark.slow)]


def _rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _cli(*argv: str) -> None:
    """``mcdla argv``: exit 0 with strict, finite JSON on stdout, 1, or 2 with one bounded stderr line; within
    the time and memory bound."""
    import contextlib
    import io
    import time

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(list(argv))
    seconds = time.perf_counter() - started
    code, stderr = info.value.code, err.getvalue()
    assert seconds < _CASE_SECONDS, (argv, seconds)
    assert _rss_bytes() < _CASE_RSS_BYTES, (argv, _rss_bytes())
    assert code in (0, 1, 2), (argv, code, stderr[-2000:])
    if code == 0:
        json.loads(out.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} in {argv} output"))
    if code == 2:
        assert stderr.startswith("mcdla: error: ") and stderr.count("\n") == 1 and len(stderr) <= MAX_MESSAGE, stderr


def _small_node(doc: Any) -> bool:
    """Whether a (mutated) generator file's node is small enough for the fuzz's time bound, or not a node."""
    node = doc.get("node") if isinstance(doc, dict) else None
    gpus = node.get("gpus") if isinstance(node, dict) else None
    return not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= _MAX_FUZZ_NODE_GPUS


@st.composite
def _generator_bytes(draw) -> tuple[str, bytes]:
    from hypothesis import assume

    suffix, content = draw(_file_bytes(_GENERATOR))
    try:
        doc = yaml.safe_load(content)
    except yaml.YAMLError:
        doc = None
    assume(_small_node(doc))
    return suffix, content


def _run(profile: settings, strategy: Any, check: Any) -> None:
    """Run ``check`` on ``strategy``'s cases under ``profile``."""
    profile(given(strategy)(check))()


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_execution_records_load_or_fail_cleanly(profile) -> None:
    """A mutated execution record loads or raises one bounded-length ConfigError line."""
    from mcdla.workload.execution import load_execution

    _run(profile, _file_bytes(_EXECUTION), lambda case: _clean(load_execution, *case))


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_generator_files_load_or_fail_cleanly(profile) -> None:
    """A mutated generated-system file (node x scale_out) loads or raises one bounded-length HardwareError line."""
    from mcdla.hardware.cluster import load_cluster

    _run(profile, _generator_bytes(), lambda case: _clean(lambda p: load_cluster(str(p)).for_gpus(16), *case))


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_llm_predict(profile) -> None:
    """``llm-predict --json`` on a mutated record and system, fast path or per-rank engine: clean or finite."""

    def check(execution, system, ranks):
        with tempfile.TemporaryDirectory() as tmp:
            epath, spath = Path(tmp) / f"e{execution[0]}", Path(tmp) / f"s{system[0]}"
            epath.write_bytes(execution[1])
            spath.write_bytes(system[1])
            _cli("llm-predict", "--model", "llama3-8b", "--execution", str(epath), "--system", str(spath), "--json",
                 *ranks)

    valid_execution = st.just((".json", json.dumps(_EXECUTION).encode()))
    valid_system = st.just((".yaml", yaml.safe_dump(_GENERATOR).encode()))
    strategy = st.tuples(valid_execution | _file_bytes(_EXECUTION), valid_system | _generator_bytes(),
                         st.sampled_from([(), ("--ranks",), ("--slowdown", "3:2.5"), ("--slowdown", "0:1e308")]))
    _run(profile, strategy, lambda case: check(*case))


_counts = st.one_of(st.integers(min_value=-2, max_value=70), st.sampled_from([2**31 - 1, 2**31, 10**20, 2095133040]))


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_search(profile) -> None:
    """``search --json`` with hostile sizes (GPUs, batch, top, CP, interleaving, limits): clean or finite, in time."""

    def check(gpus, batch, top, cp, max_v, limit, capacity):
        argv = ["search", "--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", str(gpus), "--global-batch",
                str(batch), "--top", str(top), "--cp", cp, "--workers", "1", "--quiet", "--json",
                "--max-configurations", str(capacity)]
        if max_v is not None:
            argv += ["--max-virtual-stages", str(max_v)]
        if limit is not None:
            argv += ["--memory-limit", limit]
        _cli(*argv)

    plausible = st.sampled_from([8, 16, 32, 64])
    strategy = st.tuples(st.sampled_from([8, 8, 16, 4, 1, 12, 0, 2**31 - 1]), plausible | _counts,
                         st.just(5) | _counts, st.sampled_from(["1", "1", "1,2", "0", "1,x", "3"]),
                         st.one_of(st.none(), st.just(2), _counts),
                         st.sampled_from([None, None, "1B", "12GiB", "80GB", "1e400GiB", "inf", "-1GiB"]),
                         st.sampled_from([20000, 20000, 5000, 1]))
    _run(profile, strategy, lambda case: check(*case))


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_export_chakra(profile) -> None:
    """``export-chakra --json`` with hostile batches, policies and parallelism: clean, infeasible or finite."""

    def check(batch, parallel, policy, system):
        with tempfile.TemporaryDirectory() as tmp:
            _cli("export-chakra", "--system", system, "--workload", "alexnet", "--batch", str(batch), "--parallel",
                 parallel, "--policy", policy, "--prefix", str(Path(tmp) / "t"), "--json")

    strategy = st.tuples(_counts, st.sampled_from(["data", "model", "pipeline"]),
                         st.sampled_from(["all", "none", "conv", "nope"]), st.sampled_from(["mc-dla", "dc-dla", "x"]))
    _run(profile, strategy, lambda case: check(*case))


def _exported_trace() -> bytes:
    from mcdla.hardware import load_system
    from mcdla.plan import policy_plan
    from mcdla.report.chakra import simulate_to_chakra
    from mcdla.workload import zoo

    w = zoo.build("alexnet", batch=64)
    with tempfile.TemporaryDirectory() as tmp:
        _, paths = simulate_to_chakra(Path(tmp) / "t", load_system("dc-dla"), w, policy_plan(w, "all"))
        return paths[0].read_bytes()


@pytest.mark.parametrize("profile", _PROFILES)
def test_fuzzed_chakra_traces_import_or_fail_cleanly(profile) -> None:
    """A Chakra trace with bytes replaced, cut or gzipped imports as a workload or raises one bounded line."""
    import gzip

    from mcdla.workload.chakra import load_chakra_workload

    base = _exported_trace()

    @st.composite
    def damaged(draw) -> tuple[str, bytes]:
        data = bytearray(base)
        for _ in range(draw(st.integers(min_value=0, max_value=6))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] = draw(st.integers(min_value=0, max_value=255))
        cut = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=len(data))))
        raw = bytes(data[:cut] if cut is not None else data)
        return (".et.gz", gzip.compress(raw)) if draw(st.booleans()) else (".et", raw)

    _run(profile, damaged(), lambda case: _clean(load_chakra_workload, *case))
