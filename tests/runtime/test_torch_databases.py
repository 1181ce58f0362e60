"""PyTorch's own test databases as the oracle.

Every differentiable op of ``common_methods_invocations.op_db`` (its function variant and, where it has one,
its in-place variant) and every module of ``common_modules.module_db`` runs forward and backward in
float64 on the CPU, a few samples each, plainly and under ``mcdla.virtualize(budget=0, min_bytes=1)`` (every
saved storage offloaded) over two pools: ``host`` and ``compress(file:...)``. Outputs and every gradient
(inputs and, for modules, parameters) must be bit-identical: floats are compared as their integer bit
patterns, so NaN payloads and the sign of zero count too.

Per sample, before comparing (NOTE [verdicts]):
    * two plain runs, each after ``torch.manual_seed`` (random ops: dropout, rrelu, ...), must agree bit for
      bit; if they do not the op is nondeterministic on this sample and the sample is skipped, with why;
    * a sample whose plain forward raises, or whose outputs have no gradient to take, or whose plain backward
      raises (derivative not implemented, ...) is skipped as "no backward", after checking that the
      virtualized run raises too (an error that only plain PyTorch raises would be a masked error).

NOTE [verdicts]
    exact             outputs and gradients bit-identical
    nondeterministic  the two plain runs differ, or, after a virtualized run differed, one of RERUNS more plain
                      runs differs from the first (skipped; linalg.eigh/eigvalsh give one of two answers)
    no-backward       plain forward or backward raises, or nothing differentiable (skipped); the
                      virtualized run raised too (an OffloadError there counts as consistent)
    FAIL mismatch     a silent difference in an output or a gradient
    FAIL false-alarm  the virtualized run raised OffloadError where plain PyTorch computed a result
    FAIL virt-error   the virtualized run raised another error where plain PyTorch did not
    FAIL missed-error plain PyTorch raised in backward but the virtualized run returned gradients
    An op (module) fails if any of its samples fails; else it is exact if any sample is exact; else it is
    skipped as nondeterministic if any sample was, else as no-backward.

Each sample runs virtualized twice (MODES): with every offload landed before backward, so every managed
byte comes back from the pool, and with backward right after forward. Inputs are differentiable copies of the
sample's leaves with the same storage geometry (``_non_leaf``): the runtime never moves leaves that require
grad, so saves of the raw sample inputs would never reach the pool.

No op or module is skipped by name. Ops without float64 backward on the CPU
(``supported_backward_dtypes``) and modules without float64 are not collected.

``make test`` runs the smoke subset (``SMOKE_OPS``, ``SMOKE_MODULES``: views, in-place, random ops, RNN
cells) in seconds; ``make test-slow`` runs everything. With ``MCDLA_ORACLE_SUMMARY=<path>`` the slow run
writes the count table (benchmarks/RESULTS.md, section "torch-databases") to that path.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import random
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

import mcdla
from mcdla.errors import OffloadError

pytest.importorskip("expecttest")  # torch.testing._internal needs it (test extras)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

N_SAMPLES = 3  # the first samples of each op / module
SEED = 1234  # before generating samples and before every forward
DTYPE = torch.float64

# Smoke subset for `make test`: a view op, ops whose backward reads its output or input after in-place
# writes, random ops (rrelu: its noise is written by the kernel after autograd saved it), chunk/unsafe views,
# a reduction with indices, and the CPU RNN cells (unsafe_chunk aliases with separate version counters).
SMOKE_OPS = ["as_strided", "transpose", "unsafe_chunk", "nn.functional.relu", "sigmoid", "addcmul",
             "nn.functional.rrelu", "nn.functional.dropout", "max.reduction_with_dim", "cumprod", "nn.functional.layer_norm"]
SMOKE_MODULES = ["nn.GRUCell", "nn.LSTMCell", "nn.GRU", "nn.LSTM", "nn.BatchNorm1d"]


def _seed() -> None:
    torch.default_generator.manual_seed(SEED)  # CPU only: torch.manual_seed also queues CUDA/MTIA seeding, slowly
    random.seed(SEED)  # some sample_inputs funcs draw from `random` (hinge_embedding_loss's targets)
    np.random.seed(SEED)


def _pool_spec(pool: str, tmp_path) -> str:
    return {"host": "host", "compress": f"compress(file:{tmp_path})"}[pool]


POOLS = ["host", "compress"]


# ---------------------------------------------------------------------------------------------------------
# running one forward+backward
@dataclass
class _Run:
    """One forward+backward: its outputs and gradients (detached), or the error and where it was raised."""

    outputs: list[Any] = field(default_factory=list)
    grads: list[Any] = field(default_factory=list)
    stage: str = "ok"  # ok | forward | backward | exit | no-backward
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.stage in ("ok", "no-backward")

    def why(self) -> str:
        return f"{self.stage}: {type(self.error).__name__}: {str(self.error).splitlines()[0][:160] if str(self.error) else ''}"


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _snapshot(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if x.layout is torch.strided else x.detach().to_dense()
    return x


def _forward_backward(forward: Callable[[], tuple[Any, list[torch.Tensor]]], ctx: Any,
                      between: Callable[[], None] | None = None) -> _Run:
    """Seed, run ``forward`` (returns the output and the tensors to differentiate with respect to), call
    ``between``, and take the gradients for a fixed random cotangent, all inside ``ctx``."""
    run = _Run()
    stage = "forward"
    try:
        with ctx, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _seed()
            out, wrt = forward()
            leaves = pytree.tree_leaves(out)
            run.outputs = [_snapshot(x) for x in leaves]
            outs = [t for t in leaves if _differentiable(t)]
            wrt = [t for t in wrt if isinstance(t, torch.Tensor) and t.requires_grad]
            if not outs or not wrt:
                stage = "no-backward"
            else:
                if between is not None:
                    between()
                stage = "backward"
                g = torch.Generator().manual_seed(SEED + 1)
                cot = [torch.randn(t.shape, dtype=t.dtype, generator=g) for t in outs]
                grads = torch.autograd.grad(outs, wrt, cot, allow_unused=True)
                run.grads = [None if x is None else _snapshot(x) for x in grads]
                stage = "exit"
            del out, outs, leaves, wrt
        run.stage = "ok" if stage == "exit" else stage
    except Exception as exc:  # noqa: BLE001 - classified by the caller
        run.stage, run.error = stage, exc
    return run


_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous()
    if t.is_floating_point():
        t = t.view(_INT[t.element_size()])
    return t


def _diff(a: list[Any], b: list[Any], what: str) -> str | None:
    """Where two lists of outputs / gradients differ bitwise (None: identical)."""
    if len(a) != len(b):
        return f"{what}: {len(a)} vs {len(b)} values"
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return f"{what}[{i}]: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
            if not torch.equal(_bits(x), _bits(y)):
                bad = (_bits(x) != _bits(y))
                while bad.dim() > x.dim():  # complex: real and imaginary parts
                    bad = bad.any(-1)
                n = int(bad.sum())
                err = ""
                if x.is_floating_point() or x.is_complex():
                    err = f", max |diff| {float((x - y).abs().nan_to_num(float('inf')).max()):.3g}"
                return f"{what}[{i}]: {n} of {x.numel()} elements differ{err}"
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return f"{what}[{i}]: {type(x).__name__} vs {type(y).__name__}"
        elif not (x == y or (x != x and y != y)):
            return f"{what}[{i}]: {x!r} vs {y!r}"
    return None


def _runs_differ(a: _Run, b: _Run) -> str | None:
    if a.stage != b.stage:
        return f"{a.why() if a.error else a.stage} vs {b.why() if b.error else b.stage}"
    if not a.ok:
        return None
    return _diff(a.outputs, b.outputs, "output") or _diff(a.grads, b.grads, "grad")


# ---------------------------------------------------------------------------------------------------------
# verdicts
@dataclass
class _Verdict:
    kind: str  # exact | nondeterministic | no-backward | mismatch | false-alarm | virt-error | missed-error
    sample: str
    detail: str = ""
    fetched: int = 0  # bytes fetched back from the pool in the settled run

    @property
    def failed(self) -> bool:
        return self.kind in ("mismatch", "false-alarm", "virt-error", "missed-error")


def _offload_all(vm: Any) -> None:
    """Let every offload of the forward land before backward, so each saved storage comes back from the pool.

    Offloads start once the saving op is over: a later op's save says so (NOTE [bytes final] in _step).
    """
    probe = torch.ones(2, dtype=DTYPE, requires_grad=True) * torch.ones(2, dtype=DTYPE)
    del probe
    deadline = time.monotonic() + 10.0
    while vm.resident_saved_bytes > 0 and time.monotonic() < deadline:
        time.sleep(0.0002)


# Virtualized runs per sample: backward after every offload landed (every managed byte makes the round trip
# through the pool), and backward right after forward (offloads still running or deferred when unpacked).
MODES = ("settled", "racing")
RERUNS = 10  # plain reruns before a difference counts as a mismatch


def _judge(label: str, make: Callable[[], Callable[[], tuple[Any, list[torch.Tensor]]]], spec: str) -> _Verdict:
    """Two plain runs and the virtualized runs (MODES) of the forward ``make()`` builds (fresh inputs each)."""
    p1 = _forward_backward(make(), contextlib.nullcontext())
    p2 = _forward_backward(make(), contextlib.nullcontext())
    why = _runs_differ(p1, p2)
    if why is not None:
        return _Verdict("nondeterministic", label, why)
    fetched = 0
    for mode in MODES:
        vm = mcdla.virtualize(pool=spec, budget=0, min_bytes=1)
        try:
            v = _forward_backward(make(), vm, (lambda vm=vm: _offload_all(vm)) if mode == "settled" else None)
            if mode == "settled":
                fetched = sum(vm.report.fetched_bytes_by_tier.values())
        finally:
            with contextlib.suppress(Exception):
                vm.close()
        if not p1.ok or p1.stage == "no-backward":
            if p1.stage == "backward" and v.ok:
                return _Verdict("missed-error", label, f"{mode}: plain {p1.why()}; virtualized returned gradients")
            continue  # the virtualized run follows plain PyTorch (raises too, or nothing to differentiate)
        if isinstance(v.error, OffloadError):
            return _Verdict("false-alarm", label, f"{mode}: {v.why()}")
        if v.error is not None:
            return _Verdict("virt-error", label, f"{mode}: {v.why()}")
        why = _runs_differ(p1, v)
        if why is not None:
            for _ in range(RERUNS):  # two plain runs agreeing by chance (linalg.eigvalsh: two answers, ~50:50)
                again = _runs_differ(p1, _forward_backward(make(), contextlib.nullcontext()))
                if again is not None:
                    return _Verdict("nondeterministic", label, f"a plain rerun differs: {again}")
            return _Verdict("mismatch", label, f"{mode}: {why}")
    if not p1.ok or p1.stage == "no-backward":
        note = f"plain {p1.why()}" if p1.error else "nothing to differentiate"
        return _Verdict("no-backward", label, note)
    return _Verdict("exact", label, fetched=fetched)


def _overall(verdicts: list[_Verdict]) -> str:
    kinds = {v.kind for v in verdicts}
    if any(v.failed for v in verdicts):
        return "fail"
    for k in ("exact", "nondeterministic"):
        if k in kinds:
            return k
    return "no-backward"


def _non_leaf(tree: Any) -> Any:
    """Inputs the runtime may offload: a differentiable copy of each leaf that requires grad, with the same
    values and the same storage geometry (size, stride, offset, and the rest of the storage's bytes, which
    ``as_strided`` may read). The runtime never moves leaves that require grad (parameters), and sample
    inputs are such leaves, so without this most ops would save nothing it manages. Gradients are taken
    w.r.t. the original leaves."""
    return pytree.tree_map(_copy_leaf, tree)


def _copy_leaf(t: Any) -> Any:
    if not (isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf):
        return t
    if t.layout is not torch.strided or torch._debug_has_internal_overlap(t) != 0:
        return t.clone()  # an expanded input: copy_ cannot write it; a dense clone
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())  # every element of t's storage
    buf = whole.detach().clone()
    view = buf.as_strided(t.size(), t.stride(), t.storage_offset())
    view.copy_(t)  # now a view (of buf) that autograd tracks back to t
    return view


# ---------------------------------------------------------------------------------------------------------
# op_db
def _op_id(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _differentiable_ops() -> list[Any]:
    return [op for op in op_db if op.supports_autograd and DTYPE in op.supported_backward_dtypes("cpu")]


def _samples(op: Any) -> list[Any]:
    _seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # sample_inputs_func directly: OpInfo.sample_inputs wraps it in a tracker that walks the stack per call
        return list(itertools.islice(op.sample_inputs_func(op, "cpu", DTYPE, True), N_SAMPLES))


def _op_variants(op: Any) -> list[tuple[str, Callable[..., Any]]]:
    variants = [("fn", op.get_op())]
    inplace = op.get_inplace()
    if inplace is not None and op.supports_inplace_autograd:
        def safe_inplace(t, *args, **kwargs):  # as test_ops._get_safe_inplace: the leaf itself stays intact
            return inplace(t.clone(), *args, **kwargs)
        variants.append(("inplace", safe_inplace))
    return variants


def check_op(op: Any, spec: str) -> list[_Verdict]:
    verdicts = []
    try:
        n = len(_samples(op))
    except Exception as exc:  # noqa: BLE001
        return [_Verdict("no-backward", "samples", f"sample_inputs raised {type(exc).__name__}: {exc}")]
    for (name, fn), i in itertools.product(_op_variants(op), range(n)):

        def make(fn=fn, i=i):
            def forward():
                s = _samples(op)[i]
                leaves = pytree.tree_leaves((s.input, s.args, s.kwargs))
                x, args, kwargs = _non_leaf((s.input, s.args, s.kwargs))
                out = op.gradcheck_wrapper(fn, x, *args, **kwargs)
                return s.output_process_fn_grad(out), leaves
            return forward

        verdicts.append(_judge(f"{name}#{i}", make, spec))
    return verdicts


# ---------------------------------------------------------------------------------------------------------
# module_db
def _module_inputs(info: Any) -> list[Any]:
    _seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = info.module_inputs_func(info, device="cpu", dtype=DTYPE, requires_grad=True, training=True)
    return [mi for mi in inputs if mi.forward_input is not None][:N_SAMPLES]


def check_module(info: Any, spec: str) -> list[_Verdict]:
    verdicts = []
    try:
        n = len(_module_inputs(info))
    except Exception as exc:  # noqa: BLE001
        return [_Verdict("no-backward", "inputs", f"module_inputs_func raised {type(exc).__name__}: {exc}")]
    for i in range(n):
        mi = _module_inputs(info)[i]
        try:
            _seed()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fresh = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
                fresh.to(dtype=DTYPE).train(True)
        except Exception as exc:  # noqa: BLE001
            verdicts.append(_Verdict("no-backward", f"#{i}", f"constructor raised {type(exc).__name__}: {exc}"))
            continue

        def make(i=i, fresh=fresh):
            m = copy.deepcopy(fresh)

            def forward():
                fi = _module_inputs(info)[i].forward_input
                args, kwargs = _non_leaf((fi.args, fi.kwargs))
                out = m(*args, **kwargs)
                return out, pytree.tree_leaves((fi.args, fi.kwargs)) + list(m.parameters())
            return forward

        verdicts.append(_judge(f"#{i} {mi.desc}".rstrip(), make, spec))
    return verdicts


# ---------------------------------------------------------------------------------------------------------
# the tests
_TALLY: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)  # (db, pool) -> name -> overall
_SAMPLES: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (db, pool) -> sample verdict counts


def _assert_verdicts(db: str, name: str, pool: str, verdicts: list[_Verdict]) -> None:
    overall = _overall(verdicts)
    _TALLY[(db, pool)][name] = overall
    _SAMPLES[(db, pool)].update(v.kind for v in verdicts)
    _SAMPLES[(db, pool)]["round-trip"] += sum(v.kind == "exact" and v.fetched > 0 for v in verdicts)
    failures = [v for v in verdicts if v.failed]
    assert not failures, "\n".join(f"{name} [{pool}] {v.sample}: {v.kind}: {v.detail}" for v in failures)
    if overall != "exact":
        pytest.skip("; ".join(f"{v.sample}: {v.kind} ({v.detail})" for v in verdicts)[:1000])


_ALL_OPS = _differentiable_ops()
_ALL_MODULES = [m for m in module_db if DTYPE in m.supported_dtypes("cpu")]


def _params(items: Iterable[Any], name_of: Callable[[Any], str], only: list[str] | None) -> list[Any]:
    chosen = [x for x in items if only is None or name_of(x) in only]
    if only is not None:
        assert {name_of(x) for x in chosen} >= set(only), set(only) - {name_of(x) for x in chosen}
    return [pytest.param(x, id=name_of(x)) for x in chosen]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("op", _params(_ALL_OPS, _op_id, SMOKE_OPS))
def test_op_smoke(op, pool, tmp_path):
    """A few ops (views, in-place, random, reductions): bit-identical under virtualize(budget=0)."""
    _assert_verdicts("op_db-smoke", _op_id(op), pool, check_op(op, _pool_spec(pool, tmp_path)))


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("info", _params(_ALL_MODULES, lambda m: m.name, SMOKE_MODULES))
def test_module_smoke(info, pool, tmp_path):
    """The CPU RNN cells and a few modules: bit-identical under virtualize(budget=0)."""
    _assert_verdicts("module_db-smoke", info.name, pool, check_module(info, _pool_spec(pool, tmp_path)))


@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("op", _params(_ALL_OPS, _op_id, None))
def test_op_db(op, pool, tmp_path, _summary):
    """Every differentiable op of op_db: outputs and gradients bit-identical (NOTE [verdicts])."""
    _assert_verdicts("op_db", _op_id(op), pool, check_op(op, _pool_spec(pool, tmp_path)))


@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("info", _params(_ALL_MODULES, lambda m: m.name, None))
def test_module_db(info, pool, tmp_path, _summary):
    """Every module of module_db (training mode): outputs, input and parameter gradients bit-identical."""
    _assert_verdicts("module_db", info.name, pool, check_module(info, _pool_spec(pool, tmp_path)))


@pytest.fixture(scope="module")
def _summary():
    """With MCDLA_ORACLE_SUMMARY=<path>, write the count table of the slow tests there at the end."""
    t0 = time.perf_counter()
    yield
    path = os.environ.get("MCDLA_ORACLE_SUMMARY")
    if path:
        with open(path, "w") as f:
            f.write(summary_table(time.perf_counter() - t0))


def summary_table(seconds: float) -> str:
    lines = [f"torch {torch.__version__}, {N_SAMPLES} samples per op variant / module, float64, CPU; "
             f"{seconds / 60:.1f} min for both databases and both pools.", "",
             "| database | pool | tried | exact | skipped: nondeterministic | skipped: no backward | failures |"
             " samples (exact / nondet / no-bwd / failed) | exact samples with bytes fetched back |",
             "|---|---|---|---|---|---|---|---|---|"]
    failed_names = []
    for (db, pool), per in sorted(_TALLY.items()):
        if db.endswith("-smoke"):
            continue
        c = Counter(per.values())
        s = _SAMPLES[(db, pool)]
        fails = sum(v for k, v in s.items() if k in ("mismatch", "false-alarm", "virt-error", "missed-error"))
        lines.append(f"| {db} | {pool} | {len(per)} | {c['exact']} | {c['nondeterministic']} | {c['no-backward']} |"
                     f" {c['fail']} | {s['exact']} / {s['nondeterministic']} / {s['no-backward']} / {fails} |"
                     f" {s['round-trip']} |")
        failed_names += [f"{db} [{pool}]: {n}" for n, o in sorted(per.items()) if o == "fail"]
    lines.append("")
    lines.append("Failures: " + ("; ".join(failed_names) if failed_names else "none") + ".")
    return "\n".join(lines) + "\n"
