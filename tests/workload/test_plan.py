"""Plans are plain data: validated, queried, and round-tripped through JSON."""

import math

import pytest

from mcdla.errors import PlanError
from mcdla.workload.plan import Action, Decision, Plan

NAMES = ("conv1", "relu1", "fc")


def _plan(**over):
    base = dict(workload="net", batch=8, layer_names=NAMES, budget_bytes=1e9,
                actions={"conv1": "offload", "relu1": Action.RECOMPUTE}, prefetch_at={"conv1": "fc"})
    base.update(over)
    return Plan.from_actions(**base)


def test_unmentioned_layers_are_kept() -> None:
    """A layer without a decision is kept."""
    assert _plan().action("fc") is Action.KEEP


def test_offload_defaults_to_pool_tier() -> None:
    """An offload without a tier goes to the default pool."""
    assert _plan().decision("conv1").tier == "pool"


def test_json_round_trip(tmp_path) -> None:
    """save then load gives an equal plan, infinite budget included."""
    for budget in (1e9, math.inf):
        plan = _plan(budget_bytes=budget)
        plan.save(tmp_path / "p.json")
        assert Plan.load(tmp_path / "p.json") == plan


def test_plan_for_another_model_is_refused() -> None:
    """check_matches names the first unknown layer."""
    with pytest.raises(PlanError, match="layer 'conv1'"):
        _plan().check_matches(["encoder.0", "encoder.1"], workload="other")


def test_bad_action_and_misplaced_fields() -> None:
    """Bad actions and tier/prefetch on non-offload decisions are rejected in one line."""
    with pytest.raises(PlanError, match="must be one of keep, offload, recompute"):
        Decision(layer="a", action="swap")
    with pytest.raises(PlanError, match="only offload takes them"):
        Decision(layer="a", action="keep", tier="host")


def test_bad_files(tmp_path) -> None:
    """Missing files, bad JSON and wrong formats give one-line PlanErrors."""
    with pytest.raises(PlanError, match="no such file"):
        Plan.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(tmp_path / "bad.json")
    (tmp_path / "fmt.json").write_text('{"format": "other"}')
    with pytest.raises(PlanError, match="format: got 'other'"):
        Plan.load(tmp_path / "fmt.json")


def test_unknown_prefetch_layer() -> None:
    """prefetch_at must name a layer of the workload."""
    with pytest.raises(PlanError, match="prefetch_at: got 'nope'"):
        _plan(prefetch_at={"conv1": "nope"})
