"""One parameter's share of an offloaded optimizer: its CPU update, where its state is, and the copies
between the training device and the host (NOTE [optimizer offload] in ``optimizer``)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from mcdla.runtime import _tensor_store as store

__all__: list[str] = []

MASTER_KEY = "master_param"  # the fp32 master weight's key in state_dict() under mixed precision
LOW_PRECISION = (torch.float16, torch.bfloat16)


class Copier:
    """Copies between the training device and the host: side streams and pinned memory on CUDA, none on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.d2h = torch.cuda.Stream(device=device)
            self.h2d = torch.cuda.Stream(device=device)

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``t``'s bytes on the host and the CUDA event after which they are there (None: there already)."""
        t = t.detach()
        if not self.cuda:
            return t, None
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_stream(torch.cuda.current_stream(t.device))
            host.copy_(t, non_blocking=True)
            t.record_stream(self.d2h)
            done = torch.cuda.Event()
            done.record(self.d2h)
        return host, done

    def to_device(self, dst: torch.Tensor, host: torch.Tensor) -> None:
        """Start copying ``host`` into ``dst``; the compute stream waits for it (see :meth:`settle`)."""
        if not self.cuda:
            dst.copy_(host)
            return
        compute = torch.cuda.current_stream(dst.device)
        with torch.cuda.stream(self.h2d):
            self.h2d.wait_stream(compute)
            dst.copy_(host, non_blocking=True)
        compute.wait_stream(self.h2d)

    def settle(self) -> None:
        """Wait until the copies back have landed, so their host sources may be freed."""
        if self.cuda:
            self.h2d.synchronize()


@dataclass(slots=True, kw_only=True, eq=False)
class Slot:
    """One trained parameter: its CPU update, where its state is, and the update in flight this step."""

    param: torch.Tensor
    name: str
    group_index: int  # the wrapped optimizer's group (hyperparameters are read from it at each launch)
    master: torch.Tensor  # CPU tensor the update runs on, its storage empty between updates (kept: the parameter)
    inner: torch.optim.Optimizer  # the wrapped class over [master]
    mixed: bool  # the master is kept in the pool (a wider dtype than the parameter)
    start_tier: int | None  # the pool tier its blocks go to first; None: a plan keeps its state on the device
    free_grad: bool = False  # drop the gradient from the parameter once copied out for the update
    stored: dict[str, store._Stored] = field(default_factory=dict)  # state key (or MASTER_KEY) -> block
    future: Future | None = None
    grad: torch.Tensor | None = None  # the gradient the update in flight read, and its version
    grad_version: int = -1

    @property
    def kept(self) -> bool:
        return self.start_tier is None

    @property
    def master_nbytes(self) -> int:
        return self.master.numel() * self.master.element_size()

    def label(self, key: str) -> str:
        what = "master weight" if key == MASTER_KEY else f"optimizer state {key!r}"
        return f"{what} of parameter {self.name!r}"


def param_sized(value: Any, master: torch.Tensor) -> bool:
    """Whether a state entry is a per-element tensor (moved to the pool) rather than a scalar such as ``step``."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == master.shape


def one_parameter_optimizer(optimizer: torch.optim.Optimizer, master: torch.Tensor) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class over ``[master]`` alone (its group is refreshed at each update)."""
    cls = type(optimizer)
    try:
        return cls([master], **optimizer.defaults)
    except TypeError:
        return cls([master])
