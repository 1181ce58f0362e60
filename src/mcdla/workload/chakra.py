"""Chakra execution traces (ET): the file framing, and import of a trace as a workload (``docs/chakra.md``).

A Chakra ET file holds protobuf messages of Chakra's schema (``mcdla/workload/et_def/et_def.proto``), each
prefixed by its length as a varint: one ``GlobalMetadata``, then ``Node`` messages. There is one file per
rank, ``<prefix>.<rank>.et``; Chakra's readers also accept it gzipped. :func:`write_trace` and
:func:`read_trace` implement that framing (as Chakra's ``protolib.encodeMessage`` / ``decodeMessage`` and
the C++ feeder do); every problem in a file is one :class:`~mcdla.errors.WorkloadError` line naming the file,
the message and its byte offset.

:func:`workload_from_trace` maps a trace onto the workload model:

* a trace written by mcdla (:mod:`mcdla.report.chakra`; its metadata has ``mcdla.format``) carries every
  layer's facts: each layer gets its sizes and FLOPs back, and as measured times the durations its forward and
  backward took in the simulated iteration. Simulating the imported workload with the same system, plan and
  parallelism reproduces the iteration exactly.
* any other trace: each compute node (``COMP_NODE``; only the GPU ones, ``is_cpu_op`` false, when the trace
  marks any) becomes one layer, in dependency order, whose forward time is the node's ``duration_micros``
  (FLOPs from ``num_ops``, bytes moved from ``tensor_size``); backward time 0 and nothing saved, since a
  generic trace says neither which op is a backward nor what autograd keeps. Communication and memory nodes
  are not imported: the simulated system and parallelism produce their own. A trace whose compute nodes carry
  no durations is refused.
"""

from __future__ import annotations

import gzip
import heapq
import io
import math
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError, Message

from mcdla._io_safety import atomic_output
from mcdla.errors import WorkloadError
from mcdla.workload.et_def import et_def_pb2 as pb
from mcdla.workload.io import MAX_LAYER_BYTES, MAX_LAYER_FLOPS, MAX_LAYER_TIME_S, MAX_OPTIMIZER_FACTOR
from mcdla.workload.model import Layer, LayerKind, Workload

__all__ = ["MCDLA_FORMAT", "SCHEMA_VERSION", "MAX_TRACE_BYTES", "MAX_GZIP_RATIO", "MAX_TRACE_NODES", "pb",
           "encode_varint", "write_trace", "read_trace", "attr_value", "workload_from_trace", "load_chakra_workload"]

MCDLA_FORMAT = "mcdla-chakra/1"
"""``mcdla.format`` in the metadata of traces mcdla writes."""
SCHEMA_VERSION = "0.0.4"
"""``GlobalMetadata.version`` mcdla writes: the version ASTRA-sim's examples write."""
# NOTE [trace bounds]
# A trace costs memory by its node count (~1.1 KB per parsed Node), not by its bytes, and a gzipped trace can
# inflate a thousandfold (a 1 MB .et.gz of zeros is 1 GiB). So the file is read and gunzipped in 1 MiB steps,
# stopping as soon as it passes MAX_TRACE_BYTES or MAX_GZIP_RATIO times its compressed size, and parsing stops
# past MAX_TRACE_NODES nodes: a hostile trace costs at most ~0.6 GB and a few seconds.
MAX_TRACE_BYTES = 256 * 2**20
"""Largest trace read (after gunzip), bytes."""
MAX_GZIP_RATIO = 100
"""Largest decompressed / compressed size of a gzipped trace (traces compress 5-20x; zeros 1000x)."""
MAX_TRACE_NODES = 500_000
"""Most nodes a trace may hold (about 0.55 GB parsed)."""
_READ_STEP = 2**20

_NODE_FIELDS = 11  # Node's highest field number in the schema; unknown fields above it are a newer schema's


def encode_varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer (protobuf's length prefix)."""
    if value < 0:
        raise ValueError(f"varint: got {value}; must be >= 0")
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def write_trace(path: str | Path, metadata: Message, nodes: Iterable[Message]) -> Path:
    """Write one rank's ET: ``metadata`` then ``nodes``, each length-prefixed. Returns the path.

    Chakra's readers stop at a zero-length message, so an empty message (a node with no field set) is refused.
    The file appears only when complete (:func:`mcdla._io_safety.atomic_output`): a full disk leaves no partial
    trace.
    """
    p = Path(path)
    with atomic_output(p, "wb") as f:
        for k, message in enumerate((metadata, *nodes)):
            data = message.SerializeToString()
            if not data:
                raise WorkloadError(f"Chakra trace {str(p)!r}: message {k} is empty; Chakra's readers would stop "
                                    "there (give every node a name)")
            f.write(encode_varint(len(data)))
            f.write(data)
    return p


def _read_bounded(stream: Any, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of ``stream``, read in steps; a WorkloadError naming ``what`` past it."""
    parts: list[bytes] = []
    total = 0
    while True:
        part = stream.read(min(_READ_STEP, limit + 1 - total))
        if not part:
            return b"".join(parts)
        parts.append(part)
        total += len(part)
        if total > limit:
            raise WorkloadError(what)


def _read_bytes(path: Path) -> bytes:
    shown = repr(str(path)[:200])
    what = "Chakra trace"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise WorkloadError(f"{what}: got {shown}; no such file") from None
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"{what}: got {shown}; cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise WorkloadError(f"{what}: got {shown}; must be a regular file")
    too_big = f"{what}: got {shown}; more than {MAX_TRACE_BYTES // 2**20} MiB, must be at most that"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            raw = _read_bounded(f, MAX_TRACE_BYTES, too_big)
        if raw[:2] == b"\x1f\x8b":  # gzipped, as Chakra's openFileRd accepts
            limit = min(MAX_TRACE_BYTES, MAX_GZIP_RATIO * len(raw))
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
                raw = _read_bounded(g, limit, f"{what}: got {shown}; it inflates past {limit} bytes, must be at "
                                              f"most {MAX_GZIP_RATIO}x its {len(raw)} gzipped bytes and "
                                              f"{MAX_TRACE_BYTES // 2**20} MiB")
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise WorkloadError(f"{what}: got {shown}; cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    return raw


def _decode_varint(data: bytes, pos: int, source: str, k: int) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while True:
        if pos >= len(data):
            raise WorkloadError(f"{source}: message {k} at byte {start}: the length prefix (varint) is truncated; "
                                "the file ends inside it")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise WorkloadError(f"{source}: message {k} at byte {start}: the length prefix (varint) is longer than "
                                "10 bytes; not a Chakra ET file")


def read_trace(path: str | Path) -> tuple[Any, list[Any]]:
    """``(GlobalMetadata, [Node, ...])`` of one rank's ET file (plain or gzipped).

    Raises:
        WorkloadError: one line naming the file, the message and its byte offset: a truncated length prefix or
            message, a zero-length message, a message that is not a GlobalMetadata (first) or Node (others).
    """
    p = Path(path)
    source = f"Chakra trace {str(p)[:200]!r}"
    data = _read_bytes(p)
    if not data:
        raise WorkloadError(f"{source}: the file is empty; must start with a GlobalMetadata message")
    pos = 0
    k = 0
    metadata = None
    nodes = []
    while pos < len(data):
        start = pos
        size, pos = _decode_varint(data, pos, source, k)
        what = "GlobalMetadata" if k == 0 else "Node"
        if size == 0:
            raise WorkloadError(f"{source}: message {k} at byte {start}: zero length; must be a non-empty {what} "
                                "(Chakra's readers stop at an empty message)")
        if pos + size > len(data):
            raise WorkloadError(f"{source}: message {k} at byte {start}: its length is {size} bytes but only "
                                f"{len(data) - pos} are left; the file is truncated")
        if k > MAX_TRACE_NODES:
            raise WorkloadError(f"{source}: message {k} at byte {start}: more than {MAX_TRACE_NODES} nodes; a trace "
                                f"must have at most {MAX_TRACE_NODES}")
        message = pb.GlobalMetadata() if k == 0 else pb.Node()
        try:
            message.ParseFromString(data[pos:pos + size])
        except DecodeError:
            raise WorkloadError(f"{source}: message {k} at byte {start}: not a Chakra {what} (corrupt protobuf or "
                                "another message type)") from None
        unknown = _unknown_fields(message)
        if k == 0 and unknown:
            raise WorkloadError(f"{source}: message 0 at byte 0: not a Chakra GlobalMetadata (it has fields "
                                f"{unknown[:5]} the schema does not define; is it a Node?)")
        if k > 0 and any(n <= _NODE_FIELDS for n in unknown):
            raise WorkloadError(f"{source}: message {k} at byte {start}: not a Chakra Node (fields of the wrong "
                                "type)")
        if k == 0:
            metadata = message
        else:
            nodes.append(message)
        pos += size
        k += 1
    return metadata, nodes


def _unknown_fields(message: Message) -> list[int]:
    from google.protobuf import unknown_fields

    return sorted({f.field_number for f in unknown_fields.UnknownFieldSet(message)})


def attr_value(attrs: Sequence[Any], name: str, default: Any = None) -> Any:
    """The value of the attribute ``name`` (whichever of its ``oneof`` is set), or ``default``."""
    for a in attrs:
        if a.name == name:
            which = a.WhichOneof("value")
            if which is None:
                return default
            value = getattr(a, which)
            return list(value.values) if which.endswith("_list") else value
    return default


# -- import ---------------------------------------------------------------------------------------------------
def _number(value: Any, source: str, what: str, high: float) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= high):
        raise WorkloadError(f"{source}: {what}: got {value!r}; must be a finite number >= 0 and <= {high:g}")
    return float(value)


def _names(value: Any, source: str, what: str) -> tuple[str, ...]:
    """``value`` as a tuple of layer names: a list of strings (an attribute's ``string_list``)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WorkloadError(f"{source}: {what}: got {value!r:.80}; must be a list of layer names (string_list)")
    return tuple(value)


def _dependency_order(nodes: Sequence[Any]) -> list[Any]:
    """Nodes in an order where every node follows its dependencies (data and control), file order on ties;
    dependencies on ids not in the file are ignored."""
    ids = {n.id: i for i, n in enumerate(nodes)}
    children: list[list[int]] = [[] for _ in nodes]
    pending = [0] * len(nodes)
    for i, n in enumerate(nodes):
        for dep in {*n.data_deps, *n.ctrl_deps}:
            j = ids.get(dep)
            if j is not None and j != i:
                children[j].append(i)
                pending[i] += 1
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for c in children[i]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(nodes):
        raise ValueError("cycle")
    return order


def _from_mcdla(metadata: Any, nodes: Sequence[Any], source: str, name: str | None) -> Workload:
    meta = metadata.attr
    share = attr_value(meta, "mcdla.time_share", 1)
    if not isinstance(share, int) or share < 1:
        raise WorkloadError(f"{source}: metadata mcdla.time_share: got {share!r}; must be an integer >= 1")
    fwd: dict[int, Any] = {}
    bwd: dict[int, Any] = {}
    for n in nodes:
        if n.type != pb.COMP_NODE:
            continue
        phase = attr_value(n.attr, "mcdla.phase")
        index = attr_value(n.attr, "mcdla.layer_index")
        if phase not in ("F", "B"):
            continue  # recomputations follow from the plan
        target = fwd if phase == "F" else bwd
        if not isinstance(index, int) or index < 0 or index in target:
            raise WorkloadError(f"{source}: node {n.id} ({n.name!r}) mcdla.layer_index: got {index!r}; must be a "
                                f"distinct integer >= 0 per {phase} node")
        target[index] = n
    count = len(fwd)
    if count == 0 or set(fwd) != set(range(count)) or set(bwd) != set(fwd):
        raise WorkloadError(f"{source}: an mcdla trace must have one F and one B compute node per layer "
                            f"0..n-1; got F for {sorted(fwd)[:8]} and B for {sorted(bwd)[:8]}")
    layers = []
    for i in range(count):
        f, b = fwd[i], bwd[i]
        a = f.attr

        def num(node: Any, key: str) -> float:
            high = MAX_LAYER_FLOPS if key == "mcdla.flops" else MAX_LAYER_BYTES
            return _number(attr_value(node.attr, key, 0.0), source, f"node {node.id} {key}", high)

        layers.append(Layer(
            name=attr_value(a, "mcdla.layer", f.name),
            kind=attr_value(a, "mcdla.layer_kind", "other"),
            fwd_flops=num(f, "mcdla.flops") * share,
            bwd_flops=num(b, "mcdla.flops") * share,
            fwd_bytes_moved=num(f, "mcdla.bytes_moved") * share,
            bwd_bytes_moved=num(b, "mcdla.bytes_moved") * share,
            param_bytes=num(f, "mcdla.param_bytes"),
            output_bytes=num(f, "mcdla.output_bytes"),
            saved_bytes=num(f, "mcdla.saved_bytes"),
            workspace_bytes=num(f, "mcdla.workspace_bytes"),
            inputs=_names(attr_value(a, "mcdla.inputs", []), source, f"node {f.id} mcdla.inputs"),
            fwd_time_s=_duration_s(f, source) * share,
            bwd_time_s=_duration_s(b, source) * share,
        ))
    batch = attr_value(meta, "mcdla.batch", 1)
    return Workload(
        name=name or attr_value(meta, "mcdla.workload", "chakra"),
        batch=batch if isinstance(batch, int) and batch >= 1 else 1,
        layers=tuple(layers),
        precision=attr_value(meta, "mcdla.precision", "fp16"),
        optimizer_bytes_per_param_byte=_number(attr_value(meta, "mcdla.optimizer_bytes_per_param_byte", 1.0),
                                               source, "metadata mcdla.optimizer_bytes_per_param_byte",
                                               MAX_OPTIMIZER_FACTOR),
        description=f"imported from the Chakra trace of rank {attr_value(meta, 'mcdla.rank', 0)} "
                    f"({attr_value(meta, 'mcdla.system', '?')}, {attr_value(meta, 'mcdla.parallel', '?')}-parallel)",
    )


def _duration_s(node: Any, source: str) -> float:
    """A node's duration (s): mcdla's exact ``mcdla.duration_s`` when present, else ``duration_micros``."""
    exact = attr_value(node.attr, "mcdla.duration_s")
    if exact is not None:
        return _number(exact, source, f"node {node.id} mcdla.duration_s", MAX_LAYER_TIME_S)
    return node.duration_micros / 1e6


def workload_from_trace(metadata: Any, nodes: Sequence[Any], *, source: str = "Chakra trace",
                        name: str | None = None, default_name: str = "chakra") -> Workload:
    """The workload of one rank's trace (see the module docstring for the mapping).

    ``name``: the workload's name (default: the one an mcdla trace records, else ``default_name``)."""
    try:
        if attr_value(metadata.attr, "mcdla.format") == MCDLA_FORMAT:
            return _from_mcdla(metadata, nodes, source, name)
        return _from_generic(nodes, source, name or default_name)
    except WorkloadError as exc:
        text = str(exc)
        raise WorkloadError(text if text.startswith(source) else f"{source}: {text}") from None


def _from_generic(nodes: Sequence[Any], source: str, name: str | None) -> Workload:
    try:
        ordered = _dependency_order(nodes)
    except ValueError:
        raise WorkloadError(f"{source}: the dependencies (data_deps, ctrl_deps) form a cycle; must be a DAG") from None
    comp = [n for n in ordered if n.type == pb.COMP_NODE]
    if not comp:
        raise WorkloadError(f"{source}: no COMP_NODE; a workload needs compute nodes with durations")
    gpu = [n for n in comp if not attr_value(n.attr, "is_cpu_op", True)]
    comp = gpu or comp
    if not any(n.duration_micros > 0 for n in comp):
        raise WorkloadError(f"{source}: its {len(comp)} compute nodes carry no durations (duration_micros is 0 "
                            "everywhere); a workload needs measured times")
    seen: dict[str, int] = {}
    for n in comp:
        seen[n.name] = seen.get(n.name, 0) + 1
    layers = []
    for n in comp:
        label = n.name or f"node {n.id}"
        if seen.get(n.name, 0) > 1 or not n.name:
            label = f"{label} #{n.id}"
        flops = attr_value(n.attr, "num_ops", 0)
        moved = attr_value(n.attr, "tensor_size", 0)
        layers.append(Layer(
            name=label, kind=LayerKind.OTHER,
            fwd_flops=_number(flops, source, f"node {n.id} num_ops", MAX_LAYER_FLOPS), bwd_flops=0.0,
            fwd_bytes_moved=_number(moved, source, f"node {n.id} tensor_size", MAX_LAYER_BYTES),
            fwd_time_s=_number(n.duration_micros / 1e6, source, f"node {n.id} duration_micros / 1e6",
                               MAX_LAYER_TIME_S), bwd_time_s=0.0,
        ))
    if len({l.name for l in layers}) != len(layers):
        raise WorkloadError(f"{source}: node names and ids do not give distinct layer names")
    return Workload(name=name or "chakra", batch=1, layers=tuple(layers), optimizer_bytes_per_param_byte=0.0,
                    description=f"{len(layers)} compute nodes of a Chakra trace, serialized, forward only")


def load_chakra_workload(path: str | Path, *, name: str | None = None) -> Workload:
    """The workload of the Chakra ET file ``path`` (one rank's; see :func:`workload_from_trace`)."""
    p = Path(path)
    metadata, nodes = read_trace(p)
    default = p.name.removesuffix(".gz").removesuffix(".et") or "chakra"
    return workload_from_trace(metadata, nodes, source=f"Chakra trace {str(p)[:200]!r}", name=name,
                               default_name=default)
