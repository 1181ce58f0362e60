"""Refresh ``framework_args.json``: Megatron-LM's command-line arguments and torchtitan's TOML keys, read from the
frameworks' own sources, so that the exported launch configurations can be checked without the frameworks.

Not a test and not run by the suite (it needs the two repositories and Megatron's imports); run it by hand::

    python tests/report/data/extract_framework_args.py --megatron GIT_DIR [--megatron-ref REF] \
        --torchtitan GIT_DIR [--torchtitan-ref REF] [--out tests/report/data/framework_args.json]

``GIT_DIR`` is a clone (bare or not) of github.com/NVIDIA/Megatron-LM and of github.com/pytorch/torchtitan.
Megatron's parser is built by its own ``add_megatron_arguments`` (the arguments ``pretrain_gpt.py`` parses,
many generated from its config dataclasses), imported from ``git archive REF``; the few modules that need GPU
kernel packages at import time (triton) are replaced by stand-ins, which the parser does not use. torchtitan's
keys are the fields of ``JobConfig`` (``torchtitan/config/job_config.py``), the dataclass its ``ConfigManager``
fills from ``--job.config_file`` TOML, walked recursively; ``--torchtitan-ref`` defaults to ``v0.2.2``, the last
release that reads TOML (torchtitan's main configures a run as a Python function since).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import importlib.abc
import importlib.machinery
import json
import re
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path
from unittest import mock

MEGATRON_PATH = "megatron/training/arguments.py"
TORCHTITAN_PATH = "torchtitan/config/job_config.py"
# Megatron modules that import triton at import time; the argument parser needs none of them.
_MEGATRON_STUBS = ("megatron.core.transformer.moe.ops.paged_stash", "megatron.core.ssm.ops.common.causal_conv1d_varlen",
                   "megatron.core.ssm.ops.mamba2.batch_invariant_decode")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-in modules for the named ones (and their submodules): any attribute is a MagicMock."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module) -> None:  # noqa: ANN001
        pass


def _checkout(git_dir: str, ref: str, paths: list[str], into: Path) -> str:
    """``git archive`` ``paths`` at ``ref`` into ``into``; the commit's full hash."""
    commit = subprocess.run(["git", "-C", git_dir, "rev-parse", f"{ref}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", git_dir, "archive", commit, *paths], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def _type_name(t: object) -> str | None:
    if t is None:
        return None
    return {int: "int", float: "float", str: "str"}.get(t, "other")  # type: ignore[arg-type]


def megatron_arguments(src: Path) -> dict[str, dict[str, object]]:
    """Every option string of Megatron's parser: its action, value type, choices and nargs."""
    import typing as _typing
    if not hasattr(_typing, "override"):  # Megatron needs Python >= 3.12's typing.override; a no-op suffices
        _typing.override = lambda f: f  # type: ignore[attr-defined]
    sys.path.insert(0, str(src))
    sys.meta_path.insert(0, _Stubs(_MEGATRON_STUBS))
    arguments = importlib.import_module("megatron.training.arguments")
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    out: dict[str, dict[str, object]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of its actions
        kind = {argparse._StoreTrueAction: "store_true", argparse._StoreFalseAction: "store_false",  # noqa: SLF001
                argparse._StoreAction: "store", argparse._StoreConstAction: "store_const",  # noqa: SLF001
                argparse._AppendAction: "append"}.get(type(action), "other")  # noqa: SLF001
        if kind == "other" or not action.option_strings:
            continue
        choices = None
        if action.choices is not None:
            choices = sorted(c.name if isinstance(c, enum.Enum) else str(c) for c in action.choices)
        entry = {"action": kind, "dest": action.dest, "type": _type_name(action.type) if kind == "store" else None,
                 "choices": choices, "nargs": action.nargs if isinstance(action.nargs, str) else None}
        for option in action.option_strings:  # argparse's own dest and null fields left out, to keep it small
            derived = option.lstrip("-").replace("-", "_")
            out[option] = {k: v for k, v in entry.items() if v is not None and not (k == "dest" and v == derived)}
    return dict(sorted(out.items()))


def _quoted_after(text: str, marker: str) -> list[str]:
    """The double-quoted words on the line of ``text`` that contains ``marker``."""
    line = next(line for line in text.splitlines() if marker in line)
    return sorted(set(re.findall(r'"([^"]+)"', line)))


def megatron_values(src: Path) -> dict[str, dict[str, object]]:
    """Allowed values of the emitted options whose argparse definition has no ``choices``, from the docstring
    of the config field they fill."""
    path = "megatron/core/transformer/transformer_config.py"
    text = src.joinpath(path).read_text()
    return {"--cp-comm-type": {"path": path, "choices": _quoted_after(text, "cp_comm_type of each layer can be")}}


def torchtitan_values(src: Path) -> dict[str, dict[str, object]]:
    """The names ``model.converters`` accepts: every ``register_model_converter(cls, "name")`` of the tree."""
    names = sorted({m for p in src.joinpath("torchtitan").rglob("*.py")
                    for m in re.findall(r'register_model_converter\(\s*\w+,\s*"([^"]+)"', p.read_text())})
    return {"model.converters": {"path": "torchtitan/**/*.py register_model_converter", "choices": names}}


def _field_spec(t: object) -> dict[str, object]:
    """A dataclass field's TOML value type: ``int``, ``float``, ``bool``, ``str``, ``list[str]``, ... with the
    ``Literal`` choices and whether ``None`` is allowed."""
    optional = False
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (types.UnionType, typing.Union):
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            spec = _field_spec(rest[0])
            return {**spec, "optional": optional or bool(spec["optional"])}
        return {"type": " | ".join(sorted(_field_spec(a)["type"] for a in rest)),  # type: ignore[misc]
                "choices": None, "optional": optional}
    if origin is typing.Literal:
        return {"type": type(args[0]).__name__, "choices": list(args), "optional": False}
    if origin is list:
        return {"type": f"list[{_field_spec(args[0])['type']}]", "choices": None, "optional": False}
    return {"type": getattr(t, "__name__", str(t)), "choices": None, "optional": False}


def torchtitan_keys(src: Path) -> dict[str, dict[str, object]]:
    """Every leaf field of ``JobConfig`` as a dotted ``section.key`` (nested sections dotted too)."""
    for package in ("torchtitan", "torchtitan.config", "torchtitan.tools"):  # without the packages' __init__
        module = types.ModuleType(package)  # (they import the trainer's dependencies)
        module.__path__ = [str(src.joinpath(*package.split(".")))]
        sys.modules[package] = module
    job_config = importlib.import_module("torchtitan.config.job_config")
    hints_of = {}

    def walk(cls: type, prefix: str, out: dict[str, dict[str, object]]) -> None:
        hints = hints_of.setdefault(cls, typing.get_type_hints(cls))
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            if dataclasses.is_dataclass(t):
                walk(t, f"{prefix}{f.name}.", out)
            else:
                out[f"{prefix}{f.name}"] = _field_spec(t)

    keys: dict[str, dict[str, object]] = {}
    walk(job_config.JobConfig, "", keys)
    return keys


def _dumps(data: dict[str, dict[str, object]]) -> str:
    """JSON with one line per argument or key, so that a refresh reads as a small diff."""
    parts = []
    for framework, body in data.items():
        table = "arguments" if "arguments" in body else "keys"
        head = {k: v for k, v in body.items() if k != table}
        rows = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in body[table].items())
        parts.append(f" {json.dumps(framework)}: {json.dumps(head)[:-1]}, {json.dumps(table)}: {{\n{rows}\n }}}}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True, help="git directory of NVIDIA/Megatron-LM")
    ap.add_argument("--megatron-ref", default="HEAD")
    ap.add_argument("--torchtitan", required=True, help="git directory of pytorch/torchtitan")
    ap.add_argument("--torchtitan-ref", default="v0.2.2")
    ap.add_argument("--out", default=str(Path(__file__).with_name("framework_args.json")))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        meg, tt = Path(tmp, "megatron"), Path(tmp, "torchtitan")
        meg.mkdir()
        tt.mkdir()
        meg_commit = _checkout(a.megatron, a.megatron_ref, ["megatron"], meg)
        tt_commit = _checkout(a.torchtitan, a.torchtitan_ref, ["torchtitan"], tt)
        data = {
            "megatron": {"repo": "NVIDIA/Megatron-LM", "commit": meg_commit, "path": MEGATRON_PATH,
                         "parser": "megatron.training.arguments.add_megatron_arguments",
                         "values": megatron_values(meg), "arguments": megatron_arguments(meg)},
            "torchtitan": {"repo": "pytorch/torchtitan", "ref": a.torchtitan_ref, "commit": tt_commit,
                           "path": TORCHTITAN_PATH, "parser": "torchtitan.config.job_config.JobConfig",
                           "values": torchtitan_values(tt), "keys": torchtitan_keys(tt)},
        }
    Path(a.out).write_text(_dumps(data))
    print(f"{a.out}: {len(data['megatron']['arguments'])} Megatron options at {meg_commit[:12]}, "
          f"{len(data['torchtitan']['keys'])} torchtitan keys at {a.torchtitan_ref} ({tt_commit[:12]})")


if __name__ == "__main__":
    main()
