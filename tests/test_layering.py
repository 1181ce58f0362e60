"""The package's layers import only downward (style rule 1): a parsed-import check, no runtime imports."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mcdla"
# Lower rank = lower layer. A module may import from its own layer or any lower one.
RANK = {
    "errors": 0, "units": 0, "_io_safety": 0, "__main__": 8,
    "workload": 1, "hardware": 1,
    "sim": 2,
    "plan": 3,
    "runtime": 4,
    "profile": 5,
    "report": 6,
    "cli": 7,

}


def _layer(module_path: Path) -> str:
    rel = module_path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py") if rel.parts[0] != "__init__.py" else "__init__"


def _imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "mcdla" and len(parts) > 1:
                found.add(parts[1])
    return found


MODULES = sorted(p for p in SRC.rglob("*.py") if _layer(p) in RANK)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_downward(path: Path) -> None:
    """No module imports from a layer above its own."""
    own = _layer(path)
    upward = {l for l in _imported_layers(path) if l in RANK and RANK[l] > RANK[own]}
    assert not upward, f"{path.relative_to(SRC)} ({own}) imports higher layers {sorted(upward)}"


def test_every_package_has_a_rank() -> None:
    """Every top-level module or package of mcdla is placed in the layer table."""
    tops = {p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    tops -= {"__init__", "__main__", "py"}
    assert tops <= set(RANK), f"unranked: {sorted(tops - set(RANK))}"


def _sim_submodules_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {name for name in names if name.startswith("mcdla.sim.")}
    return found


@pytest.mark.parametrize("path", sorted((SRC / "plan").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_plan_uses_only_the_public_sim_package(path: Path) -> None:
    """The planners reach the engine through ``mcdla.sim``'s public names, never its modules."""
    found = sorted(_sim_submodules_imported(path))
    assert not found, f"{path.relative_to(SRC)} imports {found}"



def _private_imports_across_packages(source: str, own: str) -> list[str]:
    """``from mcdla.<pkg>... import _name`` in ``source`` where ``<pkg>`` is not ``own``, the importer's package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "mcdla" and len(parts) > 1 and parts[1] != own:
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_name_crosses_a_package(path: Path) -> None:
    """A module imports another package's public names only (style rule 1): ``_x`` stays inside its package."""
    found = _private_imports_across_packages(path.read_text(), _layer(path))
    assert not found, f"{path.relative_to(SRC)} imports private names {found}"


def test_the_private_name_check_sees_a_crossing() -> None:
    """The check flags a private name imported from another package, not one from its own or a public one."""
    source = ("from mcdla.hardware.io import _one_line, load_system\n"
              "from mcdla.sim.llm import _stage_params\nfrom mcdla.sim import llm_step\n")
    assert _private_imports_across_packages(source, "sim") == ["mcdla.hardware.io._one_line"]
    assert _private_imports_across_packages(source, "plan") == ["mcdla.hardware.io._one_line",
                                                                "mcdla.sim.llm._stage_params"]
