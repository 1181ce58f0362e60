"""The PyTorch runtime: offload the tensors autograd saves to a tiered memory pool, prefetch them back.

:func:`virtualize` is the entry point (also ``mcdla.virtualize``); :func:`keep_resident` opts a region
out; :func:`offload_optimizer` and :func:`offload_parameters` put optimizer state and weights in the pool; pools are chains of :class:`HostTier`, :class:`DeviceTier`, :class:`FileTier` and
:class:`CompressTier`, usually given as spec strings (:func:`parse_pool`); every step leaves a
:class:`StepReport`. Usage and design: ``docs/runtime.md``.
"""

from mcdla.runtime.optimizer import OffloadedOptimizer, offload_optimizer
from mcdla.runtime.parameters import ParameterOffloader, offload_parameters
from mcdla.runtime.pool import Block, Pool, Tier, TierFullError, parse_pool
from mcdla.runtime.report import StepReport, TransferSpan, WaitSpan
from mcdla.runtime.tiers_compress import CompressTier
from mcdla.runtime.tiers_device import DeviceTier
from mcdla.runtime.tiers_file import FileTier
from mcdla.runtime.tiers_host import HostBufferPool, HostTier, size_class_bytes
from mcdla.runtime.virtualize import DEFAULT_MIN_BYTES, DEFAULT_WINDOW, Virtualizer, keep_resident, virtualize

__all__ = [
    "virtualize",
    "keep_resident",
    "offload_optimizer",
    "OffloadedOptimizer",
    "offload_parameters",
    "ParameterOffloader",
    "Virtualizer",
    "DEFAULT_MIN_BYTES",
    "DEFAULT_WINDOW",
    "Pool",
    "Tier",
    "Block",
    "TierFullError",
    "parse_pool",
    "HostTier",
    "HostBufferPool",
    "size_class_bytes",
    "FileTier",
    "CompressTier",
    "DeviceTier",
    "StepReport",
    "TransferSpan",
    "WaitSpan",
]
