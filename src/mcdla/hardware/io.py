"""Load and save system descriptions (YAML or JSON) and look up the bundled presets.

Files say units in strings ("16GiB", "25GB/s", "125TFLOP/s", "1us"); they are converted to base units here
and nowhere else. Every figure has a ``source``. YAML anchors and merge keys (``<<: *nvlink2``) keep a
preset's repeated figures (and their sources) in one place. Format: ``docs/hardware-format.md``.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from mcdla._io_safety import read_document
from mcdla.errors import HardwareError, brief, field_path
from mcdla.hardware.model import Device, Link, LinkKind, Memory, MemoryKind, Switch, System
from mcdla.hardware.topology import Topology
from mcdla.units import parse_bytes, parse_bytes_per_s, parse_count, parse_flops_per_s, parse_seconds

__all__ = ["BANDWIDTH_BOUNDS_BYTES_PER_S", "CAPACITY_BOUNDS_BYTES", "LATENCY_BOUNDS_S", "PEAK_BOUNDS_FLOPS_PER_S",
           "preset_names", "load_system", "read_system_document", "system_from_dict", "explicit_system",
           "system_to_dict", "save_system", "within_bounds", "bandwidth_figure", "capacity_figure", "latency_figure",
           "LINK_BANDWIDTH", "LINK_LATENCY", "bandwidth_validator", "capacity_validator"]

_PRESET_PACKAGE = "mcdla.hardware.presets"
_Quantity = str | float | int

# NOTE [physical bounds]
# A file's figures must lie in a physical range, so that no accepted system turns a time into inf or NaN
# (1e-300 B/s makes any transfer overflow) and no typo passes as hardware. The ranges hold every device and
# link of the last decades with orders of magnitude to spare: 1 kB/s (a slow serial line) to 1 PB/s (100x a
# B200's 8 TB/s HBM); 0 to 1 s of one-way latency (a transatlantic hop is 0.04 s); 1 KiB to 1 EiB of memory;
# 1 MFLOP/s to 1 EFLOP/s per device (1,000x a B200). ``inf`` stays allowed where the file format gives it a
# meaning: an unlimited link or DRAM bandwidth (an on-die memory controller; a probed host memory whose limit is
# its link) and an unlimited capacity (the oracle).
#: Finite bandwidths a file may give, bytes/s (NOTE [physical bounds]).
BANDWIDTH_BOUNDS_BYTES_PER_S = (1e3, 1e15)
#: Latencies a file may give, seconds.
LATENCY_BOUNDS_S = (0.0, 1.0)
#: Finite memory capacities a file may give, bytes.
CAPACITY_BOUNDS_BYTES = (1024.0, float(2**60))
#: Peak compute rates a file may give, FLOP/s.
PEAK_BOUNDS_FLOPS_PER_S = (1e6, 1e18)
#: Special-function exponential rates a file may give, per second (0: not given; the top as the FLOP/s bound).
EXP_BOUNDS_PER_S = (0.0, 1e18)


def within_bounds(value: float, field: str, bounds: tuple[float, float], unit: str, *, allow_inf: bool) -> float:
    """``value`` if it lies in ``bounds`` (or is inf and ``allow_inf``); else a one-line HardwareError naming
    ``field``, the value and the range (NOTE [physical bounds])."""
    low, high = bounds
    if low <= value <= high or (allow_inf and value == float("inf")):
        return value
    also = " (or inf)" if allow_inf else ""
    raise HardwareError(f"{field}: got {value:g}{unit}; must be between {low:g}{unit} and {high:g}{unit}{also}, "
                        "a physical figure")


def bandwidth_figure(value: _Quantity, field: str, *, allow_inf: bool) -> float:
    """A file's bandwidth (``25GB/s``, a number of bytes/s) in bytes/s, within the physical bounds."""
    return within_bounds(parse_bytes_per_s(value, field), field, BANDWIDTH_BOUNDS_BYTES_PER_S, "B/s",
                         allow_inf=allow_inf)


def capacity_figure(value: _Quantity, field: str, *, allow_inf: bool) -> float:
    """A file's memory capacity (``80GiB``, a number of bytes) in bytes, within the physical bounds."""
    return within_bounds(parse_bytes(value, field), field, CAPACITY_BOUNDS_BYTES, "B", allow_inf=allow_inf)


def latency_figure(value: _Quantity, field: str = "latency") -> float:
    """A file's one-way latency (``2us``, a number of seconds) in seconds, within the physical bounds."""
    return within_bounds(parse_seconds(value, field), field, LATENCY_BOUNDS_S, "s", allow_inf=False)


def bandwidth_validator(*fields: str, allow_inf: bool) -> Any:
    """A pydantic validator turning each of ``fields`` into bytes/s (:func:`bandwidth_figure`), for a spec's
    class body: ``_bw = bandwidth_validator("bandwidth", allow_inf=True)``."""
    def check(cls: type, v: _Quantity, info: ValidationInfo) -> float:
        return bandwidth_figure(v, info.field_name or fields[0], allow_inf=allow_inf)
    return field_validator(*fields)(classmethod(check))  # type: ignore[arg-type]


def capacity_validator(*fields: str, allow_inf: bool) -> Any:
    """The same for memory capacities in bytes (:func:`capacity_figure`)."""
    def check(cls: type, v: _Quantity, info: ValidationInfo) -> float:
        return capacity_figure(v, info.field_name or fields[0], allow_inf=allow_inf)
    return field_validator(*fields)(classmethod(check))  # type: ignore[arg-type]


def _latency(cls: type, v: _Quantity) -> float:
    return latency_figure(v)


#: The ``bandwidth`` and ``latency`` validators of a link-like spec (a system file's links, a cluster's fabrics);
#: inf bandwidth is an idealised link that never binds (a test's or a what-if's figure; it adds no time).
LINK_BANDWIDTH = bandwidth_validator("bandwidth", allow_inf=True)
LINK_LATENCY = field_validator("latency")(classmethod(_latency))  # type: ignore[arg-type]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _DeviceSpec(_Spec):
    name: str
    peak_flops_per_s: dict[str, _Quantity]
    hbm: _Quantity = Field(description="device-memory capacity, e.g. 16GiB or inf")
    hbm_bandwidth: _Quantity
    compute_efficiency: float = Field(default=0.7, allow_inf_nan=False)
    memory_efficiency: float = Field(default=0.8, allow_inf_nan=False)
    exp_rate: _Quantity = Field(default=0.0, description="special-function exponentials per second, e.g. 3.9Texp/s")
    host_call_time: _Quantity = Field(default=0.0, description="host time per launch of a grouped GEMM's "
                                      "per-expert loop (GEMM call or quantization kernel), e.g. 40us")
    source: str

    @field_validator("host_call_time")
    @classmethod
    def _host_call(cls, v: _Quantity) -> float:
        return 0.0 if v == 0 else latency_figure(v, "host_call_time")

    @field_validator("exp_rate")
    @classmethod
    def _exp(cls, v: _Quantity) -> float:
        return within_bounds(parse_count(v, "exp_rate", noun="exp/s"), "exp_rate", EXP_BOUNDS_PER_S, "exp/s",
                             allow_inf=False)

    @field_validator("peak_flops_per_s")
    @classmethod
    def _flops(cls, v: dict[str, _Quantity]) -> dict[str, float]:
        return {k: within_bounds(parse_flops_per_s(x, f"peak_flops_per_s.{k}"), f"peak_flops_per_s.{k}",
                                 PEAK_BOUNDS_FLOPS_PER_S, "FLOP/s", allow_inf=False) for k, x in v.items()}

    _hbm = capacity_validator("hbm", allow_inf=True)
    # inf: an idealised device whose memory-bound kernels take no time (the oracle's kind of figure)
    _hbm_bw = bandwidth_validator("hbm_bandwidth", allow_inf=True)


class _MemorySpec(_Spec):
    name: str
    kind: Literal["host", "memory-node"]
    capacity: _Quantity
    dram_bandwidth: _Quantity
    source: str

    _cap = capacity_validator("capacity", allow_inf=True)
    _bw = bandwidth_validator("dram_bandwidth", allow_inf=True)


class _SwitchSpec(_Spec):
    name: str
    source: str = ""


class _LinkSpec(_Spec):
    a: str
    b: str
    bandwidth: _Quantity = Field(description="per direction, e.g. 25GB/s")
    latency: _Quantity = 0.0
    kind: Literal["nvlink", "pcie", "cpu-interconnect", "network", "other"] = "other"
    source: str

    _bw = LINK_BANDWIDTH
    _lat = LINK_LATENCY


class _SystemSpec(_Spec):
    format: Literal["mcdla-system/1"]
    name: str
    description: str = ""
    figures: dict[str, Any] = Field(default_factory=dict, description="anchors only; ignored after parsing")
    devices: list[_DeviceSpec]
    memories: list[_MemorySpec] = Field(default_factory=list)
    switches: list[_SwitchSpec] = Field(default_factory=list)
    links: list[_LinkSpec] = Field(default_factory=list)
    pools: dict[str, list[str]] = Field(default_factory=dict)
    rings: list[list[str]] = Field(default_factory=list)


def _one_line(exc: ValidationError, where: str) -> HardwareError:
    err = exc.errors()[0]
    path = field_path(err["loc"])
    got = err.get("input")
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    if err["type"] == "missing":
        return HardwareError(f"{where}: {path}: missing; this field is required")
    if err["type"] == "extra_forbidden":
        return HardwareError(f"{where}: {path}: unknown field")
    if err["type"] == "value_error" and ": got " in msg:  # a unit parser's message already names value and rule
        return HardwareError(f"{where}: {path}: got {msg.split(': got ', 1)[1]}")
    if err["type"] == "finite_number":
        msg = "must be a finite number"
    elif err["type"] == "model_type":  # pydantic names the internal spec class
        msg = "must be a mapping of its fields"
    elif msg.startswith("Input should be "):
        msg = "must be " + msg.removeprefix("Input should be ")
    return HardwareError(f"{where}: {path}: got {brief(got)}; {msg}")


def system_from_dict(data: Any, where: str = "system") -> System:
    """A parsed system file (generator or explicit graph) as the engine's :class:`System`: its
    :class:`~mcdla.hardware.cluster.Cluster`'s :meth:`~mcdla.hardware.cluster.Cluster.expand` (one-line errors)."""
    from mcdla.hardware.cluster import cluster_from_dict

    return cluster_from_dict(data, where).expand()


def explicit_system(data: Any, where: str = "system") -> System:
    """Validate a listed graph (devices, memories, switches, links: an explicit graph file, or the form a generator
    expands to) into a :class:`System`; checks routes too (one-line errors). Files load through
    :func:`~mcdla.hardware.cluster.load_cluster` (or :func:`system_from_dict`), which call this."""
    if not isinstance(data, dict):
        raise HardwareError(f"{where}: got {type(data).__name__}; must be a mapping with format: mcdla-system/1")
    try:
        spec = _SystemSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, where) from None
    except HardwareError as exc:
        raise HardwareError(f"{where}: {exc}") from None
    system = System(
        name=spec.name,
        description=spec.description,
        devices=tuple(
            Device(
                name=d.name,
                peak_flops_per_s=d.peak_flops_per_s,
                hbm_bytes=d.hbm,
                hbm_bytes_per_s=d.hbm_bandwidth,
                compute_efficiency=d.compute_efficiency,
                memory_efficiency=d.memory_efficiency,
                exp_per_s=d.exp_rate,
                host_call_s=d.host_call_time,
                source=d.source,
            )
            for d in spec.devices
        ),
        memories=tuple(
            Memory(name=m.name, kind=MemoryKind(m.kind), capacity_bytes=m.capacity, dram_bytes_per_s=m.dram_bandwidth, source=m.source)
            for m in spec.memories
        ),
        switches=tuple(Switch(name=s.name, source=s.source) for s in spec.switches),
        links=tuple(
            Link(a=l.a, b=l.b, bytes_per_s=l.bandwidth, latency_s=l.latency, kind=LinkKind(l.kind), source=l.source)
            for l in spec.links
        ),
        pools={k: tuple(v) for k, v in spec.pools.items()},
        rings=tuple(tuple(r) for r in spec.rings),
    )
    Topology(system)  # validates connectivity and pool routes
    return system


def _quantity(value: float, unit: str) -> str | float:
    return "inf" if value == float("inf") else f"{value:g}{unit}"


def system_to_dict(system: System) -> dict[str, Any]:
    """The file form of ``system`` (units spelled out), loadable by :func:`system_from_dict`."""
    return {
        "format": "mcdla-system/1",
        "name": system.name,
        "description": system.description,
        "devices": [
            {
                "name": d.name,
                "peak_flops_per_s": {k: _quantity(v, "FLOP/s") for k, v in d.peak_flops_per_s.items()},
                "hbm": _quantity(d.hbm_bytes, "B"),
                "hbm_bandwidth": _quantity(d.hbm_bytes_per_s, "B/s"),
                "compute_efficiency": d.compute_efficiency,
                "memory_efficiency": d.memory_efficiency,
                **({"exp_rate": _quantity(d.exp_per_s, "exp/s")} if d.exp_per_s else {}),
                **({"host_call_time": _quantity(d.host_call_s, "s")} if d.host_call_s else {}),
                "source": d.source,
            }
            for d in system.devices
        ],
        "memories": [
            {"name": m.name, "kind": m.kind.value, "capacity": _quantity(m.capacity_bytes, "B"),
             "dram_bandwidth": _quantity(m.dram_bytes_per_s, "B/s"), "source": m.source}
            for m in system.memories
        ],
        "switches": [{"name": s.name, "source": s.source} for s in system.switches],
        "links": [
            {"a": l.a, "b": l.b, "bandwidth": _quantity(l.bytes_per_s, "B/s"), "latency": f"{l.latency_s:g}s",
             "kind": l.kind.value, "source": l.source}
            for l in system.links
        ],
        "pools": {k: list(v) for k, v in system.pools.items()},
        "rings": [list(r) for r in system.rings],
    }


def save_system(system: System, path: str | Path) -> None:
    """Write ``system`` as YAML or JSON, by the file's suffix."""
    p = Path(path)
    data = system_to_dict(system)
    p.write_text(json.dumps(data, indent=2) + "\n" if p.suffix == ".json" else yaml.safe_dump(data, sort_keys=False))


def preset_names() -> tuple[str, ...]:
    """Names of the bundled presets (``dc-dla``, ``mc-dla``, ...)."""
    files = resources.files(_PRESET_PACKAGE).iterdir()
    return tuple(sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml")))


def _read(path: Path) -> Any:
    """Parse a system file safely: regular UTF-8 file, bounded size, YAML aliases and depth bounded."""
    return read_document(path, what="system file", error=HardwareError)


@functools.cache
def _preset_document(name: str) -> Any:
    """A bundled preset's parsed file, parsed once per process (the package's files do not change while it
    runs); callers get a deep copy."""
    return yaml.safe_load(resources.files(_PRESET_PACKAGE).joinpath(f"{name}.yaml").read_text())


def read_system_document(name_or_path: str | Path) -> tuple[Any, str]:
    """The parsed file of a preset name (``"mc-dla"``) or system file path, and how errors name it; one-line
    HardwareError for neither."""
    text = str(name_or_path)
    if text in preset_names():
        return copy.deepcopy(_preset_document(text)), f"preset {text!r}"
    path = Path(text)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        return _read(path), f"system file {brief(text, 200)}"
    raise HardwareError(
        f"system: got {brief(text)}; must be a preset ({', '.join(preset_names())}) or a .yaml/.json file"
    )


def load_system(name_or_path: str | Path) -> System:
    """A preset by name (``"mc-dla"``) or a system file by path as the engine's link graph:
    ``load_cluster(name_or_path).expand()``; one-line HardwareError otherwise."""
    from mcdla.hardware.cluster import load_cluster

    return load_cluster(name_or_path).expand()
