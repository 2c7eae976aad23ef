"""The outbox holds messages of running runs only, and a lost message comes back within the
bound docs/guarantees.md gives (docs/design.md section 13, invariant 3). Real PostgreSQL; the
dispatcher's sweep and the reaper's statements are called directly, time moved with the
test clock (tests/support/clock.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ledger import Ledger
from ledger.outbox import OutboxMessage, OutboxStore
from ledger.recovery import RecoveryStore
from ledger.runs import Budgets
from ledger.steps import Claim, StepStore, error_record
from ledger.vocabulary import ParkReason
from tests.support import clock, reads
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
AN_HOUR = timedelta(hours=1)


@pytest.fixture()
def store(ledger: Ledger) -> Iterator[StepStore]:
    opened = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    yield opened
    opened.close()


@pytest.fixture()
def later(ledger: Ledger) -> Iterator[Engine]:
    """An engine whose clock runs an hour ahead: leases and deadlines have passed for it."""
    engine = sa.create_engine(ledger.url)
    clock.follow_engine(engine, [AN_HOUR])
    yield engine
    engine.dispose()


def _claimed(ledger: Ledger, store: StepStore, **budgets: object) -> Claim:
    run_id = ledger.start_run("test_chain", {"steps": 3}, budgets=Budgets(**budgets))
    claim = store.claim(run_id, 0, "slow:1")
    assert isinstance(claim, Claim)
    return claim


def _fail(store: StepStore, claim: Claim) -> None:
    assert store.fail(claim, "tick", error_record("Boom", "gave up"), retry_in_s=None)


def _park(store: StepStore, claim: Claim) -> None:
    assert store.park(claim, "tick", ParkReason.INTEGRITY, error_record("IntegrityViolation", "no"))


@pytest.mark.parametrize("stop", [_fail, _park], ids=["fail", "park"])
def test_outbox__a_slow_holder_that_stops_the_run_takes_the_reaper_row_with_it(
        ledger: Ledger, store: StepStore, later: Engine,
        stop: Callable[[StepStore, Claim], None]) -> None:
    """Invariant: no outbox row of a non-running run. The holder of a step was slow; the
    reaper, seeing its lease expired, queued the step again; then the holder failed or
    parked the run: the reaper's row goes in the same transaction (today it stays, and the
    dispatcher publishes it forever)."""
    claim = _claimed(ledger, store)
    RecoveryStore(later).sweep(stall_after_s=60)
    assert len(reads.outbox_rows(ledger.engine, claim.run_id)) == 1
    stop(store, claim)
    assert reads.run_row(ledger.engine, claim.run_id)["status"] != "running"
    assert reads.outbox_rows(ledger.engine, claim.run_id) == []


def test_outbox__a_deadline_that_fails_a_run_in_retry_backoff_takes_its_retry_row(
        ledger: Ledger, store: StepStore, later: Engine) -> None:
    """Invariant: no outbox row of a non-running run. A run waiting out a retry backoff (a
    delayed outbox row) passes its deadline: the reaper fails it and its retry row goes."""
    claim = _claimed(ledger, store, deadline=timedelta(minutes=5))
    assert store.fail(claim, "tick", error_record("Boom", "again"), retry_in_s=600)
    assert len(reads.outbox_rows(ledger.engine, claim.run_id)) == 1
    assert RecoveryStore(later).sweep(stall_after_s=60).waits.deadlines == 1
    assert reads.run_row(ledger.engine, claim.run_id)["status"] == "failed"
    assert reads.outbox_rows(ledger.engine, claim.run_id) == []


def _sweep(ledger: Ledger, settings: WorkerSettings,
           offset: timedelta = timedelta(0)) -> list[OutboxMessage]:
    outbox = OutboxStore(ledger.url, grace_s=settings.outbox_grace_s,
                         republish_s=settings.outbox_republish_s,
                         republish_max_s=settings.outbox_republish_max_s)
    sent: list[OutboxMessage] = []
    try:
        conn = outbox._connection()
        clock.set_on_raw(conn, offset)
        conn.commit()
        outbox.sweep(sent.append)
    finally:
        outbox.close()
    return sent


def _leftover_row(ledger: Ledger, status: str) -> UUID:
    """A run that stopped with a row still in the outbox (as versions before 0009 left)."""
    run_id = ledger.start_run("test_chain", {"steps": 3})
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM onward.outbox WHERE run_id = :id"), {"id": run_id})
        conn.execute(sa.text("UPDATE onward.runs SET status = :s WHERE id = :id"),
                     {"s": status, "id": run_id})
        conn.execute(sa.text("INSERT INTO onward.outbox (run_id, seq, published_at, "
                             "publish_count) VALUES (:id, 0, onward.now(), 1)"), {"id": run_id})
    return run_id


@pytest.mark.parametrize("status", ["completed", "failed", "needs_review", "cancelled",
                                    "diverged", "waiting"])
def test_outbox__dispatcher_deletes_rows_of_stopped_runs_and_never_publishes_them(
        ledger: Ledger, status: str) -> None:
    """Invariant: the dispatcher publishes only rows of running runs. A row left behind by a
    run that is no longer running is deleted by the next sweep, unpublished."""
    settings = WorkerSettings(database_url=ledger.url, outbox_republish_s=1)
    run_id = _leftover_row(ledger, status)
    sent = _sweep(ledger, settings, offset=timedelta(seconds=5))
    assert [m.run_id for m in sent if m.run_id == run_id] == []
    assert reads.outbox_rows(ledger.engine, run_id) == []


def _published_long_ago(ledger: Ledger, count: int) -> UUID:
    run_id = ledger.start_run("test_chain", {"steps": 3})
    reads.execute(ledger.engine, "UPDATE onward.outbox SET published_at = onward.now(), "
                  "publish_count = :n WHERE run_id = :id", n=count, id=run_id)
    return run_id


def test_outbox__a_lost_message_is_resent_within_the_documented_bound(ledger: Ledger) -> None:
    """Invariant: a message published and never claimed (lost) is published again at most
    ONWARD_OUTBOX_REPUBLISH_MAX_S after its last publish, however often it was published
    before; and not before ONWARD_OUTBOX_REPUBLISH_S (no flood). With the defaults that is
    within 120 s (today the backoff reaches 30 s x 64 = 32 minutes)."""
    settings = WorkerSettings(database_url=ledger.url)
    bound = settings.outbox_republish_max_s
    often = _published_long_ago(ledger, count=12)
    once = _published_long_ago(ledger, count=1)
    assert {m.run_id for m in _sweep(ledger, settings, offset=timedelta(seconds=1))} \
        & {often, once} == set()
    due = {m.run_id for m in _sweep(ledger, settings, offset=timedelta(seconds=bound + 1))}
    assert {often, once} <= due


def test_outbox__docs_state_every_setting_with_its_default() -> None:
    """Code and docs agree: docs/configuration.md lists every ONWARD_ setting with the
    default the code has, and docs/guarantees.md names the republish bound it promises."""
    table = (ROOT / "docs" / "configuration.md").read_text()
    for name, field in WorkerSettings.model_fields.items():
        row = re.search(rf"^\| `ONWARD_{name.upper()}` \| ([^|]*) \|", table, re.MULTILINE)
        assert row is not None, f"ONWARD_{name.upper()} is not in docs/configuration.md"
        if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
            assert row.group(1).strip() == f"`{field.default}`", name
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    assert "ONWARD_OUTBOX_REPUBLISH_MAX_S" in guarantees
