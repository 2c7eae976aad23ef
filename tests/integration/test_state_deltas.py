"""Checkpoints store deltas (ledger/states.py, docs/design.md section 9): every reader gets
the state each checkpoint was signed with, rebuilt from its snapshot and the deltas after
it: the inspect view, the API's envelopes, verify, replay and branch, from a snapshot and
from the middle of a chain. Steps run in the test process against a real PostgreSQL."""

from __future__ import annotations

from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.vocabulary import Role
from tests.support import reads
from tests.support.driver import Driver, driver, driver_fixture

MODULES = ["tests.workflows"]
STEPS = 20


@pytest.fixture()
def ops(ledger: Ledger) -> Ledger:
    configured = Ledger(ledger.engine, ledger.settings.model_copy(update={"workflows": MODULES}))
    return configured.acting_as("olga", Role.OPERATOR)


drv = driver_fixture(MODULES, ledger="ops")


def notes_run(drv: Driver, ops: Ledger, steps: int = STEPS) -> UUID:
    run_id = ops.start_run("test_notes_chain", {"steps": steps, "sleep_ms": 0, "notes": []})
    assert drv.drive(run_id, max_steps=steps + 2).status is RunStatus.COMPLETED
    return run_id


def written(notes: list[str]) -> list[str]:
    return [n.split(" .")[0] for n in notes]


def expected(count: int) -> list[str]:
    return [f"note {i} written at seq {i - 1}" for i in range(1, count + 1)]


def test_deltas__a_growing_state_is_stored_as_deltas_between_snapshots(
        drv: Driver, ops: Ledger) -> None:
    """A note appended per step: checkpoint 0 (the input), 1 (its delta would outweigh the
    state) and 17 (16 steps later) are snapshots, every other checkpoint a delta; each
    checkpoint's state, as the inspect view and the API read it, has exactly the notes
    written before it; the history verifies."""
    run_id = notes_run(drv, ops)
    kinds = reads.checkpoint_kinds(ops.engine, run_id)
    assert [seq for seq, kind in kinds.items() if kind == "snapshot"] == [0, 1, 17]
    assert len(kinds) == STEPS + 1
    for seq in range(STEPS + 1):
        view = ops.checkpoint(run_id, seq)
        assert view is not None and written(view.state["notes"] if view.state and seq else []) \
            == expected(min(seq, STEPS - 1))  # the finish keeps the last state: its result
    envelopes = ops.checkpoints(run_id)
    assert [written(e.state.get("notes", [])) for e in envelopes] == [
        expected(min(seq, STEPS - 1)) for seq in range(STEPS + 1)]
    assert ops.verify_run(run_id) == []
    assert [c.path for c in ops.state_diff(run_id, 17, 18)] == ["/notes/17"]


@pytest.mark.parametrize("seq", [17, 18, 9], ids=["snapshot", "after_snapshot", "mid_chain"])
def test_deltas__replay_and_branch_start_from_the_rebuilt_state(
        drv: Driver, ops: Ledger, seq: int) -> None:
    """A replay from checkpoint ``seq`` (a snapshot, the delta after it, a delta in the middle
    of the first chain) starts from the state rebuilt there and, running the same steps,
    ends with the parent's notes; a branch whose patch asks for fewer steps ends with the
    parent's first notes; both children verify."""
    parent = notes_run(drv, ops)
    replay = ops.replay(parent, seq, "live", "again")
    assert drv.drive(replay.run_id, max_steps=STEPS).status is RunStatus.COMPLETED
    child = reads.run_row(ops.engine, replay.run_id)
    assert written(child["result"]["notes"]) == expected(STEPS)
    branch = ops.branch(parent, seq, [{"op": "replace", "path": "/steps", "value": seq + 2}],
                        "shorter")
    assert drv.drive(branch.run_id, max_steps=STEPS).status is RunStatus.COMPLETED
    assert written(reads.run_row(ops.engine, branch.run_id)["result"]["notes"]) == \
        expected(seq + 2)
    for run_id in (parent, replay.run_id, branch.run_id):
        assert ops.verify_run(run_id) == []


def test_deltas__every_state_in_full_when_snapshot_every_is_one(ops: Ledger) -> None:
    """ONWARD_CHECKPOINT_SNAPSHOT_EVERY=1 stores every state in full, as before deltas."""
    with driver(ops, MODULES, snapshot_every=1) as running:
        run_id = notes_run(running, ops, steps=5)
    assert set(reads.checkpoint_kinds(ops.engine, run_id).values()) == {"snapshot"}
    assert ops.verify_run(run_id) == []


def test_deltas__verify_names_an_edited_delta(drv: Driver, ops: Ledger) -> None:
    """Invariant: a delta edited in SQL into another patch that applies rebuilds a state
    its MAC does not sign: verify reports the checkpoint (mac); the rows after it in the
    chain rebuild from the edited state and are reported too, and nothing else is."""
    run_id = notes_run(drv, ops)
    assert reads.execute(ops.engine, "UPDATE onward.checkpoints SET state_delta = state_delta "
                         "|| '[{\"op\": \"replace\", \"path\": \"/steps\", \"value\": 3}]' "
                         "WHERE run_id = :run AND seq = 5", run=run_id) == 1
    problems = [(p.seq, p.kind) for p in ops.verify_run(run_id)]
    assert problems[0] == (5, "mac")
    assert {kind for _, kind in problems} == {"mac"}
    assert {seq for seq, _ in problems} == set(range(5, 17))  # up to the next snapshot


@pytest.mark.parametrize("workflow", ["test_in_place", "test_in_place_any"],
                         ids=["fresh_model_uncopied", "any_field_copied"])
def test_deltas__a_step_changing_its_state_in_place_leaves_the_parent_state_alone(
        drv: Driver, ops: Ledger, workflow: str) -> None:
    """Invariant: the state a step gets shares no container with the claim's state, from
    which the next checkpoint's delta is made: a step appending in place to its state's
    lists (one typed ``list[int]``, which restore hands over as validated, uncopied; one in
    a field typed ``Any``, which it copies: tasks/fresh_state.py) commits each append. A
    shared list would have changed the parent's state too: the delta would miss the append
    and each checkpoint would store the notes of the one before it."""
    run_id = ops.start_run(workflow, {"steps": 6})
    assert drv.drive(run_id, max_steps=8).status is RunStatus.COMPLETED
    for seq in range(1, 7):
        view = ops.checkpoint(run_id, seq)
        assert view is not None and view.state is not None
        assert view.state["box"] == {"seqs": list(range(seq))}
    assert ops.verify_run(run_id) == []


@pytest.mark.parametrize("seq", [5, 9], ids=["an_ancestor", "the_head"])
def test_deltas__a_worker_does_not_restore_an_edited_delta(
        drv: Driver, ops: Ledger, seq: int) -> None:
    """Invariant: a running run whose head is rebuilt from deltas is not resumed from a
    state edited in SQL, whether the edited delta is the head's own or an ancestor's in its
    chain (its MAC signs the state rebuilt, not the delta): the claim parks the run
    `integrity` before the step runs, and no checkpoint is added."""
    run_id = ops.start_run("test_notes_chain", {"steps": STEPS, "sleep_ms": 0, "notes": []})
    for at in range(9):
        drv.step(run_id, at)
    assert reads.checkpoint_kinds(ops.engine, run_id)[seq] == "delta"
    assert reads.execute(ops.engine, "UPDATE onward.checkpoints SET state_delta = state_delta "
                         "|| '[{\"op\": \"replace\", \"path\": \"/steps\", \"value\": 3}]' "
                         "WHERE run_id = :run AND seq = :seq", run=run_id, seq=seq) == 1

    run = drv.drive(run_id)

    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert reads.checkpoint_seqs(ops.engine, run_id)[-1] == 9
