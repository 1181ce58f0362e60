"""Workloads: the layer-chain model of one training step, plans over it, files, and the zoo of eight
applications. Plain data: nothing here imports torch."""

from __future__ import annotations

from pathlib import Path

from mcdla.errors import WorkloadError
from mcdla.workload import zoo
from mcdla.workload.io import SUFFIXES, load_workload_file, save_workload
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action, Decision, Plan

__all__ = [
    "Layer",
    "LayerKind",
    "Workload",
    "Plan",
    "Action",
    "Decision",
    "load_workload",
    "load_workload_file",
    "save_workload",
    "zoo",
]


def load_workload(name_or_path: str | Path, batch: int | None = None) -> Workload:
    """A zoo workload by name (``"vgg-e"``) or a workload file by path (``.json``/``.yaml``/``.yml``).

    ``batch`` (samples per device): for a zoo name, the batch to build at (None = its default batch); for a
    file, rescale the file's workload to it with :meth:`Workload.with_batch` (None = as in the file).
    """
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in zoo.names():
        return zoo.build(text, batch=batch)
    path = Path(name_or_path)
    if path.suffix.lower() not in SUFFIXES and not path.exists():
        raise WorkloadError(
            f"workload: got {text!r}; must be a zoo name ({', '.join(zoo.names())}) "
            "or a path to a .json/.yaml/.yml workload file"
        )
    workload = load_workload_file(path)
    return workload if batch is None else workload.with_batch(batch)
