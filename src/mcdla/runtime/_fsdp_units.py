"""FSDP2's sharded parameters as units of ``offload_parameters`` (NOTE [sharded units]).

NOTE [sharded units]
    Under ``fully_shard`` a module's parameters are DTensors whose local shard is a view of one padded 1-D
    tensor per parameter (``FSDPParam._sharded_param_data``); an ``FSDPParamGroup`` (one per ``fully_shard``
    call) all-gathers its shards into separate unsharded tensors before forward and before backward, and
    the optimizer updates the shards in place. So the bytes a rank holds between uses are exactly those
    padded shard storages, read at one moment only: the all-gather's copy-in, inside
    ``FSDPParamGroup.unshard``. Every all-gather goes through that method (the group's forward and
    backward pre-hooks, FSDP2's backward prefetch of the next group, explicit forward prefetch,
    ``FSDPModule.unshard()``, activation-checkpoint recomputation), so the offloader wraps it per group
    instance: fetch the group's shards (waiting for a prefetch in flight), start fetching the next
    ``prefetch`` groups in forward or backward order (the group's training state says which), run the
    all-gather, then store the shards if they changed and empty them. One group is one unit.

    Two FSDP2 facts the offloader relies on:
    - the root's lazy initialisation re-reads each shard (``FSDPParam.reset_sharded_param``: it compares
      storages and may re-pad), so it must run on full storages: :func:`lazy_init` runs it up front, as
      the first forward would;
    - with a group of one rank there is no all-gather and the unsharded parameter aliases the shard, so
      emptying the shard would empty the parameter in use: such a model is refused.

    Torch's internal names used here (``_get_module_fsdp_state``, ``_fsdp_param_groups``,
    ``_sharded_param_data``, ``_training_state``, ``_all_gather_result``) are those of torch 2.13
    (``constraints.txt``); a torch without them gets a one-line ConfigError from :func:`sharded_groups`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mcdla.errors import ConfigError

__all__: list[str] = []


@dataclass(slots=True, frozen=True)
class ShardedGroup:
    """One FSDP2 parameter group as a unit: its name, the shard storages it moves and how errors name them."""

    name: str
    group: Any  # torch's FSDPParamGroup
    holders: list[torch.Tensor]  # each moved parameter's padded 1-D shard (its storage is what moves)
    params: list[nn.Parameter]  # the sharded DTensor parameters the optimizer sees, in the same order
    labels: list[str]
    module_names: list[str]  # each moved parameter's owning module


def _fsdp_state_of(module: nn.Module) -> Any:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:  # torch without FSDP2: nothing is sharded
        return None
    return _get_module_fsdp_state(module)


def lazy_init(model: nn.Module) -> None:
    """Run FSDP2's lazy initialisation of every topmost ``fully_shard`` module in ``model`` (a no-op once done)."""
    tops: list[str] = []
    for name, module in model.named_modules():
        state = _fsdp_state_of(module)
        if state is None or any(t == "" or name.startswith(t + ".") for t in tops):
            continue
        tops.append(name)
        state._lazy_init()


def sharded_groups(model: nn.Module, only: dict[str, int] | None) -> list[ShardedGroup]:
    """The FSDP2 parameter groups of ``model`` with the shards to move (those of modules in ``only``, or all).

    Raises ConfigError (one line) for a group of one rank (NOTE [sharded units]) or a torch whose FSDP2
    internals differ from the ones this module reads.
    """
    names = {id(m): n for n, m in model.named_modules()}
    seen: set[int] = set()
    out: list[ShardedGroup] = []
    for _, module in model.named_modules():
        state = _fsdp_state_of(module)
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        try:
            groups = list(state._fsdp_param_groups)
        except AttributeError as exc:
            raise ConfigError(f"offload_parameters.model: FSDP2 internals differ from torch 2.13's ({exc}); "
                              "cannot move its shards") from None
        for group in groups:
            sg = _group_unit(group, names, only)
            if sg is not None:
                out.append(sg)
    return out


def _group_unit(group: Any, names: dict[int, str], only: dict[str, int] | None) -> ShardedGroup | None:
    try:
        fsdp_params = list(group.fsdp_params)
        world = group._all_gather_process_group.size()
        group_name = names.get(id(group.modules[0]), "")
    except AttributeError as exc:
        raise ConfigError(f"offload_parameters.model: FSDP2 internals differ from torch 2.13's ({exc}); "
                          "cannot move its shards") from None
    if world == 1:
        raise ConfigError(f"offload_parameters.model: FSDP2 group {group_name!r} has 1 rank; its unsharded "
                          "parameters alias the shards, so they cannot leave the device (use 2 ranks or more, "
                          "or the model without fully_shard)")
    holders, params, labels, owners = [], [], [], []
    for fp in fsdp_params:
        owner = names.get(id(fp._module_info.module), "")
        if only is not None and owner not in only:
            continue
        holder, local = fp._sharded_param_data, fp.sharded_param._local_tensor
        if (type(holder) is not torch.Tensor or holder.numel() == 0 or local.storage_offset() != 0
                or not local.is_contiguous() or local.untyped_storage().data_ptr() != holder.untyped_storage().data_ptr()):
            continue  # not a plain padded shard (a tensor subclass, an empty shard): left in place
        holders.append(holder)
        params.append(fp.sharded_param)
        labels.append(f"parameter {(owner + '.' if owner else '') + fp._module_info.param_name!r}")
        owners.append(owner)
    if not holders:
        return None
    return ShardedGroup(name=group_name, group=group, holders=holders, params=params, labels=labels,
                        module_names=owners)


def in_backward(group: Any) -> bool:
    """Whether ``group`` is being unsharded for backward (its own pre-backward or a backward prefetch)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    return group._training_state == TrainingState.PRE_BACKWARD


def gathers(group: Any) -> bool:
    """Whether ``group.unshard()`` would all-gather now (it is sharded and no all-gather is pending)."""
    return not group.is_unsharded and group._all_gather_result is None


def wrap_unshard(group: Any, around: Callable[[Callable[..., Any], tuple, dict], Any]) -> None:
    """Make ``group.unshard(...)`` call ``around(original, args, kwargs)`` (undone by :func:`unwrap_unshard`)."""
    original = group.unshard

    def unshard(*args: Any, **kwargs: Any) -> Any:
        return around(original, args, kwargs)

    group.unshard = unshard


def unwrap_unshard(group: Any) -> None:
    """Remove :func:`wrap_unshard`'s wrapper (the class's method applies again)."""
    group.__dict__.pop("unshard", None)


def copy_in_done(group: Any) -> None:
    """Wait until the all-gather just issued has copied the shards out (CUDA: its copy-in stream)."""
    if group.device.type == "cuda":
        group.comm_ctx.all_gather_copy_in_stream.synchronize()
