"""The rank layout of a parallel training run: sizes of each parallel dimension, rank <-> coordinates, groups.

Modelled on torchtitan's ``ParallelDims``: one object that knows the degrees, validates them against the world
size and answers "which ranks form the tensor-parallel group of rank r" for every consumer (the LLM time model's
mapping of groups onto fabric dimensions, the per-rank schedule, the configuration search, Chakra export), so
the rank order is written down once.

NOTE [rank order]
Megatron-LM's order, tensor parallel fastest, then context, data and pipeline parallel:
``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``. A group of dimension ``x`` holds the ranks
that differ only in ``x``: ``size(x)`` ranks, ``stride(x)`` apart (the product of the sizes inside ``x``), so a
tensor-parallel group is consecutive ranks inside one node and a pipeline's stages are ``tp cp dp`` ranks
apart. Expert parallelism (``ep``) borrows ranks from the data x context parallel group, as in Megatron-Core
(whose expert rank order is ``tp-ep-dp-pp`` over ``tp x (cp dp) x pp``): an expert-parallel group is ``ep``
consecutive ranks of the ``cp dp`` group (stride ``tp``), so ``ep`` divides ``cp dp``; its complement, the
expert-data-parallel group that reduces the expert gradients, is ``cp dp / ep`` ranks ``tp ep`` apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from mcdla.errors import ConfigError, brief

__all__ = ["DIMENSIONS", "Dimension", "ParallelDims", "RankCoordinates", "group_strides"]

Dimension = Literal["tp", "cp", "dp", "pp", "ep"]
DIMENSIONS: tuple[Dimension, ...] = ("tp", "cp", "dp", "pp")
"""The layout's dimensions, innermost (fastest-varying rank) first (NOTE [rank order]); ``ep`` lies inside
``cp x dp``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCoordinates:
    """One rank's index in each dimension (``ep`` is its index inside its expert-parallel group)."""

    tp: int
    cp: int
    dp: int
    pp: int
    ep: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelDims:
    """Degrees of tensor (``tp``), context (``cp``), data (``dp``), pipeline (``pp``) and expert (``ep``, inside
    ``cp x dp``) parallelism over ``world_size = tp cp dp pp`` ranks (NOTE [rank order])."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "pp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel_dims.{name}: got {brief(value)}; must be an integer >= 1")
        if (self.cp * self.dp) % self.ep:
            raise ConfigError(f"parallel_dims.ep: got {self.ep}; must divide cp*dp = {self.cp}*{self.dp} (experts "
                              "are sharded over the data x context parallel ranks)")

    @classmethod
    def of(cls, execution: object) -> ParallelDims:
        """The layout of anything with ``tp``, ``cp``, ``dp``, ``pp`` (and optionally ``ep``) attributes, such as
        :class:`~mcdla.workload.execution.Execution`."""
        return cls(tp=execution.tp, cp=execution.cp, dp=execution.dp, pp=execution.pp,  # type: ignore[attr-defined]
                   ep=getattr(execution, "ep", 1))

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def size(self, dim: Dimension) -> int:
        """Ranks in one group of ``dim``."""
        self._check_dim(dim)
        return getattr(self, dim)

    def stride(self, dim: Dimension) -> int:
        """Rank distance between neighbours of a ``dim`` group (the product of the sizes inside it)."""
        self._check_dim(dim)
        if dim == "ep":
            return self.tp
        inner = 1
        for d in DIMENSIONS:
            if d == dim:
                return inner
            inner *= getattr(self, d)
        raise AssertionError(dim)  # _check_dim accepted it

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The rank at these coordinates."""
        for name, value in (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < getattr(self, name):
                raise ConfigError(f"parallel_dims.rank: {name} got {brief(value)}; must be in 0..{getattr(self, name) - 1}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coordinates(self, rank: int) -> RankCoordinates:
        """The coordinates of ``rank``."""
        self._check_rank(rank)
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return RankCoordinates(tp=tp, cp=cp, dp=dp, pp=pp, ep=(cp + self.cp * dp) % self.ep)

    def group(self, dim: Dimension, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group of ``dim``, ascending."""
        return self.strided(rank, self.size(dim), self.stride(dim))

    def strided(self, rank: int, size: int, stride: int) -> tuple[int, ...]:
        """The ``size`` ranks ``stride`` apart that hold ``rank`` (ascending): a group given by its size and
        stride, as :meth:`~mcdla.hardware.cluster.Cluster.group_dims` takes one, such as the ``dp x cp``
        replicas (``dp cp`` ranks ``tp`` apart) or the expert-data-parallel group (``dp cp / ep``, ``tp ep``
        apart) that reduce the gradients. ConfigError when the blocks of ``size * stride`` ranks do not tile
        the world."""
        self._check_rank(rank)
        if (isinstance(size, bool) or isinstance(stride, bool) or not isinstance(size, int)
                or not isinstance(stride, int) or size < 1 or stride < 1 or self.world_size % (size * stride)):
            raise ConfigError(f"parallel_dims.strided: got size {brief(size)}, stride {brief(stride)}; must be "
                              f"integers >= 1 whose product divides the {self.world_size} ranks")
        index = (rank // stride) % size
        first = rank - index * stride
        return tuple(first + i * stride for i in range(size))

    def groups(self, dim: Dimension) -> tuple[tuple[int, ...], ...]:
        """Every group of ``dim``, each ascending, ordered by their first rank; together they cover every rank
        once."""
        size, stride = self.size(dim), self.stride(dim)
        return tuple(tuple(first + i * stride for i in range(size)) for first in range(self.world_size)
                     if (first // stride) % size == 0)

    def _check_dim(self, dim: str) -> None:
        if dim not in ("tp", "cp", "dp", "pp", "ep"):
            raise ConfigError(f"parallel_dims.dimension: got {brief(dim)}; must be one of tp, cp, dp, pp, ep")

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"parallel_dims.rank: got {brief(rank)}; must be an integer in 0..{self.world_size - 1}")


@lru_cache(maxsize=4096)
def group_strides(tp: int, cp: int, dp: int, pp: int, ep: int = 1) -> tuple[int, int, int, int]:
    """The rank strides of a layout's TP, PP, CP and EP groups (:meth:`ParallelDims.stride`, which checks the
    degrees), memoised: a configuration search prices a few hundred layouts, each many times."""
    layout = ParallelDims(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep)
    return layout.stride("tp"), layout.stride("pp"), layout.stride("cp"), layout.stride("ep")
