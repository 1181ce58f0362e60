"""Load and save workloads as JSON or YAML files in the ``mcdla-workload/1`` format.

The format is documented in ``docs/workload-format.md``. Files are checked at this boundary with pydantic;
every problem becomes ONE-line :class:`~mcdla.errors.WorkloadError` naming the file, the field path
(``layers[3].fwd_flops``), the value and what is allowed. Byte fields accept sizes such as ``"1.5GiB"``
(parsed by :func:`mcdla.units.parse_bytes`); FLOP fields accept plain numbers (or numeric strings such as
``"2.3e9"``, since YAML 1.1 reads ``2.3e9`` as a string).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mcdla._io_safety import read_document
from mcdla.errors import ConfigError, WorkloadError, brief, field_path
from mcdla.units import parse_bytes, parse_flops_per_s
from mcdla.workload.model import Layer, LayerKind, Measurement, Workload

__all__ = ["FORMAT", "SUFFIXES", "MAX_LAYER_BYTES", "MAX_LAYER_FLOPS", "MAX_LAYER_TIME_S", "MAX_OPTIMIZER_FACTOR",
           "workload_to_dict", "workload_from_dict", "load_workload_file", "save_workload"]

FORMAT = "mcdla-workload/1"
SUFFIXES = (".json", ".yaml", ".yml")

MAX_BATCH = 2**31 - 1
#: Largest byte figure of one layer (1 EiB): a million such layers times (2 + optimizer factor) stays finite.
MAX_LAYER_BYTES = float(2**60)
#: Largest FLOP figure of one layer's pass (1e24, eight orders above a GPT-3 layer on a 1536 x 2048 batch).
MAX_LAYER_FLOPS = 1e24
#: Largest measured time of one layer's pass, seconds (11.6 days).
MAX_LAYER_TIME_S = 1e6
#: Largest optimizer_bytes_per_param_byte (Adam with fp32 master weights on fp16 parameters is 6).
MAX_OPTIMIZER_FACTOR = 1e3
_FLOP_FIELDS = ("fwd_flops", "bwd_flops")
_BYTE_FIELDS = (
    "fwd_bytes_moved",
    "bwd_bytes_moved",
    "param_bytes",
    "output_bytes",
    "saved_bytes",
    "workspace_bytes",
)


def _flop_number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number of FLOP >= 0")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError("must be a number of FLOP >= 0 (plain number, e.g. 2.3e9)") from None
    if not isinstance(value, (int, float)):
        raise ValueError("must be a finite number of FLOP >= 0")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("must be a finite number of FLOP >= 0 (this one is too large)") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError("must be a finite number of FLOP >= 0")
    if number > MAX_LAYER_FLOPS:
        raise ValueError(f"must be at most {MAX_LAYER_FLOPS:g} FLOP per layer and pass")
    return number


def _byte_number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a size in bytes >= 0 (a number or a string like '1.5GiB')")
    try:
        number = parse_bytes(value)
    except ConfigError:
        raise ValueError("must be a size in bytes >= 0 (a number or a string like '1.5GiB')") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite size in bytes")
    if number > MAX_LAYER_BYTES:
        raise ValueError(f"must be at most {MAX_LAYER_BYTES:g} bytes (1 EiB) per layer")
    return number


class _LayerFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: LayerKind
    fwd_flops: float
    bwd_flops: float
    fwd_bytes_moved: float = 0.0
    bwd_bytes_moved: float = 0.0
    param_bytes: float = 0.0
    output_bytes: float = 0.0
    saved_bytes: float = 0.0
    workspace_bytes: float = 0.0
    inputs: list[str] = Field(default_factory=list)
    fwd_time_s: float | None = Field(default=None, ge=0, le=MAX_LAYER_TIME_S, allow_inf_nan=False)
    bwd_time_s: float | None = Field(default=None, ge=0, le=MAX_LAYER_TIME_S, allow_inf_nan=False)

    @field_validator(*_FLOP_FIELDS, mode="before")
    @classmethod
    def _flops(cls, value: Any) -> float:
        return _flop_number(value)

    @field_validator(*_BYTE_FIELDS, mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> float:
        return _byte_number(value)


class _MeasuredOnFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(min_length=1)
    peak_flops_per_s: float | None = None

    @field_validator("peak_flops_per_s", mode="before")
    @classmethod
    def _peak(cls, value: Any) -> float | None:
        if value is None:
            return None
        allowed = "must be a finite peak rate > 0 such as 312TFLOP/s (or a plain FLOP/s number), or null"
        try:
            peak = parse_flops_per_s(value) if not isinstance(value, bool) else math.nan
        except ConfigError:
            raise ValueError(allowed) from None
        if not (math.isfinite(peak) and peak > 0):
            raise ValueError(allowed)
        return peak


class _WorkloadFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    name: str = Field(min_length=1)
    batch: int = Field(ge=1, le=MAX_BATCH, strict=True)
    precision: str = "fp16"
    optimizer_bytes_per_param_byte: float = Field(default=1.0, ge=0, le=MAX_OPTIMIZER_FACTOR, allow_inf_nan=False)
    description: str = ""
    measured_on: _MeasuredOnFile | None = None
    layers: list[_LayerFile] = Field(min_length=1)

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value != FORMAT:
            raise ValueError(f"must be {FORMAT!r}")
        return value


_GENERIC = MappingProxyType({
    "string_too_short": "must be a non-empty string",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "extra_forbidden": "unknown field",
})


def _allowed_text(err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "enum":
        return "must be one of " + ", ".join(k.value for k in LayerKind)
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length', 1)} item(s)"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "finite_number":
        return "must be a finite number"
    return _GENERIC.get(kind, str(err["msg"]).lower())


def _one_line(error: ValidationError) -> str:
    err = error.errors()[0]
    path = field_path(err["loc"])
    if err["type"] == "missing":
        return f"{path}: required field is missing"
    shown = brief(err.get("input"))
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{path}: got {shown}; {_allowed_text(err)}{suffix}"


def _plain(number: float) -> int | float:
    """Integral floats as ints (exact below 2**53) so files read naturally; others unchanged."""
    if number.is_integer() and abs(number) < 2**53:
        return int(number)
    return number


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The ``mcdla-workload/1`` document of ``workload``: every quantity in base units (FLOP, bytes)."""
    layers = []
    for layer in workload.layers:
        entry: dict[str, Any] = {"name": layer.name, "kind": layer.kind.value}
        for name in _FLOP_FIELDS + _BYTE_FIELDS:
            entry[name] = _plain(getattr(layer, name))
        if layer.inputs:
            entry["inputs"] = list(layer.inputs)
        for name in ("fwd_time_s", "bwd_time_s"):
            if getattr(layer, name) is not None:
                entry[name] = getattr(layer, name)
        layers.append(entry)
    return {
        "format": FORMAT,
        "name": workload.name,
        "batch": workload.batch,
        "precision": workload.precision,
        "optimizer_bytes_per_param_byte": _plain(float(workload.optimizer_bytes_per_param_byte)),
        "description": workload.description,
        **({"measured_on": _measured_on_dict(workload.measured_on)} if workload.measured_on is not None else {}),
        "layers": layers,
    }


def _measured_on_dict(measured: Measurement) -> dict[str, Any]:
    doc: dict[str, Any] = {"device": measured.device}
    if measured.peak_flops_per_s is not None:
        doc["peak_flops_per_s"] = _plain(float(measured.peak_flops_per_s))
    return doc


def workload_from_dict(data: Any, *, source: str = "workload") -> Workload:
    """Validate a ``mcdla-workload/1`` document and build the Workload; ``source`` prefixes error messages."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{source}: got a {type(data).__name__}; must be a mapping with format {FORMAT!r}")
    try:
        parsed = _WorkloadFile.model_validate(dict(data))
    except ValidationError as exc:
        raise WorkloadError(f"{source}: {_one_line(exc)}") from None
    try:
        layers = tuple(
            Layer(**{k: v for k, v in spec.model_dump().items() if k != "inputs"}, inputs=tuple(spec.inputs))
            for spec in parsed.layers
        )
        return Workload(
            name=parsed.name,
            batch=parsed.batch,
            layers=layers,
            precision=parsed.precision,
            optimizer_bytes_per_param_byte=parsed.optimizer_bytes_per_param_byte,
            description=parsed.description,
            measured_on=None if parsed.measured_on is None else Measurement(**parsed.measured_on.model_dump()),
        )
    except WorkloadError as exc:
        raise WorkloadError(f"{source}: {exc}") from None


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise WorkloadError(
            f"workload file {str(path)!r}: suffix {suffix or '(none)'!r} is not supported; "
            f"must be one of {', '.join(SUFFIXES)}"
        )
    return suffix


def load_workload_file(path: str | Path) -> Workload:
    """Load a workload from a ``.json``, ``.yaml`` or ``.yml`` file (format chosen by suffix).

    Only regular UTF-8 files up to 64 MiB are read; YAML aliases and nesting are bounded (``mcdla._io_safety``).
    """
    p = Path(path)
    if p.name.lower().endswith((".et", ".et.gz")):  # a Chakra execution trace (docs/chakra.md)
        from mcdla.workload.chakra import load_chakra_workload

        return load_chakra_workload(p)
    suffix = _suffix(p)
    data = read_document(p, what="workload file", error=WorkloadError, json_format=suffix == ".json")
    return workload_from_dict(data, source=f"workload file {str(p)[:200]!r}")


def save_workload(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` to ``path`` as JSON or YAML (by suffix); returns the path written."""
    p = Path(path)
    suffix = _suffix(p)
    doc = workload_to_dict(workload)
    if suffix == ".json":
        text = json.dumps(doc, indent=1) + "\n"
    else:
        text = yaml.safe_dump(doc, sort_keys=False, width=120)
    p.write_text(text)
    return p
