"""The ``mcdla`` command line: one typer app, one module per command group.

Every user mistake prints ONE line ``mcdla: error: <what>`` on stderr and exits with status 2, never a
traceback or a usage box: a :class:`mcdla.errors.McdlaError` (bad file, bad value, infeasible budget), an
option typer rejects (missing, unknown, not an integer, not a choice), an unreadable input file or an
unwritable output path. A simulation that runs but is infeasible prints its result and exits 1.
"""

from __future__ import annotations

import errno
import importlib
import re
import sys
from collections.abc import Sequence

from typer.exceptions import Abort, Exit, TyperException

from mcdla.cli._app import app, fail
from mcdla.errors import McdlaError, brief

__all__ = ["app", "main"]


_COMMAND_MODULES = ("sim_cmd", "plan_cmd", "validate_cmd", "llm_cmd", "chakra_cmd", "search_cmd", "examples_cmd")
# OS errors that a user's path causes (missing, not allowed, a directory, full disk), not a bug.
_USER_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS,
                errno.ENOSPC, errno.ENAMETOOLONG, errno.EEXIST, errno.ELOOP}


def _register() -> None:
    """Import each command module present; importing one adds its commands to ``app``."""
    for name in _COMMAND_MODULES:
        importlib.import_module(f"mcdla.cli.{name}")


def _given_value(argv: Sequence[str], opts: Sequence[str]) -> str | None:
    """The value last given on the command line to one of ``opts`` (``--batch 3`` or ``--batch=3``)."""
    found = None
    for i, arg in enumerate(argv):
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(opt + "="):
                found = arg[len(opt) + 1:]
    return found


def _usage_message(exc: TyperException, argv: Sequence[str]) -> str:
    """One line for an error typer/click raised while parsing the command line."""
    param = getattr(exc, "param", None)
    ctx = getattr(exc, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    if param is None or not getattr(param, "opts", None):
        text = " ".join(exc.format_message().split())
        if text.startswith("No such command"):
            names = ", ".join(sorted(app_commands()))
            return f"{text.rstrip('.')}; must be one of: {names}"
        return f"{text}{where}"
    opts = sorted(param.opts, key=len, reverse=True)
    name = opts[0]
    if type(exc).__name__ == "MissingParameter":
        return f"{name}: required option is missing{where}"
    message = " ".join(str(exc.message).split()).removeprefix("Value error, ").rstrip(".")
    choice = re.fullmatch(r"'.*' is not one of (.*)", message, flags=re.S)
    if choice:
        message = f"must be one of {choice.group(1)}"
    elif message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ").split(", ")[0]
    value = _given_value(argv, param.opts)
    got = f"got {brief(value)}; " if value is not None else ""
    return f"{name}: {got}{message}"


def app_commands() -> list[str]:
    """The names of the registered commands."""
    return [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands if c.callback]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``mcdla`` console script."""
    _register()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="mcdla", standalone_mode=False)
    except McdlaError as exc:
        fail(str(exc))
    except TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `mcdla`: the help, as before
            print(exc.format_message())
            raise SystemExit(2) from None
        fail(_usage_message(exc, args), code=exc.exit_code if exc.exit_code else 2)
    except Abort:
        fail("aborted", code=1)
    except (KeyboardInterrupt, EOFError):  # pragma: no cover
        sys.exit(130)
    except RecursionError:
        fail("input nested too deeply")
    except OSError as exc:
        if exc.errno not in _USER_ERRNOS:
            raise
        name = brief(str(exc.filename), 200) if exc.filename is not None else "a file"
        fail(f"{name}: {exc.strerror or type(exc).__name__}")
    except Exit as exc:  # pragma: no cover - typer returns the code in non-standalone mode
        code = exc.exit_code
    raise SystemExit(code if isinstance(code, int) else 0)
