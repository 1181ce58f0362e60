"""The units ``offload_parameters`` moves (NOTE [parameter offload]): which tensors' storages leave the device
together, found once when the offloader is built."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mcdla.runtime import _fsdp_units as fsdp
from mcdla.runtime import _tensor_store as store

__all__: list[str] = []


@dataclass(slots=True, kw_only=True, eq=False)
class Unit:
    """A module's own parameters, or an FSDP2 group's shards, moved together."""

    name: str
    params: list[torch.Tensor]  # the tensors whose storages move: the parameters, or FSDP2's padded shards
    labels: list[str]  # how errors name each parameter ("parameter 'body.0.weight'")
    nbytes: int
    prefetch: int  # units fetched ahead when this one is fetched for use
    start_tiers: list[int] = field(default_factory=list)  # per parameter: the pool tier its block goes to first
    group: Any = None  # the FSDP2 parameter group whose all-gather this unit feeds (NOTE [sharded units])
    stored: list[store._Stored | None] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # each parameter's version when its bytes were last stored
    resident: bool = True
    fetch: Future | None = None  # bytes being read into the storages
    awaiting_grads: int = 0  # trained parameters whose gradient this backward has not accumulated yet


def _whole_storage(p: torch.Tensor) -> bool:
    """Whether ``p`` is a plain dense tensor covering exactly its own storage (only those are moved)."""
    return (type(p.data) is torch.Tensor and p.layout is torch.strided and p.numel() > 0 and p.is_contiguous()
            and p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * p.element_size())


def build_units(model: nn.Module, only: dict[str, int] | None, depth: dict[str, int], prefetch: int
                ) -> tuple[list[tuple[Any, Unit]], dict[int, tuple[Unit, int]]]:
    """The units to move, each with its module (or FSDP2 group), and id(parameter) -> (unit, index).

    Every module owning plain parameters is a unit, or those in ``only`` (name -> first tier); parameters shared
    by several modules stay in place. Every FSDP2 group is one (NOTE [sharded units]), its lazy initialisation
    run first. ``depth`` gives a module's prefetch depth (default ``prefetch``).
    """
    fsdp.lazy_init(model)  # FSDP2 re-reads its shards there (NOTE [sharded units]); before anything reads them
    owners: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        for p in m._parameters.values():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
    units: list[tuple[Any, Unit]] = []
    where: dict[int, tuple[Unit, int]] = {}
    for name, m in model.named_modules():
        own = [(n, p) for n, p in m._parameters.items() if p is not None and owners[id(p)] == 1
               and _whole_storage(p)]
        if not own or (only is not None and name not in only):
            continue
        unit = Unit(name=name, params=[p for _, p in own], prefetch=depth.get(name, prefetch),
                    start_tiers=[0 if only is None else only[name]] * len(own),
                    labels=[f"parameter {(name + '.' if name else '') + n!r}" for n, _ in own],
                    nbytes=sum(p.untyped_storage().nbytes() for _, p in own),
                    stored=[None] * len(own), versions=[-1] * len(own))
        units.append((m, unit))
        where.update({id(p): (unit, i) for i, p in enumerate(unit.params)})
    for sg in fsdp.sharded_groups(model, only):
        unit = Unit(name=sg.name, params=sg.holders, labels=sg.labels, group=sg.group,
                    nbytes=sum(h.untyped_storage().nbytes() for h in sg.holders),
                    prefetch=depth.get(sg.module_names[0], prefetch),
                    start_tiers=[0 if only is None else only[m] for m in sg.module_names],
                    stored=[None] * len(sg.holders), versions=[-1] * len(sg.holders))
        units.append((sg.group, unit))
        where.update({id(p): (unit, i) for i, p in enumerate(sg.params)})
    return units, where
