"""Starting runs: input validation, idempotency keys, and the caller's transaction."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from ledger import IdempotencyConflict, InvalidInput, Ledger, RunStatus
from tests.support import reads


@pytest.mark.parametrize(
    ("workflow", "payload", "message"),
    [
        ("test_chain", ["not", "an", "object"], "must be a JSON object, got list"),
        ("test_chain", "text", "must be a JSON object, got str"),
        ("test_chain", None, "must be a JSON object, got NoneType"),
        ("test_chain", {"x": float("nan")}, "not plain JSON"),
        ("test_chain", {"x": {1, 2}}, "not plain JSON"),
        ("test_chain", {"x": object()}, "not plain JSON"),
        ("test_chain", {"blob": "x" * 1_100_000}, r"over the limit of 1000000"),
        ("", {}, "workflow must be a non-empty name"),
    ],
)
def test_start_run__invalid_input_is_refused_and_writes_nothing(
        ledger: Ledger, workflow: str, payload: Any, message: str) -> None:
    """Input that is not a plain JSON object within the size limit, or no workflow name, is
    refused with InvalidInput before anything is written: no run, checkpoint or outbox row."""
    before = reads.fingerprint(ledger.engine)
    with pytest.raises(InvalidInput, match=message):
        ledger.start_run(workflow, payload)
    assert reads.fingerprint(ledger.engine) == before


def test_start_run__writes_run_checkpoint_zero_and_outbox_row(ledger: Ledger) -> None:
    """A new run is runnable at seq 0 with checkpoint 0 holding the input and one outbox row
    for seq 0 (published by the dispatcher, not a worker), all in one transaction."""
    run_id = ledger.start_run("test_chain", {"steps": 4}, conversation_id="conv-1")
    run = ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.seq, run.attempt, run.attempts_total, run.lease_epoch) == (
        RunStatus.RUNNING, 0, 0, 0, 0)
    assert run.max_attempts == ledger.settings.step_max_attempts
    assert run.conversation_id == "conv-1" and run.step is None
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]
    [row] = reads.outbox_rows(ledger.engine, run_id)
    assert (row["seq"], row["worker_publishes"], row["published_at"]) == (0, False, None)


def test_start_run__idempotency_key_returns_the_same_run(ledger: Ledger) -> None:
    """The same idempotency key with the same request returns the run it first started and
    writes nothing more; the same key with another input or workflow is refused."""
    first = ledger.start_run("test_chain", {"steps": 2}, idempotency_key="order:42")
    before = reads.fingerprint(ledger.engine)
    again = ledger.start_run("test_chain", {"steps": 2}, idempotency_key="order:42")
    assert again == first
    assert reads.fingerprint(ledger.engine) == before

    with pytest.raises(IdempotencyConflict, match="a key must not change its request"):
        ledger.start_run("test_chain", {"steps": 3}, idempotency_key="order:42")
    with pytest.raises(IdempotencyConflict, match="'test_chain'"):
        ledger.start_run("test_flaky", {"steps": 2}, idempotency_key="order:42")
    assert reads.fingerprint(ledger.engine) == before

    other = ledger.start_run("test_chain", {"steps": 2}, idempotency_key="order:43")
    assert other != first
    unkeyed = {ledger.start_run("test_chain", {"steps": 2}) for _ in range(2)}
    assert len(unkeyed) == 2


def test_start_run_txn__rolls_back_with_the_callers_transaction(ledger: Ledger) -> None:
    """start_run_txn writes inside the caller's transaction: when the caller's business
    write fails and the transaction rolls back, the run, its checkpoint and its outbox row
    vanish with it (no message is ever published for a run that does not exist)."""
    before = reads.fingerprint(ledger.engine)
    started: list[Any] = []
    with pytest.raises(RuntimeError, match="business write failed"), \
            ledger.engine.begin() as conn:
        started.append(ledger.start_run_txn(conn, "test_chain", {"steps": 2},
                                            idempotency_key="txn:rollback"))
        assert conn.execute(sa.text("SELECT count(*) FROM onward.outbox WHERE run_id = :id"),
                            {"id": started[0]}).scalar_one() == 1
        raise RuntimeError("business write failed")
    assert ledger.get_run(started[0]) is None
    assert reads.fingerprint(ledger.engine) == before

    with ledger.engine.begin() as conn:
        committed = ledger.start_run_txn(conn, "test_chain", {"steps": 2},
                                         idempotency_key="txn:rollback")
    assert committed != started[0]
    assert ledger.get_run(committed) is not None
    assert len(reads.outbox_rows(ledger.engine, committed)) == 1
