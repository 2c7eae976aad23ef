"""An effect's attempts decide whether a retried step sends again (docs/guarantees.md,
integrity): an attempt that may have reached the provider makes the next holder reconcile
(lookup) before any resend, and an attempt that saw the effect completed means it was
sent. Each attempt that ended is signed (``effect_attempts.mac``); these tests edit the
attempts and the effect's unsigned status in SQL, without the key, between a step's failed
attempt and its retry, and count what the outside world received. Steps run in the test
process against a real PostgreSQL (tests/support/driver.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from tasks import faults
from tests.integration.test_operations import drv, ledger_ops, logs, ops, outside  # noqa: F401 - fixtures
from tests.support import reads
from tests.support.driver import Driver

_OF_POST = ("FROM onward.effects e WHERE e.run_id = :r AND e.effect_type = 'test.publish' "
            "AND a.effect_type = e.effect_type AND a.effect_id = e.effect_id")

# An effect that completed before its step failed, made to look never sent: its outcome
# (status 'unsent', as a run that ended before sending leaves it) and, in the second case,
# its attempt's outcome too.
UNSENT = ("UPDATE onward.effects SET status = 'unsent', outcome_mac = NULL, result = NULL, "
          "provider_ref = NULL, completed_at = NULL "
          "WHERE run_id = :r AND effect_type = 'test.publish'")
COMPLETED_EDITS = {
    "status_unsent": [UNSENT],
    "status_unsent_attempt_failed": [
        UNSENT, f"UPDATE onward.effect_attempts a SET outcome = 'failed' {_OF_POST}"],
    "status_unsent_lookup_missing_added": [
        UNSENT,
        "UPDATE onward.effects SET attempts = 2 "
        "WHERE run_id = :r AND effect_type = 'test.publish'",
        "INSERT INTO onward.effect_attempts (effect_type, effect_id, attempt, kind, worker, "
        "lease_epoch, idempotency_key, outcome, ended_at, mac) "
        "SELECT e.effect_type, e.effect_id, 2, 'lookup', 'mallory:1', 1, e.effect_id, "
        "'missing', now(), a.mac FROM onward.effects e JOIN onward.effect_attempts a "
        "ON a.effect_type = e.effect_type AND a.effect_id = e.effect_id AND a.attempt = 1 "
        "WHERE e.run_id = :r AND e.effect_type = 'test.publish'"],  # attempt 1's MAC copied
}

# A call that reached the provider and whose answer was never recorded (the step failed
# right after the provider answered): its attempt left open, so the next holder must
# reconcile. Made to look as if the provider had refused it, or as if a lookup had found
# nothing since.
UNKNOWN_EDITS = {
    "attempt_failed": [f"UPDATE onward.effect_attempts a SET outcome = 'failed', "
                       f"ended_at = now() {_OF_POST}"],
    "attempt_deleted_count_kept": [f"DELETE FROM onward.effect_attempts a USING {_OF_POST[5:]}"],
}


@pytest.fixture()
def failing_after(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Arms a fault point of the post step (once), disarmed after the test."""
    def arm(point: str) -> None:
        monkeypatch.setenv("ONWARD_FAULTS", f"{point}@post:raise:once")
        faults.arm_from_env()
    yield arm
    monkeypatch.delenv("ONWARD_FAULTS", raising=False)
    faults.arm_from_env()


def _post_failed_after_sending(drv: Driver, ops: Ledger,  # noqa: F811
                               arm: Callable[[str], None], point: str) -> UUID:
    """A run whose post step called the provider once, then failed at ``point``."""
    arm(point)
    run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
    for seq in range(3):  # summarize, review, post (fails after its call)
        drv.step(run_id, seq)
    run = ops.get_run(run_id)
    assert (run.seq, run.status) == (2, RunStatus.RUNNING)
    return run_id


def _edit(ops: Ledger, run_id: UUID, statements: list[str]) -> None:  # noqa: F811
    for statement in statements:
        assert reads.execute(ops.engine, statement, r=run_id) >= 1, statement


@pytest.mark.parametrize("case", sorted(COMPLETED_EDITS))
def test_effect_attempts__a_completed_effect_made_to_look_unsent_is_not_sent_again(
        drv: Driver, ops: Ledger, logs: dict[str, Path], failing_after: Callable[[str], None],  # noqa: F811
        case: str) -> None:
    """Invariant: an irreversible effect that completed at the provider is sent once, even
    when its step's retry finds it edited in SQL to look never sent (status 'unsent', the
    attempt that saw it complete marked failed, or a forged lookup that found nothing): the
    retry parks the run `integrity` instead of sending again, and `verify` reports it."""
    run_id = _post_failed_after_sending(drv, ops, failing_after, "after_effect_recorded")
    sent = outside(logs)
    _edit(ops, run_id, COMPLETED_EDITS[case])

    run = drv.drive(run_id)

    assert outside(logs) == sent  # not published a second time
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert run.last_error is not None and "test.publish" in run.last_error["message"]
    assert {p.kind for p in ops.verify_run(run_id)} >= {"effect"}


@pytest.mark.parametrize("case", sorted(UNKNOWN_EDITS))
def test_effect_attempts__a_call_of_unknown_outcome_is_not_made_to_look_refused(
        drv: Driver, ops: Ledger, logs: dict[str, Path], failing_after: Callable[[str], None],  # noqa: F811
        case: str) -> None:
    """Invariant: a call that may have reached the provider is reconciled (looked up)
    before anything is sent again; its attempt edited in SQL to say the provider refused
    it, or deleted while the effect still counts it, parks the run `integrity` before the
    retry sends anything, and `verify` reports it."""
    run_id = _post_failed_after_sending(drv, ops, failing_after, "after_provider_response")
    sent = outside(logs)
    _edit(ops, run_id, UNKNOWN_EDITS[case])

    run = drv.drive(run_id)

    assert outside(logs) == sent  # neither looked up past the edit nor sent again
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert {p.kind for p in ops.verify_run(run_id)} >= {"effect"}


def test_effect_attempts__an_unedited_retry_still_reconciles_and_completes(
        drv: Driver, ops: Ledger, logs: dict[str, Path], failing_after: Callable[[str], None],  # noqa: F811
        ) -> None:
    """Invariant (the check costs no false alarm): a retry that finds the open attempt of a
    call whose answer was lost reconciles it as before (the test tool's lookup finds
    nothing, so it sends again under the same key) and the run completes, verifying."""
    run_id = _post_failed_after_sending(drv, ops, failing_after, "after_provider_response")

    run = drv.drive(run_id)

    assert run.status is RunStatus.COMPLETED
    assert ops.verify_run(run_id) == []


REPEAT_EDITS = {
    # the stored payload alone: its signed request hash no longer names it
    "payload": ["UPDATE onward.effects SET payload = jsonb_set(payload, '{channel}', "
                "'\"mallory\"') WHERE run_id = :r AND effect_type = 'test.publish'"],
    # and the request hash made to match it: the intent's MAC no longer verifies
    "payload_and_hash": [
        "UPDATE onward.effects SET payload = jsonb_set(payload, '{channel}', '\"mallory\"') "
        "WHERE run_id = :r AND effect_type = 'test.publish'",
        "UPDATE onward.effects SET request_hash = encode(sha256(convert_to("
        "'{\"channel\":\"mallory\",\"text\":' || (payload->'text')::text || '}', 'UTF8')), "
        "'hex') WHERE run_id = :r AND effect_type = 'test.publish'"],
}


@pytest.mark.parametrize("case", sorted(REPEAT_EDITS))
def test_repeat_effect__an_edited_stored_payload_is_not_sent(
        drv: Driver, ledger_ops: Ledger, logs: dict[str, Path], case: str) -> None:  # noqa: F811
    """Invariant: an admin's repeat sends the payload the step asked for, or nothing: a
    stored payload edited in SQL (a plain one: no encryption keys configured), with or
    without its request hash made to match, is refused before the attempt is recorded, and
    the provider receives nothing."""
    from ledger.exceptions import OperationRefused
    from tasks.operator import plan_repeat, repeat_effect

    admin = ledger_ops.acting_as("ada", "admin")
    run_id = admin.start_run("test_ops_notes", {"topic": "pricing"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    _edit(admin, run_id, REPEAT_EDITS[case])
    effect = next(e for e in admin.effects(run_id) if e.effect_type == "test.publish")
    sent = outside(logs)

    with pytest.raises(OperationRefused, match="edited outside onward"):
        repeat_effect(admin, plan_repeat(admin, effect), "the customer lost the post")

    assert outside(logs) == sent
    assert [a.kind for a in admin.effect_attempts(effect)] == ["call"]


def test_repeat_effect__a_deleted_repeat_is_not_sent_again_under_its_key(
        drv: Driver, ledger_ops: Ledger, logs: dict[str, Path]) -> None:  # noqa: F811
    """Invariant: each repeat is sent under a key of its own (its number counts the repeats
    before it): with an earlier repeat's attempt deleted in SQL (the effect still counting
    it), a new repeat would reuse that repeat's key, and a provider that deduplicates by key
    would answer with the earlier object instead of making the new one. It is refused
    before anything is recorded or sent."""
    from ledger.exceptions import IntegrityViolation
    from tasks.operator import plan_repeat, repeat_effect

    admin = ledger_ops.acting_as("ada", "admin")
    run_id = admin.start_run("test_ops_notes", {"topic": "pricing"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    effect = next(e for e in admin.effects(run_id) if e.effect_type == "test.publish")
    repeat_effect(admin, plan_repeat(admin, effect), "the customer lost the post")
    _edit(admin, run_id, [f"DELETE FROM onward.effect_attempts a USING {_OF_POST[5:]} "
                          "AND a.kind = 'repeat'"])
    effect = next(e for e in admin.effects(run_id) if e.effect_type == "test.publish")
    sent = outside(logs)

    with pytest.raises(IntegrityViolation, match="nothing was repeated"):
        repeat_effect(admin, plan_repeat(admin, effect), "and lost it again")

    assert outside(logs) == sent
