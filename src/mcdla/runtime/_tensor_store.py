"""Whole tensors kept in a pool between uses: optimizer state, master weights and parameters.

Saved activations move as records of one step (``_records``); the state that outlives a step (Adam moments,
fp32 master weights, layer weights) is simpler: a tensor is written as one block when it is put away and
read back into a storage of the same size when it is needed, with the pool's spill, capacities and the
tiers' own integrity checks (CRC-32 per file block, zstd frame checksums). Reading does not consume a
block, so a block stays valid until the tensor is put away again with new bytes.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from mcdla.runtime.pool import Block, Pool

__all__: list[str] = []


@dataclass(slots=True, kw_only=True, eq=False)
class _Stored:
    """One tensor's bytes in a tier: its block plus what is needed to rebuild the tensor."""

    block: Block
    dtype: torch.dtype
    shape: torch.Size


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s bytes in this process: a DTensor's local shard (FSDP2's sharded parameters
    and their gradients), else ``t``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over all of ``storage`` (a private version counter: writing it bumps no one's)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor as a writable memoryview, valid while ``t`` lives.

    Not ``t.numpy()``: that marks the storage as not resizable for good, and parameter and master-weight
    storages are emptied and refilled with ``resize_``.
    """
    assert t.device.type == "cpu" and t.is_contiguous(), (t.device, t.stride())
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def put(pool: Pool, tensor: torch.Tensor, *, label: str, start: int = 0) -> _Stored:
    """Write ``tensor`` (CPU, any dtype) into the first tier of ``pool`` from ``start`` with room; ``label``
    names it in errors."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    index, reserved = pool.reserve(flat.numel(), start=start, label=label)
    block = pool.write(byte_view(flat), index=index, reserved_bytes=reserved, label=label)
    return _Stored(block=block, dtype=tensor.dtype, shape=tensor.shape)


def read_into(stored: _Stored, out: torch.Tensor) -> None:
    """Copy the stored bytes into ``out`` (CPU, contiguous, ``stored.block.nbytes`` bytes); the tier checks them."""
    stored.block.tier.read_into(stored.block, byte_view(out))


def get(stored: _Stored) -> torch.Tensor:
    """A new CPU tensor holding the stored bytes."""
    out = torch.empty(stored.shape, dtype=stored.dtype)
    read_into(stored, out)
    return out


def free(stored: _Stored | None) -> None:
    """Release a stored tensor's block (nothing for None)."""
    if stored is not None:
        stored.block.tier.free(stored.block)
