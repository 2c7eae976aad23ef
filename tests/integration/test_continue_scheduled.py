"""``runs continue`` on a runnable run whose next delivery is scheduled for later: a retry
backoff or an accepted effect's next status poll is a wait like a durable timer, and
continue does not cut it short; continue never resets the attempt count of a run it did not
unblock. Real PostgreSQL; the hot-path store is called directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger import Ledger
from ledger.exceptions import OperationRefused
from ledger.steps import Claim, StepStore, error_record
from ledger.vocabulary import Role
from tests.support import reads


@pytest.fixture()
def store(ledger: Ledger) -> Iterator[StepStore]:
    opened = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    yield opened
    opened.close()


def _claimed(ledger: Ledger, store: StepStore) -> Claim:
    claim = store.claim(ledger.start_run("test_chain", {"steps": 3}), 0, "worker:1")
    assert isinstance(claim, Claim)
    return claim


def test_continue__refuses_a_run_waiting_out_a_retry_backoff(ledger: Ledger,
                                                             store: StepStore) -> None:
    """Invariant: continue never cuts a scheduled wait short. A step raised and is retried
    in 10 minutes (a delayed outbox row): continue is refused, says why, and leaves the
    attempt count and the retry's due time as they were (before, it queued the step at once
    with its attempt count reset to 0)."""
    claim = _claimed(ledger, store)
    assert store.fail(claim, "tick", error_record("Timeout", "the model timed out"),
                      retry_in_s=600)
    before = reads.outbox_rows(ledger.engine, claim.run_id)
    ops = ledger.acting_as("olga", Role.OPERATOR)
    with pytest.raises(OperationRefused, match=r"retry backoff.*Timeout"):
        ops.continue_run(claim.run_id, "hurry up")
    assert reads.run_row(ledger.engine, claim.run_id)["attempt"] == 1
    assert reads.outbox_rows(ledger.engine, claim.run_id) == before


def test_continue__refuses_a_run_polling_an_accepted_effect(ledger: Ledger,
                                                            store: StepStore) -> None:
    """Invariant: continue never cuts a scheduled wait short. A step whose effect the
    provider accepted waits for its next status poll in 10 minutes: continue is refused."""
    claim = _claimed(ledger, store)
    assert store.defer(claim, "tick", delay_s=600, waiting_on="effect:abc",
                       detail="accepted; polling status in 600s")
    with pytest.raises(OperationRefused, match="accepted effect"):
        ledger.acting_as("olga", Role.OPERATOR).continue_run(claim.run_id, "hurry up")


def test_continue__keeps_the_attempt_count_of_a_runnable_run(ledger: Ledger,
                                                             store: StepStore) -> None:
    """Invariant: continue resets attempts only of a run it unblocks. A runnable run whose
    retry is due now (nothing to unblock) is queued again, with its attempt count kept:
    the step still has 2 attempts left, not 3."""
    claim = _claimed(ledger, store)
    assert store.fail(claim, "tick", error_record("Timeout", "again"), retry_in_s=0)
    ledger.acting_as("olga", Role.OPERATOR).continue_run(claim.run_id, "send it again")
    row = reads.run_row(ledger.engine, claim.run_id)
    assert (row["status"], row["attempt"]) == ("running", 1)
    assert [r["seq"] for r in reads.outbox_rows(ledger.engine, claim.run_id)] == [0]
