"""The link-level system that a sequence of fabric dimensions describes: a star of private ports per level.

:func:`~mcdla.sim.collective_models.closed_form_time` prices a collective on
:class:`~mcdla.hardware.cluster.FabricDim` s; :func:`dims_system` materialises the same dimensions so the flow
evaluator can run the collective over real links and the two can be compared (they agree on an idle fabric,
NOTE [why the phases equal the closed forms] in :mod:`mcdla.sim.collective_phases`).

NOTE [dimension star]
Device ``g{r}`` (r = 0..P-1, level ``i`` coordinate ``r // prod(sizes[:i]) % sizes[i]``) reaches level ``i``
through its own chain of ``i + 1`` links of bandwidth ``B_i`` to the switch ``s{i}.{scope}`` shared by the
``prod(sizes[:i+1])`` devices that agree on every coordinate above ``i``. A GPU-to-GPU route across level ``i``
thus has ``2 (i + 1)`` links, each of latency ``a_i / (2 (i + 1))`` (the route's latency is ``a_i``), and is
the fewest-hop route between two devices whose highest differing coordinate is ``i``: lower levels' switches do
not join them, higher levels' chains are longer. Every port is private, so on an idle fabric a flow is slowed
only by the collective's own flows on its ports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mcdla.hardware.cluster import FabricDim
from mcdla.hardware.model import Device, Link, Switch, System

__all__ = ["dims_system"]

_SOURCE = "mcdla.sim.fabric_of_dims: materialised from FabricDim figures (NOTE [dimension star])"


def dims_system(dims: Sequence[FabricDim], *, name: str = "dims") -> System:
    """A :class:`System` of ``prod(d.size)`` devices ``g0..`` joined as ``dims`` says (NOTE [dimension star])."""
    seq = tuple(dims)
    total = math.prod(d.size for d in seq)
    devices = tuple(Device(name=f"g{r}", peak_flops_per_s={"fp16": 1e15}, hbm_bytes=80e9, hbm_bytes_per_s=3e12,
                           source=_SOURCE + "; compute figures unused by collectives") for r in range(total))
    switches: list[Switch] = []
    links: list[Link] = []
    for i, d in enumerate(seq):
        if d.size == 1:
            continue
        scope_size = math.prod(x.size for x in seq[: i + 1])
        latency = d.latency_s / (2 * (i + 1))
        for scope in range(total // scope_size):
            switches.append(Switch(name=f"s{i}.{scope}", source=_SOURCE))
        for r in range(total):
            chain = [f"g{r}"] + [f"c{i}.{j}.g{r}" for j in range(1, i + 1)] + [f"s{i}.{r // scope_size}"]
            switches.extend(Switch(name=c, source=_SOURCE) for c in chain[1:-1])
            links.extend(Link(a=a, b=b, bytes_per_s=d.bytes_per_s, latency_s=latency, kind=d.kind, source=_SOURCE)
                         for a, b in zip(chain, chain[1:]))
    return System(name=name, devices=devices, switches=tuple(switches), links=tuple(links),
                  description=f"{len(seq)}-level star of {total} devices ({', '.join(d.name for d in seq)})")
