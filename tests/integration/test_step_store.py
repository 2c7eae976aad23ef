"""The hot-path SQL (ledger.steps.StepStore) against a real PostgreSQL: leases, fencing,
stale deliveries, attempt budgets. No worker processes: the store is called directly, from
several connections at once where the guarantee is about concurrency."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest

from ledger import Ledger, OutcomeKind, RunStatus
from ledger.steps import Advance, Claim, Stale, StaleReason, StepStore
from ledger.vocabulary import ParkReason
from tests.support import reads
from tests.support.cluster import wait_for

TTL_S = 3.0


@pytest.fixture()
def stores(ledger: Ledger) -> Iterator[list[StepStore]]:
    """Two step stores, each on its own connection: two workers' view of the ledger."""
    opened = [StepStore(ledger.url, ledger.keys, lease_ttl_s=TTL_S) for _ in range(2)]
    yield opened
    for store in opened:
        store.close()


def _goto(step: str = "tick", done: int = 1) -> Advance:
    return Advance(step=step, outcome=OutcomeKind.GOTO, next_step="tick",
                   state={"steps": 10, "done": done, "sleep_ms": 0}, workflow_version=1,
                   next_max_attempts=3)


def test_step_store__concurrent_claims_grant_one_lease(ledger: Ledger,
                                                       stores: list[StepStore]) -> None:
    """Two workers claiming the same (run, seq) at the same instant, 60 times over: exactly
    one gets the lease each time; the other sees LEASED (or SEQ_MOVED), and the ledger shows
    one attempt, one lease epoch and one stale delivery per run."""
    runs = [ledger.start_run("test_chain", {"steps": 3}) for _ in range(60)]
    results: dict[int, list[Claim | Stale]] = {0: [], 1: []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=30)

    def race(index: int) -> None:
        try:
            for run_id in runs:
                barrier.wait()
                results[index].append(stores[index].claim(run_id, 0, f"racer:{index}"))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=race, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for position, run_id in enumerate(runs):
        outcomes = [results[0][position], results[1][position]]
        claims = [o for o in outcomes if isinstance(o, Claim)]
        stale = [o for o in outcomes if isinstance(o, Stale)]
        assert len(claims) == 1 and len(stale) == 1, outcomes
        assert stale[0].reason in (StaleReason.LEASED, StaleReason.SEQ_MOVED)
        row = reads.run_row(ledger.engine, run_id)
        assert (row["lease_epoch"], row["attempts_total"], row["stale_deliveries"]) == (1, 1, 1)
        winner = 0 if isinstance(outcomes[0], Claim) else 1
        assert row["lease_owner"] == f"racer:{winner}"
        assert len(reads.attempts(ledger.engine, run_id)) == 1


def test_step_store__duplicate_and_stale_deliveries_are_counted_noops(
        ledger: Ledger, stores: list[StepStore]) -> None:
    """After seq 0 committed, a second delivery of seq 0, a delivery for a seq the run never
    reached, one for a finished run and one for an unknown run all change nothing but the
    run's stale_deliveries counter (and the unknown run changes nothing at all)."""
    store = stores[0]
    run_id = ledger.start_run("test_chain", {"steps": 3})
    claim = store.claim(run_id, 0, "w:1")
    assert isinstance(claim, Claim)
    assert store.commit(claim, _goto())
    before = reads.fingerprint(ledger.engine)

    duplicate = store.claim(run_id, 0, "w:2")
    future = store.claim(run_id, 7, "w:2")
    unknown = store.claim(uuid4(), 0, "w:2")
    assert isinstance(duplicate, Stale) and duplicate.reason is StaleReason.SEQ_MOVED
    assert duplicate.current_seq == 1
    assert isinstance(future, Stale) and future.reason is StaleReason.SEQ_MOVED
    assert isinstance(unknown, Stale) and unknown.reason is StaleReason.UNKNOWN_RUN

    after = reads.fingerprint(ledger.engine)
    assert after == before.__class__(**{**before.__dict__,
                                        "stale_deliveries": before.stale_deliveries + 2})
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]

    finished = ledger.start_run("test_chain", {"steps": 1})
    last = store.claim(finished, 0, "w:1")
    assert isinstance(last, Claim)
    assert store.commit(last, Advance(step="tick", outcome=OutcomeKind.FINISH, next_step=None,
                                      state={"steps": 1, "done": 1, "sleep_ms": 0},
                                      workflow_version=1, next_max_attempts=1,
                                      result={"done": 1}))
    late = store.claim(finished, 1, "w:2")
    assert isinstance(late, Stale) and late.reason is StaleReason.NOT_RUNNABLE
    assert late.status == RunStatus.COMPLETED
    row = reads.run_row(ledger.engine, finished)
    assert (row["status"], row["seq"], row["stale_deliveries"]) == ("completed", 1, 1)
    assert reads.outbox_rows(ledger.engine, finished) == []


def test_step_store__uncounted_claim_changes_nothing_when_refused(
        ledger: Ledger, stores: list[StepStore]) -> None:
    """A claim no message asked for (eager continuation, count_stale=False) that finds the
    run held by another worker returns NOT_CLAIMED and leaves the ledger exactly as it was:
    no stale delivery is counted, no lease or attempt taken."""
    run_id = ledger.start_run("test_chain", {"steps": 3})
    assert isinstance(stores[0].claim(run_id, 0, "w:1"), Claim)
    before = reads.fingerprint(ledger.engine)

    refused = stores[1].claim(run_id, 0, "w:2", count_stale=False)

    assert isinstance(refused, Stale) and refused.reason is StaleReason.NOT_CLAIMED
    assert reads.fingerprint(ledger.engine) == before


def test_step_store__expired_lease_fences_the_old_holder(ledger: Ledger) -> None:
    """A holder whose lease expired and was taken over cannot commit, fail, park, release
    or heartbeat: its epoch is stale, each call returns False and changes nothing. Its
    attempt ends 'lease_lost' (and stays so: the record never claims the stale holder
    failed or parked the run); the new holder commits the one successor of the checkpoint."""
    slow = StepStore(ledger.url, ledger.keys, lease_ttl_s=0.3)
    fast = StepStore(ledger.url, ledger.keys, lease_ttl_s=TTL_S)
    try:
        run_id = ledger.start_run("test_chain", {"steps": 3})
        old = slow.claim(run_id, 0, "paused:1")
        assert isinstance(old, Claim)
        new = wait_for(lambda: _claimed(fast, run_id, 0, "healthy:2"), timeout=30,
                       what="the expired lease to be claimable")
        assert new.epoch == old.epoch + 1 and new.attempt == 2
        held = reads.run_row(ledger.engine, run_id)

        assert slow.heartbeat(old) is False
        assert slow.commit(old, _goto()) is False
        late = {"type": "StepError", "message": "late"}
        assert slow.fail(old, "tick", late, retry_in_s=None) is False
        assert slow.fail(old, "tick", late, retry_in_s=0.0) is False
        assert slow.park(old, "tick", ParkReason.INTEGRITY, late) is False
        assert slow.release(old, late) is False
        assert reads.run_row(ledger.engine, run_id) == held
        assert reads.outbox_rows(ledger.engine, run_id) == []

        assert fast.commit(new, _goto()) is True
        outcomes = {a["lease_epoch"]: a["outcome"] for a in reads.attempts(ledger.engine,
                                                                           run_id)}
        assert outcomes == {old.epoch: "lease_lost", new.epoch: "committed"}
        assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
        row = reads.run_row(ledger.engine, run_id)
        assert (row["status"], row["seq"], row["last_error"]) == ("running", 1, None)
    finally:
        slow.close()
        fast.close()


def _claimed(store: StepStore, run_id: UUID, seq: int, owner: str) -> Claim | None:
    result = store.claim(run_id, seq, owner)
    return result if isinstance(result, Claim) else None


def test_step_store__crash_loop_cannot_refill_the_attempt_budget(ledger: Ledger) -> None:
    """Each claim spends an attempt in the ledger, whether or not the worker lives to record
    a result: with max_attempts=2, two claims whose leases simply expire exhaust the step,
    and the third delivery is refused (ATTEMPTS_EXHAUSTED) without a new attempt."""
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=0.2)
    try:
        run_id = ledger.start_run("test_chain", {"steps": 3}, max_attempts=2)
        first = store.claim(run_id, 0, "crashy:1")
        assert isinstance(first, Claim) and first.attempt == 1
        second = wait_for(lambda: _claimed(store, run_id, 0, "crashy:2"), timeout=30,
                          what="the first lease to expire")
        assert second.attempt == 2

        def refused() -> Stale | None:
            result = store.claim(run_id, 0, "crashy:3")
            assert not isinstance(result, Claim), "a third attempt was granted"
            return result if result.reason is StaleReason.ATTEMPTS_EXHAUSTED else None

        wait_for(refused, timeout=30, what="the exhausted step to be refused")
        row = reads.run_row(ledger.engine, run_id)
        assert (row["attempt"], row["attempts_total"], row["lease_epoch"]) == (2, 2, 2)
        assert len(reads.attempts(ledger.engine, run_id)) == 2
    finally:
        store.close()


def test_step_store__a_copy_delivered_during_a_retry_backoff_is_stale_not_due(
        ledger: Ledger, stores: list[StepStore]) -> None:
    """Invariant: a stale delivery says why it was refused (chaos finding 4). A copy of the
    step's message arriving while its retry waits out the backoff is refused, with no new
    attempt, as ``not_due`` (it was reported ``attempts_exhausted`` with attempts left);
    with the attempts spent it is ``attempts_exhausted``."""
    store = stores[0]
    run_id = ledger.start_run("test_chain", {"steps": 3}, max_attempts=2)
    claim = store.claim(run_id, 0, "w:1")
    assert isinstance(claim, Claim)
    assert store.fail(claim, "tick", {"type": "StepError", "message": "boom"}, retry_in_s=30.0)
    early = store.claim(run_id, 0, "w:2")
    assert isinstance(early, Stale) and early.reason == "not_due", early  # StaleReason.NOT_DUE
    row = reads.run_row(ledger.engine, run_id)
    assert (row["attempt"], row["attempts_total"], row["stale_deliveries"]) == (1, 1, 1)

    spent = ledger.start_run("test_chain", {"steps": 3}, max_attempts=1)
    last = store.claim(spent, 0, "w:1")
    assert isinstance(last, Claim)
    assert store.release(last, {"type": "Test", "message": "gone"}, spend_attempt=True)
    refused = store.claim(spent, 0, "w:2")
    assert isinstance(refused, Stale) and refused.reason is StaleReason.ATTEMPTS_EXHAUSTED


def test_step_store__fail_with_retry_writes_a_delayed_outbox_row(
        ledger: Ledger, stores: list[StepStore]) -> None:
    """A retryable step error releases the lease, keeps the run at its seq and writes the
    outbox row for the same seq due only after the backoff, published by the dispatcher
    (not the worker); the error is recorded on the run and on the attempt. Without a retry
    the run fails at once and nothing is left in the outbox."""
    store = stores[0]
    run_id = ledger.start_run("test_chain", {"steps": 3})
    claim = store.claim(run_id, 0, "w:1")
    assert isinstance(claim, Claim)
    assert store.fail(claim, "tick", {"type": "StepError", "message": "boom"}, retry_in_s=30.0)

    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["seq"], row["attempt"], row["lease_owner"]) == (
        "running", 0, 1, None)
    assert row["last_error"] == {"type": "StepError", "message": "boom"}
    [outbox] = reads.outbox_rows(ledger.engine, run_id)
    assert outbox["seq"] == 0 and outbox["worker_publishes"] is False
    assert outbox["published_at"] is None
    delay = (outbox["due_at"] - row["updated_at"]).total_seconds()
    assert 29.0 <= delay <= 31.0
    [attempt] = reads.attempts(ledger.engine, run_id)
    assert (attempt["outcome"], attempt["error_type"], attempt["error_message"]) == (
        "failed", "StepError", "boom")

    final = ledger.start_run("test_chain", {"steps": 3})
    last = store.claim(final, 0, "w:1")
    assert isinstance(last, Claim)
    assert store.fail(last, "tick", {"type": "StepError", "message": "final"}, retry_in_s=None)
    row = reads.run_row(ledger.engine, final)
    assert (row["status"], row["last_error"]["message"]) == ("failed", "final")
    assert row["finished_at"] is not None and row["lease_owner"] is None
    assert reads.outbox_rows(ledger.engine, final) == []
    assert reads.checkpoint_seqs(ledger.engine, final) == [0]


def test_hot_connection__reads_json_as_json_loads_does(server_urls: dict[str, str]) -> None:
    """The hot path parses ``json``/``jsonb`` with pydantic's parser (ledger/hot.py): what
    PostgreSQL sends back reads as ``json.loads`` reads it, every JSON type exactly, in the
    text and the binary format, and a value nested past that parser's 200 levels too."""
    import json

    from ledger.hot import HotConnection

    deep: object = ["x"]
    for _ in range(300):
        deep = [deep]
    value = {"s": "é\u2028\"\\/\t😀", "i": [0, -1, 2**53 - 1, 10**30], "f": [0.5, 1e-7, 1.5e300],
             "b": [True, False, None], "n": [{"a": [[]]}, {}], "deep": deep}
    text = json.dumps(value)
    conn = HotConnection(server_urls["database"])
    try:
        for binary in (False, True):
            row = conn.one("SELECT %(v)s::jsonb AS b, %(w)s::json AS j, %(v)s::jsonb::text AS t",
                           {"v": text, "w": text}, binary=binary)
            assert row is not None
            for read, sent in ((row["b"], json.loads(row["t"])), (row["j"], json.loads(text))):
                assert json.dumps(read, sort_keys=True) == json.dumps(sent, sort_keys=True)
            assert row["j"] == value  # (jsonb writes 1.5e300 out as an integer)
    finally:
        conn.close()
