"""How a run was launched is signed (issue 11, review F10): its mode (an ordinary run, an
evidence, simulation or live replay, a branch), the run and checkpoint it was copied from
and whether it may send irreversible effects decide what it may do to the outside world.
An edit of runs.mode or runs.allow_irreversible in the database parks the run at its next
claim (integrity, nothing called) and `verify` reports it. Steps run in the test process
against a real PostgreSQL; the outside world is the local tool's and fake model's logs."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.vocabulary import LaunchMode
from tests.integration.test_operations import (  # noqa: F401 - fixtures
    drv,
    finished_note,
    ledger_ops,
    logs,
    ops,
    outside,
)
from tests.support import reads
from tests.support.driver import Driver

EDITS = {
    # a simulation replay made live, allowed to publish for real
    "simulation_to_live": (LaunchMode.SIMULATION,
                           "SET mode = 'live', allow_irreversible = true"),
    # an evidence replay (answers from records, calls nothing) made a live run
    "evidence_to_ordinary": (LaunchMode.EVIDENCE, "SET mode = NULL, parent_run_id = NULL"),
    # a live replay that may not publish, allowed to
    "irreversible_allowed": (LaunchMode.LIVE, "SET allow_irreversible = true"),
}


def launch_problems(ledger: Ledger, run_id: UUID) -> list[str]:
    return [p.detail for p in ledger.verify_run(run_id) if p.kind == "launch"]


@pytest.mark.parametrize("case", sorted(EDITS))
def test_launch_edited_in_the_database_parks_the_run(
        case: str, drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:  # noqa: F811
    """Invariant: after runs.mode / allow_irreversible are edited, the replay's next claim
    parks it (integrity, one audit row), no model or tool is called, and verify names the
    launch. Failed before: the edited replay ran with the edited permissions (a
    simulation published for real; an evidence replay called the model)."""
    mode, edit = EDITS[case]
    parent = finished_note(drv)
    launched = ops.replay(parent, 0, mode, "try it")
    assert launch_problems(ops, launched.run_id) == []
    assert reads.execute(ops.engine, f"UPDATE onward.runs {edit} WHERE id = :r",
                         r=launched.run_id) == 1
    seen = outside(logs)

    run = drv.drive(launched.run_id)

    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert "launched" in reads.run_row(ops.engine, launched.run_id)["last_error"]["message"]
    assert outside(logs) == seen
    assert launch_problems(ops, launched.run_id) != []


def test_an_ordinary_run_and_its_replays_verify(drv: Driver, ops: Ledger) -> None:  # noqa: F811
    """Invariant: runs started and copied by onward carry a launch MAC that verifies."""
    parent = finished_note(drv)
    launched = ops.replay(parent, 0, LaunchMode.EVIDENCE, "try it")
    run = drv.drive(launched.run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert ops.verify_run(parent) == [] and ops.verify_run(launched.run_id) == []


def test_an_edited_ancestor_of_an_evidence_replay_parks_it(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:  # noqa: F811
    """Invariant: an evidence replay of an evidence replay answers from the records of the
    run its lineage was signed with. After the middle replay's parent_run_id is pointed at
    another run, the replay's first recorded call parks it (integrity), nothing is called
    and nothing is answered from the other run. Failed before: only the replay's own launch
    was checked, and it completed on the other run's records."""
    parent, other = finished_note(drv), finished_note(drv)
    middle = ops.replay(parent, 0, LaunchMode.EVIDENCE, "replay")
    launched = ops.replay(middle.run_id, 0, LaunchMode.EVIDENCE, "replay of the replay")
    assert reads.execute(ops.engine, "UPDATE onward.runs SET parent_run_id = :o WHERE id = :r",
                         o=other, r=middle.run_id) == 1
    seen = outside(logs)

    run = drv.drive(launched.run_id)

    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert str(middle.run_id) in reads.run_row(ops.engine, launched.run_id)["last_error"]["message"]
    assert outside(logs) == seen
    assert launch_problems(ops, middle.run_id) != []
