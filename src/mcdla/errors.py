"""One error base for the whole package, one subclass per layer.

Messages name the field, the value and what is allowed, e.g.
``hardware.links[0].bandwidth_bytes_per_s: got -3; must be > 0``. The CLI prints the message on one line
and exits 2; nothing below the CLI prints.
"""

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "McdlaError",
    "ConfigError",
    "WorkloadError",
    "HardwareError",
    "PlanError",
    "SimError",
    "RuntimeTierError",
    "OffloadError",
    "ProfileError",
    "brief",
    "field_path",
    "validation_line",
]


class McdlaError(Exception):
    """Base of every error mcdla raises on purpose (bad input, infeasible request, detected corruption)."""


class ConfigError(McdlaError, ValueError):
    """A value given at the boundary (file, CLI, API argument) is malformed or out of range."""


class WorkloadError(ConfigError):
    """A workload description is invalid or names an unknown workload."""


class HardwareError(ConfigError):
    """A system description is invalid: unknown preset, bad figure, disconnected topology, missing route."""


class PlanError(McdlaError):
    """A plan is malformed, infeasible, or made for a different workload."""


class SimError(McdlaError):
    """The simulator cannot run the request (e.g. a deadlock caused by an impossible memory budget)."""


class RuntimeTierError(McdlaError):
    """A memory-pool tier failed (I/O error, full disk, closed pool)."""


class OffloadError(McdlaError):
    """A saved tensor could not be restored exactly: lost, corrupted, truncated or fetched twice."""


class ProfileError(McdlaError):
    """Profiling a model failed: the model's forward raised, the loss is not a scalar, etc."""


def brief(value: object, limit: int = 60) -> str:
    """A bounded rendering of a user-given value for an error message, never longer than about ``limit``.

    Strings and numbers are shown as their repr (cut with ``...``); containers and other objects by their
    type and size only, so a huge or alias-expanded input is never walked or printed. Integers too long to
    print are described by their digit count.
    """
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 3 * limit:
            digits = int((value.bit_length() - 1) * 0.30102999566398120) + 1
            digits += abs(value) >= 10**digits
            return f"an integer of {digits} digits"
        text = repr(value)
    elif isinstance(value, (str, bytes)):
        text = repr(value[: limit + 1])
    elif isinstance(value, (list, tuple, set, frozenset)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    elif isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_@+-]{1,60}")


def field_path(loc: tuple[object, ...] | list[object], root: str = "") -> str:
    """A validation error's location as ``root.field[3].name``, safe to print in one line.

    Keys come from the user's file: one that is not a short plain name (a newline, 5,000 characters, an
    integer key) is shown bounded and quoted (``['a\\nb']``), so the message stays one short line.
    """
    text = root
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        elif isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{brief(part)}]"
    return text or "(top level)"


def validation_line(err: Mapping[str, Any], source: str, root: str, allowed: Iterable[str]) -> str:
    """One line for the first problem of a pydantic ``ValidationError`` (``exc.errors()[0]``) in a file:
    ``source: root.field: ...``; an unknown field lists the ``allowed`` ones, a missing one says so, any
    other names the value and pydantic's rule.

    It takes the error's dict, not the exception, so that this module needs no pydantic; the file readers of
    every layer share it, each naming its own root (``model``, ``execution``) and allowed fields.
    """
    where = field_path(err["loc"], root)
    if err["type"] == "extra_forbidden":
        return f"{source}: {where}: unknown field; allowed: {_allowed_fields(err['loc'], list(allowed))}"
    if err["type"] == "missing":
        return f"{source}: {where}: missing; required"
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{source}: {where}: got {brief(err.get('input'))}; {message[:1].lower()}{message[1:]}"


_ALLOWED_CHARS = 400
"""Longest list of allowed field names an unknown-field line spells out in full (longer lists name the closest)."""


def _allowed_fields(loc: Any, names: list[str]) -> str:
    """The allowed fields for an unknown-field line: all of them when they fit in :data:`_ALLOWED_CHARS`, else
    their count, the ones closest to the unknown name and the first few, so that the line stays short."""
    text = ", ".join(names)
    if len(text) <= _ALLOWED_CHARS:
        return text
    bad = str(loc[-1]) if loc else ""
    close = difflib.get_close_matches(bad, names, n=4, cutoff=0.6)
    return (f"{len(names)} fields" + (f"; closest: {', '.join(close)}" if close else "")
            + f"; first: {', '.join(names[:8])}, ...")
