"""Run the frameworks' own code on the exports of the executions that ``tests/report/test_export_config.py``
checks (its hand-picked winners and one search candidate per layout), to catch what they refuse beyond single
options and values (e.g. ``--tp-comm-overlap`` without ``--sequence-parallel``):

- Megatron-LM: ``parse_args`` and ``validate_args`` (``megatron/training/arguments.py``) on the arguments, with
  the model's size arguments from its spec;
- torchtitan (v0.2.2 by default): ``ConfigManager.parse_args(["--job.config_file", TOML])`` (the TOML into
  ``JobConfig``, through tyro), ``ParallelDims`` (the degrees against the world size), the batch checks of its
  trainer and pipeline schedule, and its ``generate_llm_fqn_per_model_part`` split, which must give each model
  chunk the execution's layers.

Not a test and not run by the suite (it needs the frameworks' sources, and tyro for torchtitan's parser); run it
by hand from the repository root (tyro 1.0.17 was used)::

    PYTHONPATH=src python tests/report/data/validate_exports.py --megatron GIT_DIR --torchtitan GIT_DIR \
        [--megatron-ref REF] [--torchtitan-ref v0.2.2]

Both run on the CPU: Megatron's GPU-architecture query answers Hopper (9) and the modules that need GPU kernel
packages at import time are stand-ins, as in ``extract_framework_args.py``. Prints one line per refused export
and a count per framework.
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


def _runs() -> list[tuple[object, object, str, str]]:
    """(spec, execution, precision, kind) of every export the test checks."""
    tests = Path(__file__).resolve().parents[2]
    conftest = _load(tests / "conftest.py", "_conftest")
    cases = _load(tests / "report" / "test_export_config.py", "_test_export_config")
    from mcdla.plan.llm_search import enumerate_executions

    runs = [(spec, e, precision, "case") for spec, e, precision in cases.CASES]
    cluster = conftest.figures_cluster(gpus_per_node=4, nodes=2, offload_bytes_per_s=10e9)
    for spec, space in cases.SEARCH_SPACES:
        found = enumerate_executions(spec, cluster, gpus=8, global_batch=16, **space).executions
        chosen = cases._one_of_each(found)  # noqa: SLF001 - the same selection as the test's
        runs += [(spec, e, cases.PRECISIONS[i % len(cases.PRECISIONS)], "candidate") for i, e in enumerate(chosen)]
    return runs


def validate_megatron(src: Path, runs: list) -> int:  # noqa: ANN001
    """Megatron's ``parse_args`` and ``validate_args`` on each export; the number refused."""
    from mcdla.report.export_config import megatron_args

    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    sys.path.insert(0, str(src))
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
            arguments.validate_args(arguments.parse_args(), {})
        except (AssertionError, ValueError, SystemExit) as exc:
            refused += 1
            print(f"REFUSED megatron {kind} {spec.name} {precision} {e}: {type(exc).__name__}: {exc}")
    return refused


def _torchtitan_split(src: Path):  # noqa: ANN202
    """torchtitan's ``generate_llm_fqn_per_model_part``, compiled alone from its source (its module imports
    the trainer's dependencies)."""
    import ast

    path = src / "torchtitan" / "distributed" / "pipeline_parallel.py"
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "generate_llm_fqn_per_model_part")
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["generate_llm_fqn_per_model_part"]


def validate_torchtitan(src: Path, runs: list) -> int:  # noqa: ANN001
    """torchtitan's ``ConfigManager`` on each TOML, then ``ParallelDims`` and its batch and split rules; the
    number refused."""
    import math

    from mcdla.report.export_config import torchtitan_toml
    from mcdla.workload.execution import chunk_layers

    for package in ("torchtitan", "torchtitan.distributed"):  # without the packages' __init__
        module = type(sys)(package)
        module.__path__ = [str(src.joinpath(*package.split(".")))]
        sys.modules[package] = module
    sys.path.insert(0, str(src))
    manager = importlib.import_module("torchtitan.config.manager")
    parallel_dims = importlib.import_module("torchtitan.distributed.parallel_dims")
    split = _torchtitan_split(src)
    refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        for spec, e, precision, kind in runs:
            path = Path(tmp, "job.toml")
            path.write_text(torchtitan_toml(e, spec, precision))
            try:
                job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
                par, train = job.parallelism, job.training
                dims = parallel_dims.ParallelDims(
                    dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                    cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                    ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=e.gpus)
                if not dims.fsdp_enabled and dims.dp_replicate > 1 and dims.dp_replicate != e.gpus:
                    raise ValueError("DDP has not supported > 1D parallelism")  # torchtitan's parallelize
                batch_degree = dims.dp_replicate * dims.dp_shard
                if train.global_batch_size % (train.local_batch_size * batch_degree):
                    raise ValueError("global batch size is not a multiple of local batch size x data-parallel degree")
                if dims.pp > 1:
                    if train.local_batch_size % par.pipeline_parallel_microbatch_size:
                        raise ValueError("local batch size is not a multiple of the pipeline micro-batch size")
                    parts = par.module_fqns_per_model_part
                    if parts is None:
                        first, last = (par.pipeline_parallel_first_stage_less_layers,
                                       par.pipeline_parallel_last_stage_less_layers)
                        stages = math.ceil((spec.layers + first + last) / par.pipeline_parallel_layers_per_stage)
                        if stages % dims.pp:
                            raise ValueError(f"{stages} virtual stages do not divide over pp = {dims.pp}")
                        parts = split(stages, spec.layers, first, last)
                    got = [sum(n.startswith("layers.") for n in part) for part in parts]
                    want = [chunk_layers(e, spec)[s][c] for c in range(e.virtual_stages) for s in range(e.pp)]
                    if got != want:
                        raise ValueError(f"torchtitan splits the layers {got}, the execution {want}")
            except (AssertionError, ValueError, SystemExit) as exc:
                refused += 1
                print(f"REFUSED torchtitan {kind} {spec.name} {precision} {e}: {type(exc).__name__}: {exc}")
    return refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", help="git directory of NVIDIA/Megatron-LM")
    ap.add_argument("--megatron-ref", default="HEAD")
    ap.add_argument("--torchtitan", help="git directory of pytorch/torchtitan")
    ap.add_argument("--torchtitan-ref", default="v0.2.2")
    a = ap.parse_args()
    runs = _runs()
    for name, git_dir, ref, paths, check in (("Megatron-LM", a.megatron, a.megatron_ref, ["megatron"], validate_megatron),
                                              ("torchtitan", a.torchtitan, a.torchtitan_ref, ["torchtitan"],
                                               validate_torchtitan)):
        if git_dir is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            commit = extract._checkout(git_dir, ref, paths, Path(tmp))  # noqa: SLF001
            refused = check(Path(tmp), runs)
        print(f"{name} {ref} ({commit[:12]}): {len(runs) - refused} of {len(runs)} exports accepted")


if __name__ == "__main__":
    main()
