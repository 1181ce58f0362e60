"""Start-up of the command line: lazy imports, ``--version``, shell completion, ``python -m mcdla``."""

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import mcdla

_ROOT = Path(__file__).resolve().parents[2]
_HEAVY = ("matplotlib", "scipy", "torch", "ray", "networkx")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with the worktree's ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_help_imports_no_heavy_module():
    """Building the app with every command registered and rendering --help loads none of the heavy libraries."""
    code = ("import json, sys, contextlib, io\n"
            "from mcdla.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        main(['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            f"print(json.dumps(sorted(m for m in {_HEAVY!r} if m in sys.modules)))\n")
    done = _python("-c", code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_python_dash_m_lists_every_command():
    """``python -m mcdla --help`` exits 0 and names each registered command."""
    from mcdla.cli import _register, app_commands

    _register()
    done = _python("-m", "mcdla", "--help")
    assert done.returncode == 0, done.stderr
    for name in app_commands():
        assert name in done.stdout


def test_version_is_the_pyproject_version(run_cli):
    """``mcdla --version`` prints pyproject.toml's version, the same one the installed metadata and
    ``mcdla.__version__`` report."""
    declared = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]["version"]
    code, out, _ = run_cli("--version")
    assert code == 0
    assert out.strip() == f"mcdla {declared}"
    assert mcdla.__version__ == importlib.metadata.version("mcdla") == declared


def _complete(words: str, cword: int) -> subprocess.CompletedProcess[str]:
    """Ask ``python -m mcdla`` for bash completions the way the installed completion script does."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT / "src"), "COMP_WORDS": words, "COMP_CWORD": str(cword),
           "_MCDLA_COMPLETE": "complete_bash"}
    return subprocess.run([sys.executable, "-m", "mcdla"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def test_shell_completion_completes_commands_and_options():
    """The completion protocol behind --install-completion completes 'sim' to simulate and an option prefix
    of llm-predict to its option; the bash script it installs names the mcdla program."""
    done = _complete("mcdla sim", 1)
    assert done.returncode == 0 and done.stdout.split() == ["simulate"]
    done = _complete("mcdla llm-predict --train", 2)
    assert done.returncode == 0 and done.stdout.split() == ["--train-tokens"]
    env = {**os.environ, "PYTHONPATH": str(_ROOT / "src"), "_MCDLA_COMPLETE": "source_bash"}
    script = subprocess.run([sys.executable, "-m", "mcdla"], capture_output=True, text=True, env=env, timeout=120,
                            check=False).stdout
    assert "_mcdla_completion" in script and "complete " in script


def test_completion_options_are_offered(run_cli):
    """--help lists --install-completion and --show-completion."""
    code, out, _ = run_cli("--help")
    assert code == 0 and "--install-completion" in out and "--show-completion" in out
