"""Packaging: the package-data patterns match the data files that exist, and the license ships."""

import fnmatch
import tomllib
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_PROJECT = tomllib.loads((_ROOT / "pyproject.toml").read_text())
_PATTERNS = _PROJECT["tool"]["setuptools"]["package-data"]["mcdla"]
_PACKAGE = _ROOT / "src" / "mcdla"


def _data_files() -> list[str]:
    """Every file under src/mcdla that is not Python source or bytecode, relative to the package."""
    return sorted(str(p.relative_to(_PACKAGE)) for p in _PACKAGE.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


def test_every_package_data_pattern_matches_a_file():
    """No package-data entry is a pattern that matches nothing."""
    for pattern in _PATTERNS:
        assert list(_PACKAGE.glob(pattern)), pattern


def test_every_data_file_is_packaged():
    """Each non-Python file in the package is matched by some package-data pattern, so the wheel carries it."""
    missing = [f for f in _data_files() if not any(fnmatch.fnmatch(f, pat) for pat in _PATTERNS)]
    assert missing == []


def test_license_file_is_mit_and_declared():
    """LICENSE exists, is the MIT text for the mcdla developers and is the file pyproject declares."""
    assert _PROJECT["project"]["license"] == "MIT"
    assert _PROJECT["project"]["license-files"] == ["LICENSE"]
    text = (_ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "mcdla developers" in text and "Permission is hereby granted" in text
