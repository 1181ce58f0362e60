"""Plan.state: per module, where weights, gradients and optimizer state live (NOTE [four classes])."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mcdla.errors import PlanError
from mcdla.workload.plan import Placement, Plan, StateDecision

LAYERS = ["embed", "blocks.0", "blocks.1", "head"]


def _plan(*state: StateDecision) -> Plan:
    base = Plan.from_actions(workload="toy", batch=2, layer_names=LAYERS, actions={"blocks.0": "offload"})
    return dataclasses.replace(base, state=state)


def test_unmentioned_modules_keep_everything_on_the_device() -> None:
    """A module without a state entry has weights, gradients and optimizer state on the device."""
    plan = _plan(StateDecision(layer="blocks.1", weights="offload"))
    assert plan.state_of("head") == StateDecision(layer="head")
    got = plan.state_of("blocks.1")
    assert (got.weights, got.gradients, got.optimizer_state) == (Placement.OFFLOAD, Placement.DEVICE, Placement.DEVICE)


def test_json_round_trip_and_old_files(tmp_path) -> None:
    """A plan with state saves and loads equal; one without writes no 'state' field (files stay as they were)."""
    plan = _plan(StateDecision(layer="blocks.1", weights="offload", optimizer_state="offload", tier="host"))
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == plan
    assert json.loads((tmp_path / "p.json").read_text())["state"][0]["tier"] == "host"
    assert "state" not in _plan().to_dict()


def test_bad_state_entries_are_one_line_plan_errors(tmp_path) -> None:
    """A bad placement, an unknown layer and a duplicate each raise PlanError naming the field and value."""
    with pytest.raises(PlanError, match=r"plan state for 'head'.weights: got 'disk'; must be one of device, offload"):
        StateDecision(layer="head", weights="disk")
    with pytest.raises(PlanError, match=r"plan.state: layer 'tail' is not a layer of 'toy'"):
        _plan(StateDecision(layer="tail"))
    with pytest.raises(PlanError, match=r"plan.state: layer 'head' appears twice"):
        _plan(StateDecision(layer="head"), StateDecision(layer="head"))
    doc = _plan(StateDecision(layer="head", weights="offload")).to_dict()
    doc["state"][0]["gradients"] = "cpu"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"plan.state\[0\].gradients: got 'cpu'; must be one of device, offload"):
        Plan.load(tmp_path / "bad.json")


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_bad_prefetch_depth_is_a_one_line_plan_error(tmp_path, bad) -> None:
    """A state entry's prefetch must be an integer >= 0: in a file and in code, PlanError names the field."""
    doc = _plan(StateDecision(layer="head", weights="offload")).to_dict()
    doc["state"][0]["prefetch"] = bad
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"^plan.state\[0\].prefetch: got .*; must be an integer from 0 to"):
        Plan.load(tmp_path / "bad.json")
    with pytest.raises(PlanError, match=r"^plan state for 'head'.prefetch: got .*; must be an integer >= 0"):
        StateDecision(layer="head", weights="offload", prefetch=bad)


def test_prefetch_depth_defaults_to_one_in_files_without_it() -> None:
    """An entry without prefetch loads with depth 1, the runtime's default."""
    doc = _plan(StateDecision(layer="head", weights="offload", prefetch=3)).to_dict()
    assert doc["state"][0]["prefetch"] == 3
    del doc["state"][0]["prefetch"]
    assert Plan.from_dict(doc).state[0].prefetch == 1
