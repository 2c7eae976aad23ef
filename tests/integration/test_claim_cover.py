"""A step's first model call needs no statement before it when its claim already covers it
(docs/scaling.md, "Where an agent step's overhead goes"): the claim found no answer
recorded or refused at the step's seq, and took a lease that lasts the call's time limit and
the margin (a step ``timeout`` longer than the call's, or a TTL longer than it). Every other
call is covered as before, by the look-up statement that extends the lease. Each test
counts the ledger statements the worker sends (real PostgreSQL, steps run in this process:
tests/support/driver.py) and looks at the lease from the database while the model answers:
it always covers the call's time limit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus, sql
from ledger.evidence import EvidenceRecord, EvidenceStore
from ledger.exceptions import EvidenceFenced
from ledger.steps import Claim, StepStore, lease_clock
from tasks.executor import StepMessage, StepReport, execute_step
from tests.support.driver import Driver, driver_fixture
from tests.workflows_cover import LONG, QUICK, CountingModel

MODULES = ["tests.workflows_cover"]
LOOK_UP = "find_evidence_or_cover_call"


drv = driver_fixture(MODULES)


@contextmanager
def statements(store: StepStore) -> Iterator[list[str]]:
    """The names (ledger/sql catalogue) of the statements ``store``'s connection sends."""
    names = {statement.sql: name for name, statement in sql.STATEMENTS.items()}
    seen: list[str] = []
    conn: Any = store.conn
    send = conn._run

    def counted(text: str, params: dict[str, Any], many: bool, binary: bool = False) -> Any:
        seen.append(names.get(text, text[:60]))
        return send(text, params, many, binary)

    conn._run = counted
    try:
        yield seen
    finally:
        conn._run = send


@contextmanager
def lease_watch(ledger: Ledger, model: CountingModel, run_id: UUID) -> Iterator[list[float]]:
    """The seconds the run's lease had left, by the database's clock, as each call began."""
    left: list[float] = []

    def look() -> None:
        with ledger.engine.connect() as conn:
            left.append(float(conn.execute(sa.text(
                "SELECT extract(epoch FROM lease_expires_at - onward.now()) "
                "FROM onward.runs WHERE id = :id"), {"id": run_id}).scalar_one()))

    model.calls, model.on_call = 0, look
    try:
        yield left
    finally:
        model.on_call = lambda: None


def test_claim_cover__the_lease_is_counted_down_on_boot_time_where_there_is_one() -> None:
    """A host that was suspended must not think a lease still runs that the database saw
    expire: Linux's monotonic clock stops while suspended, its boot-time clock does not."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        before, now, after = time.monotonic(), lease_clock(), time.monotonic()
    else:
        before, now, after = (time.clock_gettime(boottime), lease_clock(),
                              time.clock_gettime(boottime))
    assert before <= now <= after


def _step(drv: Driver, run_id: UUID, claimed: Claim | None = None) -> str:
    return _report(drv, run_id, claimed).kind.value


def _report(drv: Driver, run_id: UUID, claimed: Claim | None = None,
            chain: bool = False) -> StepReport:
    run = drv.ledger.get_run(run_id)
    assert run is not None
    return execute_step(drv.store, drv.registry, drv.config,
                        StepMessage(run_id=run_id, seq=run.seq), worker="driver:0",
                        publish=lambda *args: None, claimed=claimed,
                        chain=(lambda: True) if chain else None)


def _started(ledger: Ledger, workflow: str, **state: Any) -> UUID:
    return ledger.start_run(workflow, state)


def test_claim_cover__a_first_call_the_claim_covers_sends_no_statement_before_it(
        ledger: Ledger, drv: Driver) -> None:
    """Three statements for a step with one model call: claim, record, commit."""
    run_id = _started(ledger, "test_cover_timed")
    with lease_watch(ledger, QUICK, run_id) as left, statements(drv.store) as sent:
        assert _step(drv, run_id) == "committed"
    assert sent == ["claim", "record_evidence", "commit"]
    assert QUICK.calls == 1 and left[0] >= QUICK.timeout_s + drv.config.tool_lease_margin_s - 1
    run = ledger.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED


def test_claim_cover__a_call_longer_than_the_claims_lease_is_covered_first(
        ledger: Ledger, drv: Driver) -> None:
    """A model whose time limit (600 s) outlasts the claim's lease (30 s): the look-up
    extends the lease over it before the call, as before."""
    run_id = _started(ledger, "test_cover_long_model")
    with lease_watch(ledger, LONG, run_id) as left, statements(drv.store) as sent:
        assert _step(drv, run_id) == "committed"
    assert sent == ["claim", LOOK_UP, "record_evidence", "commit"]
    assert LONG.calls == 1 and left[0] >= LONG.timeout_s


def test_claim_cover__later_calls_of_the_step_ask_the_ledger(ledger: Ledger,
                                                             drv: Driver) -> None:
    """Only the first call uses the claim: a cancel requested, or the lease lost, while it
    ran is seen before the second."""
    run_id = _started(ledger, "test_cover_timed", calls=2)
    with lease_watch(ledger, QUICK, run_id), statements(drv.store) as sent:
        assert _step(drv, run_id) == "committed"
    assert sent == ["claim", "record_evidence", LOOK_UP, "record_evidence", "commit"]


def test_claim_cover__a_retry_after_a_recorded_answer_looks_it_up(ledger: Ledger,
                                                                   drv: Driver) -> None:
    """The first attempt recorded its answer, then failed: the retry's claim says an answer
    is recorded at its seq, so its call looks it up (and is answered from it)."""
    run_id = _started(ledger, "test_cover_timed", fail_first=True)
    with lease_watch(ledger, QUICK, run_id), statements(drv.store) as sent:
        assert _step(drv, run_id) == "retry"
        first = len(sent)
        assert _step(drv, run_id) == "committed"
    assert LOOK_UP not in sent[:first]
    # a retry resolves what an earlier attempt may have left unknown before it commits
    # (7c95977: one read of the run's unknown effects, then closing never-sent ones)
    assert sent[first:] == ["claim", LOOK_UP, "unresolved_effects", "close_unsent_effects",
                            "commit"]
    assert QUICK.calls == 1  # the retry was answered from the record


def test_claim_cover__a_lease_that_ran_down_since_the_claim_is_covered_first(
        ledger: Ledger, drv: Driver) -> None:
    """The claim's lease is counted from before its statement was sent, on this host's
    lease clock: once what is left is shorter than the call's time limit and the margin,
    the call is covered by the look-up first."""
    run_id = _started(ledger, "test_cover_timed")
    claim = drv.store.claim(run_id, 0, "driver:0",
                            leases=drv.registry.step_leases(drv.config.tool_lease_margin_s))
    assert isinstance(claim, Claim) and claim.answered is False
    assert claim.lease_until is not None and claim.lease_until > lease_clock() + 60
    ran_down = replace(claim, lease_until=lease_clock() + 1.0)  # as if 64 s had passed
    with lease_watch(ledger, QUICK, run_id) as left, statements(drv.store) as sent:
        assert _step(drv, run_id, claimed=ran_down) == "committed"
    assert sent == [LOOK_UP, "record_evidence", "commit"]
    assert left[0] >= QUICK.timeout_s


def test_claim_cover__a_step_the_previous_commit_claimed_is_covered_by_that_commit(
        ledger: Ledger, drv: Driver) -> None:
    """Eager continuation: the commit that claims the next step returns that step's lease
    length and whether an answer is recorded or refused at its seq, so its first call sends
    no statement before it either (claim, commit-and-claim, record, commit)."""
    run_id = _started(ledger, "test_cover_chained")
    with lease_watch(ledger, QUICK, run_id) as left, statements(drv.store) as sent:
        first = _report(drv, run_id, chain=True)
        assert first.kind.value == "committed" and first.next_claim is not None
        assert first.next_claim.answered is False
        assert first.next_claim.lease_until is not None
        assert first.next_claim.lease_until > lease_clock() + QUICK.timeout_s
        assert _step(drv, run_id, claimed=first.next_claim) == "committed"
    assert sent == ["claim", "commit", "record_evidence", "commit"]
    assert QUICK.calls == 1 and left[0] >= QUICK.timeout_s + drv.config.tool_lease_margin_s - 1
    run = ledger.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED


def test_claim_cover__nothing_can_be_answered_at_a_seq_the_run_has_not_reached(
        ledger: Ledger, drv: Driver) -> None:
    """Why a chained commit does not look for an answer at the seq it claims (ledger/steps.py
    ``_successor_claim``): an answer or a refusal is written only at the seq the run is at,
    under its lease. The holder of seq 0's lease records at seq 1 (its command id and all):
    fenced, nothing written; a refusal there: nothing written either. (A guard: passes
    before the chained commit stopped looking as well.)"""
    run_id = _started(ledger, "test_cover_timed")
    claim = drv.store.claim(run_id, 0, "driver:0")
    assert isinstance(claim, Claim)
    store = EvidenceStore(drv.store.conn, max_artifact_bytes=drv.config.max_artifact_bytes,
                          keys=drv.config.keys)
    ahead = EvidenceRecord(run_id=run_id, command_id="asked@1#1", kind="llm", seq=1,
                           step="asked", source="m", source_version="m",
                           request_hash="0" * 64, response={"text": "early"},
                           input_tokens=3, lease_epoch=claim.epoch)
    with pytest.raises(EvidenceFenced):
        store.record(ahead)
    assert store.refuse(ahead, "refused ahead") is False
    with ledger.engine.connect() as conn:
        written = conn.execute(sa.text(
            "SELECT (SELECT count(*) FROM onward.evidence WHERE run_id = :id) + "
            "(SELECT count(*) FROM onward.refused_answers WHERE run_id = :id)"),
            {"id": run_id}).scalar_one()
        used = conn.execute(sa.text("SELECT used_tokens FROM onward.runs WHERE id = :id"),
                            {"id": run_id}).scalar_one()
    assert (written, used) == (0, 0)


def test_claim_cover__an_answer_recorded_first_for_another_request_parks_the_run(
        ledger: Ledger, drv: Driver) -> None:
    """Were a claim wrong to say nothing is answered at its seq, the call is made again and
    its record finds the first answer, which stands; it is used only if it answered the
    same request, as a look-up checks. Here the first attempt asked "a1", recorded, failed;
    the retry, on a claim saying nothing is answered, asks "a2": the run parks
    evidence_conflict (before: it completed with the answer to "a1")."""
    run_id = _started(ledger, "test_cover_drifting")
    with lease_watch(ledger, QUICK, run_id):
        assert _step(drv, run_id) == "retry"
        claim = drv.store.claim(run_id, 0, "driver:0",
                                leases=drv.registry.step_leases(drv.config.tool_lease_margin_s))
        assert isinstance(claim, Claim) and claim.answered is True
        _step(drv, run_id, claimed=replace(claim, answered=False))
    assert QUICK.calls == 2
    run = ledger.get_run(run_id)
    assert run is not None and run.status is RunStatus.NEEDS_REVIEW, run
    assert run.parked_reason == "evidence_conflict"
