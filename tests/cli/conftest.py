"""Shared helper for the CLI tests: run ``mcdla`` in-process and capture its exit code and output."""

import pytest

from mcdla.cli import main


@pytest.fixture
def run_cli(capsys):
    """``run_cli(*argv) -> (exit code, stdout, stderr)`` of ``mcdla argv...``."""

    def run(*argv):
        with pytest.raises(SystemExit) as info:
            main(list(argv))
        out = capsys.readouterr()
        return info.value.code, out.out, out.err

    return run
