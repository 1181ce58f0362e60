"""Read user-given JSON/YAML files without hanging or crashing on hostile input.

Every file mcdla reads from a user (workloads, systems, plans) goes through :func:`read_document`, which

* reads regular files only (a directory, ``/dev/zero``, a FIFO or a socket is refused before it is opened),
  and at most :data:`MAX_FILE_BYTES`;
* requires UTF-8 text;
* parses JSON without ``NaN``/``Infinity`` (they are not JSON) and YAML without letting anchors and aliases
  expand past :data:`MAX_NODES` nodes (a "billion laughs" file of a few hundred bytes would otherwise hang);
* refuses nesting deeper than :data:`MAX_DEPTH` (no ``RecursionError``).

Each problem is raised as the caller's error class with one line naming the file and what is allowed.

Every file mcdla writes for a user as the result of a long computation (``search --out``, ``export-chakra``)
goes through :func:`atomic_output`: it is written under a temporary name in the same directory and renamed
over the target only when complete, so a full disk or an interrupt leaves no partial result behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml

from mcdla.errors import McdlaError

__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_NODES", "atomic_output", "read_text", "parse_json", "parse_yaml",
           "read_document"]

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # type: ignore[assignment]


def read_text(path: str | Path, *, what: str, error: type[McdlaError]) -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` ("workload file") names it in errors."""
    p = Path(path)
    shown = repr(str(p)[:200])
    try:
        info = p.stat()
    except FileNotFoundError:
        raise error(f"{what}: got {shown}; no such file") from None
    except OSError as exc:
        raise error(f"{what}: got {shown}; cannot be read ({exc.strerror or type(exc).__name__})") from None
    except ValueError:  # e.g. an embedded NUL byte in the path
        raise error(f"{what}: got {shown}; not a valid path") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{what}: got {shown}; it is a directory, must be a regular file")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what}: got {shown}; it is a device, FIFO or socket, must be a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise error(f"{what}: got {shown}; it has {info.st_size} bytes, must be at most {MAX_FILE_BYTES // 2**20} MiB")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise error(f"{what}: got {shown}; cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise error(f"{what}: got {shown}; it has more than {MAX_FILE_BYTES // 2**20} MiB, must be at most that")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {shown}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "must be a UTF-8 JSON or YAML file"
        ) from None
    return text.removeprefix("\ufeff")


def _problem(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:
        return "a number has more than 4300 digits"
    return text[:160]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (JSON has no NaN or Infinity; write a number or a string)")


def _check_depth(data: Any, source: str, error: type[McdlaError]) -> None:
    """Refuse containers nested deeper than MAX_DEPTH (walked iteratively; JSON has no sharing)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise error(f"{source}: nested more than {MAX_DEPTH} levels deep; must be at most {MAX_DEPTH}")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))


def parse_json(text: str, *, source: str, error: type[McdlaError]) -> Any:
    """Parse JSON text strictly (no NaN/Infinity, bounded depth); ``source`` prefixes error messages."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply; must be at most {MAX_DEPTH} levels") from None
    except ValueError as exc:  # NaN/Infinity, or an integer with more digits than Python converts
        raise error(f"{source}: not valid JSON ({_problem(exc)})") from None
    _check_depth(data, source, error)
    return data


def _yaml_shape_check(text: str, source: str, error: type[McdlaError]) -> None:
    """Walk the YAML events (no recursion) and refuse deep nesting or aliases expanding past MAX_NODES.

    Each node's expanded size is computed once (anchors remember theirs), so a file whose aliases would
    expand to billions of nodes is rejected after reading its few hundred events.
    """
    anchors: dict[str, int] = {}
    stack: list[list[Any]] = []  # [expanded size so far, anchor]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        size = None
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) > MAX_DEPTH:
                raise error(f"{source}: nested more than {MAX_DEPTH} levels deep; must be at most {MAX_DEPTH}")
            continue
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchors.get(event.anchor, 1), None
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        if stack:
            stack[-1][0] += size
        else:
            total += size
        if total + sum(s for s, _ in stack) > MAX_NODES:
            raise error(
                f"{source}: anchors and aliases expand to more than {MAX_NODES} nodes; "
                f"must expand to at most {MAX_NODES}"
            )


def parse_yaml(text: str, *, source: str, error: type[McdlaError]) -> Any:
    """Parse YAML text safely (bounded alias expansion and depth); ``source`` prefixes error messages."""
    try:
        _yaml_shape_check(text, source, error)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except McdlaError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise error(f"{source}: not valid YAML ({' '.join(str(problem).split())[:160]}{where})") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply; must be at most {MAX_DEPTH} levels") from None
    except (ValueError, OverflowError, TypeError) as exc:  # a scalar the constructor cannot build
        raise error(f"{source}: not valid YAML ({_problem(exc)})") from None


def read_document(path: str | Path, *, what: str, error: type[McdlaError], json_format: bool | None = None) -> Any:
    """Read and parse a JSON or YAML file (JSON when ``json_format`` or, if None, when the suffix is .json)."""
    p = Path(path)
    text = read_text(p, what=what, error=error)
    source = f"{what} {str(p)[:200]!r}"
    is_json = p.suffix.lower() == ".json" if json_format is None else json_format
    if is_json:
        return parse_json(text, source=source, error=error)
    return parse_yaml(text, source=source, error=error)


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file object (``mode`` ``"w"`` or ``"wb"``) whose content replaces ``path`` only if the block completes.

    The data goes to a temporary file next to ``path`` (same filesystem, so the final :func:`os.replace` is
    atomic), flushed and fsynced before the rename; on any exception (ENOSPC, an interrupt) the temporary file
    is removed and ``path`` is left as it was. OS errors propagate to the caller, which names its option.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".partial", dir=target.parent or ".")
    try:
        os.fchmod(fd, stat.S_IMODE(target.stat().st_mode) if target.is_file() else 0o644)  # not mkstemp's 0600
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
