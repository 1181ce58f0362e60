"""The program IR's validator (mcdla.sim.ir.validate): each bad program is refused with one line naming it."""

from __future__ import annotations

import pytest

from mcdla.errors import SimError
from mcdla.sim.collective_models import Collective
from mcdla.sim.ir import CollectiveOp, Compute, RankProgram, Recv, Send, validate


def _coll(nbytes: float = 1e6, group: tuple[int, ...] = (0, 1)) -> Collective:
    return Collective(kind="all-reduce", nbytes=nbytes, group=group)


def _refused(programs: list[RankProgram], match: str) -> None:
    with pytest.raises(SimError, match=match) as err:
        validate(programs)
    assert "\n" not in str(err.value)


def test_matched_programs_pass() -> None:
    """A send met by its receive and a collective every member runs alike validate and come back by rank."""
    progs = [RankProgram(rank=0, ops=(Send(name="s", nbytes=8.0, peer=1), CollectiveOp(name="c", collective=_coll()))),
             RankProgram(rank=1, ops=(Recv(name="r", nbytes=8.0, peer=0), CollectiveOp(name="c", collective=_coll())))]
    assert sorted(validate(progs)) == [0, 1]


def test_unknown_peer() -> None:
    """A send to a rank with no program."""
    _refused([RankProgram(rank=0, ops=(Send(name="s", nbytes=8.0, peer=5),))], r"rank 0 op 's'.peer: got 5")


def test_unmatched_send() -> None:
    """Two sends from 0 to 1 and one receive."""
    _refused([RankProgram(rank=0, ops=(Send(name="a", nbytes=8.0, peer=1), Send(name="b", nbytes=8.0, peer=1))),
              RankProgram(rank=1, ops=(Recv(name="r", nbytes=8.0, peer=0),))],
             "rank 0 sends 2 times to rank 1, which receives 1 times")


def test_send_and_receive_disagree_on_bytes() -> None:
    """8 bytes sent, 4 received."""
    _refused([RankProgram(rank=0, ops=(Send(name="s", nbytes=8.0, peer=1),)),
              RankProgram(rank=1, ops=(Recv(name="r", nbytes=4.0, peer=0),))],
             "send 0 from rank 0 to rank 1: got 8.0 bytes sent, 4.0 received")


def test_collective_members_disagree_on_bytes() -> None:
    """Rank 1's all-reduce on the same group has other bytes than rank 0's."""
    _refused([RankProgram(rank=0, ops=(CollectiveOp(name="c", collective=_coll(1e6)),)),
              RankProgram(rank=1, ops=(CollectiveOp(name="d", collective=_coll(2e6)),))],
             "collective 'd' of rank 1 on group \\(0, 1\\): got all-reduce of 2000000.0 bytes")


def test_collective_member_missing() -> None:
    """A member that never runs the collective, and a group member with no program."""
    _refused([RankProgram(rank=0, ops=(CollectiveOp(name="c", collective=_coll()),)), RankProgram(rank=1, ops=())],
             r"rank 1 runs 0, rank 0 1")
    _refused([RankProgram(rank=0, ops=(CollectiveOp(name="c", collective=_coll(group=(0, 7))),))],
             "member 7 has no program")


def test_wait_on_unknown_op_and_repeated_name() -> None:
    """Waits must name an earlier op of the same rank; names are unique per rank."""
    _refused([RankProgram(rank=0, ops=(Compute(name="a", seconds=1.0, waits=("b",)), Compute(name="b", seconds=1.0)))],
             "rank 0 op 'a'.waits: got 'b'; must name an earlier op")
    _refused([RankProgram(rank=0, ops=(Compute(name="a", seconds=1.0), Compute(name="a", seconds=1.0)))],
             "rank 0 op 'a': name repeated")


def test_folds_must_agree_between_peers() -> None:
    """A fold-2 rank sending to a fold-1 rank is refused (mirrors would not be symmetric)."""
    _refused([RankProgram(rank=0, fold=2, ops=(Send(name="s", nbytes=8.0, peer=1),)),
              RankProgram(rank=1, ops=(Recv(name="r", nbytes=8.0, peer=0),))], "rank 1 has fold 1, rank 0 2")


@pytest.mark.parametrize("make, match", [
    (lambda: Compute(name="c"), "must give exactly one"),
    (lambda: Compute(name="c", seconds=-1.0), "op 'c'.seconds: got -1.0"),
    (lambda: Send(name="s", nbytes=float("nan"), peer=1), "op 's'.nbytes: got nan"),
    (lambda: RankProgram(rank=0, ops=(), fold=0), "rank 0 fold: got 0"),
])
def test_bad_op_fields(make, match: str) -> None:  # type: ignore[no-untyped-def]
    """Each bad op field: one-line SimError naming it."""
    with pytest.raises(SimError, match=match):
        make()
