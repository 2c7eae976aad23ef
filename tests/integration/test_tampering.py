"""Tamper evidence (docs/design.md sections 7 and 9): each way of rewriting history in SQL is
caught — by restore (the run is parked `integrity`, with an audit row, and the step never
runs) when it touches the head or its parent link, and by `onward verify` (offline, every
checkpoint) wherever it is. Key rotation keeps old checkpoints verifiable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, OnwardSettings
from ledger.checkpoints import CheckpointKeys
from tasks.executor import ReportKind
from tests.integration.test_integrity import Harness, calls, harness  # noqa: F401 - fixture
from tests.support import reads
from tests.support.driver import driver
from tests.workflows_ops import calls as ops_calls

STEPS_BEFORE = 3  # checkpoints 0..3 exist, the run waits at seq 3


def _history(ledger: Ledger, harness: Harness) -> UUID:  # noqa: F811 - fixture name
    run_id = ledger.start_run("integrity_probe", {"n": -5})
    for seq in range(STEPS_BEFORE):
        assert harness.deliver(run_id, seq).kind is ReportKind.COMMITTED
    assert ledger.verify_run(run_id) == []
    return run_id


def _sql(ledger: Ledger, sql: str, **params: object) -> None:
    assert reads.execute(ledger.engine, sql, **params) >= 1


def delete_parent(ledger: Ledger, run_id: UUID, _: UUID) -> None:
    _sql(ledger, "DELETE FROM onward.checkpoints WHERE run_id = :r AND seq = 2", r=run_id)


def reorder(ledger: Ledger, run_id: UUID, _: UUID) -> None:
    """Swap checkpoints 1 and 2."""
    for source, target in ((1, -1), (2, 1), (-1, 2)):
        _sql(ledger, "UPDATE onward.checkpoints SET seq = :t WHERE run_id = :r AND seq = :s",
             r=run_id, s=source, t=target)


def forge_next(ledger: Ledger, run_id: UUID, _: UUID) -> None:
    """Insert a checkpoint 4 with a made-up MAC and move the run onto it."""
    _sql(ledger, """INSERT INTO onward.checkpoints (run_id, seq, parent_hash, hash, key_id,
                        envelope_version, step, next_step, outcome, state, workflow_version,
                        lease_epoch)
                    SELECT run_id, 4, hash, repeat('f', 64), key_id, envelope_version, step,
                           next_step, outcome, jsonb_build_object('n', 99), workflow_version, 0
                      FROM onward.checkpoints WHERE run_id = :r AND seq = 3""", r=run_id)
    _sql(ledger, "UPDATE onward.runs SET seq = 4, head_hash = repeat('f', 64) WHERE id = :r",
         r=run_id)


def copy_from_other_run(ledger: Ledger, run_id: UUID, other: UUID) -> None:
    """Replace the head with the other run's (validly MAC'd) checkpoint 3."""
    _sql(ledger, """UPDATE onward.checkpoints t SET state = o.state, hash = o.hash,
                           parent_hash = o.parent_hash, state_delta = o.state_delta,
                           snapshot_seq = o.snapshot_seq, chain_bytes = o.chain_bytes
                      FROM onward.checkpoints o
                     WHERE t.run_id = :r AND t.seq = 3 AND o.run_id = :o AND o.seq = 3""",
         r=run_id, o=other)
    _sql(ledger, """UPDATE onward.runs SET head_hash = (SELECT hash FROM onward.checkpoints
                     WHERE run_id = :r AND seq = 3) WHERE id = :r""", r=run_id)


def truncate_tail(ledger: Ledger, run_id: UUID, _: UUID) -> None:
    """Drop the last checkpoint and move the run back one seq (its head hash stays)."""
    _sql(ledger, "DELETE FROM onward.checkpoints WHERE run_id = :r AND seq = 3", r=run_id)
    _sql(ledger, "UPDATE onward.runs SET seq = 2 WHERE id = :r", r=run_id)


CASES: dict[str, tuple[Callable[[Ledger, UUID, UUID], None], int, str, str]] = {
    # name: (tamper, seq to deliver next, restore message, verify problem kind)
    "delete_parent": (delete_parent, 3, "parent of checkpoint 3", "gap"),
    "reorder": (reorder, 3, "does not match the chain", "mac"),
    "forge": (forge_next, 4, "does not match its MAC", "mac"),
    "copy_from_other_run": (copy_from_other_run, 3, "does not match its MAC", "mac"),
    "truncate_tail": (truncate_tail, 2, "recorded head", "head"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampering__detected_by_restore_and_verify(case: str, ledger: Ledger,
                                                   harness: Harness) -> None:  # noqa: F811
    """Invariant: after the history edit, the next delivery parks the run (reason
    integrity, one audit row), the step body does not run, and `verify` names the problem."""
    tamper, next_seq, message, kind = CASES[case]
    run_id = _history(ledger, harness)
    other = _history(ledger, harness)
    calls.clear()
    tamper(ledger, run_id, other)

    assert harness.deliver(run_id, next_seq).kind is ReportKind.PARKED
    assert calls == []
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert message in row["last_error"]["message"]
    audit = reads.audit_rows(ledger.engine, run_id)
    assert [(a["action"], a["reason"]) for a in audit] == [("park", "integrity")]
    problems = ledger.verify_run(run_id)
    assert kind in {p.kind for p in problems}, problems
    assert ledger.verify_run(other) == []


def test_tampering__middle_deletion_found_offline(ledger: Ledger,
                                                  harness: Harness) -> None:  # noqa: F811
    """Invariant: restore costs O(1) per step, so a deletion deep in history is found by the
    offline verifier, which reports the exact gap."""
    run_id = _history(ledger, harness)
    _sql(ledger, "DELETE FROM onward.checkpoints WHERE run_id = :r AND seq = 1", r=run_id)
    problems = ledger.verify_run(run_id)
    assert [(p.seq, p.kind) for p in problems] == [(2, "gap")]
    assert "checkpoints 1..1 are missing" in problems[0].detail


def test_key_rotation__old_checkpoints_verify_under_old_key_id(
        ledger: Ledger, settings: OnwardSettings) -> None:
    """Invariant: after rotating to key k2 with k1 kept as an old key, a run begun under k1
    continues (its head verifies under k1, new checkpoints are written under k2) and its
    whole history verifies; without the old key it is refused, never run."""
    first = Harness(ledger, settings)
    run_id = ledger.start_run("integrity_probe", {"n": -5})
    stranded = ledger.start_run("integrity_probe", {"n": -5})
    assert first.deliver(run_id, 0).kind is ReportKind.COMMITTED
    assert first.deliver(stranded, 0).kind is ReportKind.COMMITTED
    first.store.close()

    rotated_settings = settings.model_copy(update={
        "checkpoint_key": "second-key", "checkpoint_key_id": "k2",
        "checkpoint_old_keys": f"{settings.checkpoint_key_id}={settings.checkpoint_key}"})
    rotated = Ledger(ledger.engine, rotated_settings)
    second = Harness(rotated, rotated_settings)
    try:
        assert second.deliver(run_id, 1).kind is ReportKind.COMMITTED
        with ledger.engine.connect() as conn:
            key_ids = [r[0] for r in conn.exec_driver_sql(
                "SELECT key_id FROM onward.checkpoints WHERE run_id = %(r)s ORDER BY seq",
                {"r": run_id})]
        assert key_ids == ["k1", "k1", "k2"]
        assert rotated.verify_run(run_id) == []
    finally:
        second.store.close()

    forgotten = settings.model_copy(update={"checkpoint_key": "second-key",
                                            "checkpoint_key_id": "k2"})
    assert CheckpointKeys.from_settings(forgotten).keys.keys() == {"k2"}
    third = Harness(Ledger(ledger.engine, forgotten), forgotten)
    try:
        assert third.deliver(stranded, 1).kind is ReportKind.PARKED  # its head is under k1
    finally:
        third.store.close()
    row = reads.run_row(ledger.engine, stranded)
    assert row["parked_reason"] == "integrity"
    assert "key id 'k1' is not configured" in row["last_error"]["message"]


# -- what runs is what was signed (the runs row against the MAC'd head) ------------------
RUN_ROW_EDITS = {
    # name: (SQL on the runs row at seq 1, what the message names)
    "step_skips_the_approval": ("UPDATE onward.runs SET step = 'post' WHERE id = :r",
                                "step 'post'"),
    "workflow": ("UPDATE onward.runs SET workflow = 'test_ops_fragile' WHERE id = :r",
                 "workflow 'test_ops_fragile'"),
    "workflow_version": ("UPDATE onward.runs SET workflow_version = 2 WHERE id = :r",
                         "workflow version 2"),
    "state_schema_version": ("UPDATE onward.runs SET state_schema_version = 7 WHERE id = :r",
                             "state schema version 7"),
}


@pytest.mark.parametrize("case", sorted(RUN_ROW_EDITS))
def test_run_row_edit__the_claim_runs_only_what_the_head_signed(
        ledger: Ledger, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: the step, workflow, workflow version and state schema version a claim runs
    are the ones the head checkpoint's MAC covers. Editing them on the runs row (here: to
    skip the approval step and publish at once) parks the run `integrity` before anything
    runs: no tool call, no new checkpoint; `verify` reports the edit."""
    sql, named = RUN_ROW_EDITS[case]
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(tmp_path / "tool.log"))
    with driver(ledger, ["tests.workflows_ops"]) as drv:
        run_id = ledger.start_run("test_ops_notes", {"approve": True})
        assert drv.step(run_id, 0).kind is ReportKind.COMMITTED  # summarize; next: review
        assert reads.execute(ledger.engine, sql, r=run_id) == 1
        report = drv.step(run_id, 1)
    assert report.kind is ReportKind.PARKED, report
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"], row["seq"]) == ("needs_review", "integrity", 1)
    assert row["last_error"]["type"] == "IntegrityViolation"
    assert named in row["last_error"]["message"]
    assert ops_calls(tmp_path / "tool.log") == []
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
    assert [(p.seq, p.kind) for p in ledger.verify_run(run_id)] == [(1, "run")]


def test_finished_run_set_running_again__never_runs_a_step(ledger: Ledger,
                                                            harness: Harness) -> None:  # noqa: F811
    """Invariant: a run whose head checkpoint ends it (finish) never runs another step, even
    if its row is set back to running with a message queued: the claim parks it."""
    run_id = ledger.start_run("integrity_probe", {"n": 3})
    assert harness.deliver(run_id, 0).kind is ReportKind.COMMITTED
    assert reads.run_row(ledger.engine, run_id)["status"] == "completed"
    calls.clear()
    assert reads.execute(ledger.engine, "UPDATE onward.runs SET status = 'running', "
                         "finished_at = NULL WHERE id = :r", r=run_id) == 1
    assert harness.deliver(run_id, 1).kind is ReportKind.PARKED
    assert calls == []
    row = reads.run_row(ledger.engine, run_id)
    assert row["parked_reason"] == "integrity"
    assert "ended the run" in row["last_error"]["message"]


def test_run_row_edit__continuation_must_match_the_decision(ledger: Ledger) -> None:
    """Invariant: after an approval wait the run's step is the continuation the MAC'd
    control names for the decision taken: an approved run routed to the rejection step in
    SQL is parked `integrity`, the rejection step does not run."""
    with driver(ledger, ["tests.workflows_waits"]) as drv:
        run_id = ledger.start_run("test_review", {})
        assert drv.step(run_id, 0).kind is ReportKind.COMMITTED
        [asked] = ledger.approvals(run_id=run_id)
        ledger.acting_as("alice", "approver").approve(asked.id, artifact_hash=asked.artifact_hash)
        assert reads.execute(ledger.engine, "UPDATE onward.runs SET step = 'rejected' "
                             "WHERE id = :r", r=run_id) == 1
        assert drv.step(run_id, 1).kind is ReportKind.PARKED
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert "which is approved" in row["last_error"]["message"]
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]


# -- the head is authenticated -------------------------------------------------------------
ROLL_BACK_TO_2 = """
    DELETE FROM onward.checkpoints WHERE run_id = :r AND seq > 2;
    DELETE FROM onward.outbox WHERE run_id = :r;
    UPDATE onward.runs r SET seq = 2, head_hash = c.hash, status = 'running'
      FROM onward.checkpoints c WHERE r.id = :r AND c.run_id = r.id AND c.seq = 2;
"""


def test_head__rolled_back_to_an_earlier_checkpoint_is_refused_and_reported(
        ledger: Ledger, harness: Harness) -> None:  # noqa: F811
    """Invariant: the run's head (seq and head hash) is authenticated by a keyed MAC on its
    row. Deleting the last checkpoints and pointing the run at an earlier one, with values
    copied from that checkpoint (no key needed), is refused by the claim (parked
    `integrity`, the committed step does not run again) and reported by `verify` (the head
    MAC, and the attempts and evidence beyond the head)."""
    run_id = _history(ledger, harness)  # committed 0..2, the run waits at seq 3
    calls.clear()
    with ledger.engine.begin() as conn:
        for statement in filter(str.strip, ROLL_BACK_TO_2.split(";")):
            conn.execute(sa.text(statement), {"r": run_id})

    assert harness.deliver(run_id, 2).kind is ReportKind.PARKED
    assert calls == []  # step 2 committed once and is not executed again
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert "head" in row["last_error"]["message"]
    assert "MAC" in row["last_error"]["message"]
    kinds = {p.kind for p in ledger.verify_run(run_id)}
    assert {"head", "beyond_head"} <= kinds, ledger.verify_run(run_id)


def test_head__a_run_without_a_head_mac_is_refused(ledger: Ledger,
                                                    harness: Harness) -> None:  # noqa: F811
    """Invariant: the head MAC cannot be removed to make the head pass as unsigned."""
    run_id = ledger.start_run("integrity_probe", {"n": 0})
    assert reads.execute(ledger.engine, "UPDATE onward.runs SET head_mac = NULL WHERE id = :r",
                         r=run_id) == 1
    assert harness.deliver(run_id, 0).kind is ReportKind.PARKED
    assert calls == []
    assert "head" in {p.kind for p in ledger.verify_run(run_id)}


# -- an approval decision counts only as it was signed where it was taken --------------------
FORGE_APPROVAL = """
    UPDATE onward.approvals SET status = 'approved', decided_by = 'alice', decided_at = now()
     WHERE run_id = :r;
    UPDATE onward.runs SET status = 'running', waiting_on = NULL WHERE id = :r;
    INSERT INTO onward.outbox (run_id, seq) VALUES (:r, 1);
"""


def test_approval__decision_forged_in_sql_does_not_release_the_step(ledger: Ledger) -> None:
    """Invariant: an approval marked 'approved' in the database (no person decided through
    onward, so no decision MAC) does not release the approved step: the claim parks the run
    `integrity` and `act` never runs; `verify` reports the unsigned decision. A decision
    taken through onward still releases it."""
    with driver(ledger, ["tests.workflows_waits"]) as drv:
        forged = ledger.start_run("test_review", {})
        honest = ledger.start_run("test_review", {})
        for run_id in (forged, honest):
            assert drv.step(run_id, 0).kind is ReportKind.COMMITTED
        with ledger.engine.begin() as conn:
            for statement in filter(str.strip, FORGE_APPROVAL.split(";")):
                conn.execute(sa.text(statement), {"r": forged})
        [asked] = ledger.approvals(run_id=honest)
        ledger.acting_as("alice", "approver").approve(asked.id, artifact_hash=asked.artifact_hash)

        assert drv.step(forged, 1).kind is ReportKind.PARKED
        assert drv.step(honest, 1).kind is ReportKind.COMMITTED

    row = reads.run_row(ledger.engine, forged)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert "decision on approval" in row["last_error"]["message"]
    assert reads.checkpoint_seqs(ledger.engine, forged) == [0, 1]
    assert [p.kind for p in ledger.verify_run(forged)] == ["approval"]
    assert reads.run_row(ledger.engine, honest)["status"] == "completed"
    assert ledger.verify_run(honest) == []
