"""The ``mcdla-plan/1`` document's types, checked before a :class:`~mcdla.workload.plan.Plan` is built.

A plan file comes from a user, so every field is checked for its type here (strings are strings, the batch
is an integer, byte counts are finite numbers or null) and a mistake becomes one-line
:class:`~mcdla.errors.PlanError` naming the field, a bounded rendering of the value and what is allowed.
What the values mean (budgets, known layers) is checked by ``Plan`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from mcdla.errors import PlanError, brief, field_path

__all__ = ["check_plan_document"]

_MAX_BATCH = 2**31 - 1
_MAX_PREFETCH = 2**31 - 1


class _DecisionDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer: StrictStr = Field(min_length=1)
    action: Literal["keep", "offload", "recompute"]
    tier: StrictStr | None = None
    prefetch_at: StrictStr | None = None


class _StateDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer: StrictStr = Field(min_length=1)
    weights: Literal["device", "offload"] = "device"
    gradients: Literal["device", "offload"] = "device"
    optimizer_state: Literal["device", "offload"] = "device"
    tier: StrictStr = "pool"
    prefetch: int = Field(default=1, strict=True, ge=0, le=_MAX_PREFETCH)


class _PlanDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["mcdla-plan/1"]
    workload: StrictStr
    batch: int = Field(strict=True, ge=1, le=_MAX_BATCH)
    budget_bytes: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    saved_cap_bytes: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    planner: StrictStr = "manual"
    notes: StrictStr = ""
    layer_names: list[StrictStr] = Field(default_factory=list)
    decisions: list[_DecisionDoc]
    state: list[_StateDoc] = Field(default_factory=list)


_ALLOWED = {
    "string_type": "must be a string",
    "string_too_short": "must be a non-empty string",
    "int_type": "must be an integer",
    "float_type": "must be a number (or null)",
    "finite_number": "must be a finite number (null for no budget)",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "literal_error": "must be one of keep, offload, recompute",
    "greater_than_equal": "must be >= 1",
    "less_than_equal": f"must be <= {_MAX_BATCH}",
}


def check_plan_document(data: Mapping[str, Any]) -> None:
    """Raise one-line PlanError unless ``data`` has the ``mcdla-plan/1`` fields with the right types."""
    try:
        _PlanDoc.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors()
        err = errors[0]
        path = field_path(err["loc"], "plan")
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        if err["type"] == "missing":
            raise PlanError(f"{path}: required field is missing{more}") from None
        if err["type"] == "extra_forbidden":
            raise PlanError(f"{path}: unknown field{more}") from None
        allowed = _ALLOWED.get(err["type"], " ".join(str(err["msg"]).split()).lower())
        if err["type"] == "literal_error" and err["loc"][:1] == ("state",):
            allowed = "must be one of device, offload"
        if err["loc"][:1] == ("state",) and err["loc"][-1:] == ("prefetch",):
            allowed = f"must be an integer from 0 to {_MAX_PREFETCH} (offloaded-weight layers fetched ahead)"
        raise PlanError(f"{path}: got {brief(err.get('input'))}; {allowed}{more}") from None
