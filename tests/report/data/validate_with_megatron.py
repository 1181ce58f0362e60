"""Run Megatron-LM's own ``parse_args`` and ``validate_args`` on the exported arguments of the executions that
``tests/report/test_export_config.py`` checks (its hand-picked winners and one search candidate per layout), to
catch the combinations Megatron refuses beyond single options and values (e.g. ``--tp-comm-overlap`` without
``--sequence-parallel``).

Not a test and not run by the suite (it needs Megatron-LM's source and imports); run it by hand from the
repository root::

    PYTHONPATH=src:tests python tests/report/data/validate_with_megatron.py --megatron GIT_DIR [--megatron-ref REF]

Megatron's checks run on the CPU: its GPU-architecture query answers Hopper (9) and the few modules that need
GPU kernel packages at import time are stand-ins, as in ``extract_framework_args.py``; the model's size
arguments come from the spec. Prints one line per refused export and a count.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import extract_framework_args as extract  # noqa: E402


def model_args(spec) -> list[str]:  # noqa: ANN001
    """Megatron's size arguments for a :class:`~mcdla.workload.transformer.TransformerSpec`."""
    args = ["--num-layers", str(spec.layers), "--hidden-size", str(spec.hidden), "--num-attention-heads",
            str(spec.heads), "--ffn-hidden-size", str(spec.ffn_hidden), "--max-position-embeddings",
            str(spec.seq_len), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(spec.vocab)]
    if spec.kv_heads != spec.heads:
        args += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)]
    if spec.experts > 1:
        args += ["--num-experts", str(spec.experts), "--moe-router-topk", str(spec.top_k)]
    return args


def _load(path: Path, name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True, help="git directory of NVIDIA/Megatron-LM")
    ap.add_argument("--megatron-ref", default="HEAD")
    a = ap.parse_args()
    tests = Path(__file__).resolve().parents[2]
    conftest = _load(tests / "conftest.py", "_conftest")
    cases = _load(tests / "report" / "test_export_config.py", "_test_export_config")
    from mcdla.plan.llm_search import enumerate_executions
    from mcdla.report.export_config import megatron_args

    runs = [(spec, e, precision, "case") for spec, e, precision in cases.CASES]
    cluster = conftest.figures_cluster(gpus_per_node=4, nodes=2, offload_bytes_per_s=10e9)
    for spec, space in ((cases.TINY_DENSE, {"cp": (1, 2), "cpu_optimizer": (False, True), "dp_overlap": True}),
                        (cases.TINY_MOE, {"ep": (1, 2, 4), "max_virtual_stages": 2})):
        found = enumerate_executions(spec, cluster, gpus=8, global_batch=16, **space).executions
        chosen = cases._one_of_each(found)  # noqa: SLF001 - the same selection as the test's
        runs += [(spec, e, cases.PRECISIONS[i % len(cases.PRECISIONS)], "candidate") for i, e in enumerate(chosen)]

    with tempfile.TemporaryDirectory() as tmp:
        commit = extract._checkout(a.megatron, a.megatron_ref, ["megatron"], Path(tmp))  # noqa: SLF001
        if not hasattr(typing, "override"):
            typing.override = lambda f: f  # type: ignore[attr-defined]
        sys.path.insert(0, tmp)
        sys.meta_path.insert(0, extract._Stubs(extract._MEGATRON_STUBS))  # noqa: SLF001
        arguments = importlib.import_module("megatron.training.arguments")
        arguments.get_device_arch_version = lambda: 9  # Hopper: no GPU here to ask
        refused = 0
        for spec, e, precision, kind in runs:
            args, _ = megatron_args(e, spec, precision)
            os.environ.update(WORLD_SIZE=str(e.gpus), RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
            if "--use-megatron-fsdp" in args or "--use-torch-fsdp2" in args:  # FSDP asks for more than one
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS")
            sys.argv = ["pretrain_gpt.py", *model_args(spec), *args]
            try:
                parsed = arguments.parse_args()
                arguments.validate_args(parsed, {})
            except (AssertionError, ValueError, SystemExit) as exc:
                refused += 1
                print(f"REFUSED {kind} {spec.name} {precision} {e}: {type(exc).__name__}: {exc}")
    print(f"Megatron-LM {commit[:12]}: {len(runs) - refused} of {len(runs)} exports accepted by validate_args")


if __name__ == "__main__":
    main()
