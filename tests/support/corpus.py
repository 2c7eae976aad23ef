"""Recording runs for corpus tests: the operator tools' workflows driven in-process through
the real executor (tests/support/driver.py), and a second, empty ledger to import into."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from harness.databases import create_database, drop_database
from ledger import Ledger, OnwardSettings, RunStatus
from ledger.vocabulary import Role
from tasks.waiting import artifact_hash
from tests.support.driver import Driver, driver

OPS_MODULES = ["tests.workflows_ops"]

TABLES = ("runs", "checkpoints", "evidence", "effects", "effect_attempts", "approvals",
          "signals", "step_attempts", "artifacts", "audit", "corpora", "corpus_runs", "outbox")


def record_note(drv: Driver, topic: str, *, approve: bool = False) -> UUID:
    """A completed ``test_ops_notes`` run: a model call, two effects, maybe an approval."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": topic, "approve": approve})
    run = drv.drive(run_id)
    if approve:
        assert run.status is RunStatus.WAITING, run
        approval = drv.ledger.approvals(run_id=run_id)[0]
        drv.ledger.acting_as("ann", Role.APPROVER).approve(
            approval.id, artifact_hash=artifact_hash(approval.artifact))
        run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run
    return run_id


def row_counts(engine: sa.engine.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM onward.{t}")).scalar_one()
                for t in TABLES}


def table_digest(engine: sa.engine.Engine) -> dict[str, str]:
    """An md5 of every row of every ledger table: equal before and after means nothing was
    written (inserted, updated or deleted)."""
    with engine.connect() as conn:
        return {t: conn.execute(sa.text(
            f"SELECT coalesce(md5(string_agg(x::text, ',' ORDER BY x::text)), '') "
            f"FROM onward.{t} x")).scalar_one() for t in TABLES}


@contextmanager
def ops_driver(ledger: Ledger, calls_log: Path, monkeypatch: pytest.MonkeyPatch,
               modules: list[str] = OPS_MODULES) -> Iterator[Driver]:
    """The operator tools' workflows (``tests/workflows_ops.py``, their first variant)
    driven in-process by olga, an operator; their tool calls are logged to ``calls_log``."""
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(calls_log))
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    with driver(ledger.acting_as("olga", Role.OPERATOR), modules) as running:
        yield running


@contextmanager
def empty_database(server_urls: dict[str, str], template_database: str,
                   prefix: str) -> Iterator[str]:
    """The URL of a database of its own, migrated and empty, dropped afterwards."""
    name, url = create_database(server_urls["database"], prefix, template=template_database)
    try:
        yield url
    finally:
        drop_database(server_urls["database"], name)


@contextmanager
def other_ledger(url: str, settings: OnwardSettings) -> Iterator[Ledger]:
    """A ledger on another (migrated, empty) database, with the same keys and tenant."""
    other = settings.model_copy(update={"database_url": url})
    engine = sa.create_engine(url)
    try:
        yield Ledger(engine, other)
    finally:
        engine.dispose()


def record_flow(drv: Driver, sku: str) -> UUID:
    """A completed ``test_corpus_flow`` run: a model call, a read, two effects, a timer and
    a signal sent by an operator."""
    run_id = drv.ledger.start_run("test_corpus_flow", {"sku": sku})
    run = drv.drive(run_id)
    assert run.status is RunStatus.WAITING, run
    drv.ledger.signal(run_id, "go", {"by": "sam"})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run
    return run_id


def record_timeouts(drv: Driver) -> UUID:
    """A completed ``test_corpus_waits`` run: its approval expired (the run went on to
    ``on_expire``), then its signal wait timed out (``on_timeout``), as the reaper decides."""
    from ledger.recovery import RecoveryStore
    from tests.support.cluster import wait_for

    run_id = drv.ledger.start_run("test_corpus_waits", {"wait_ms": 50})
    reaper = RecoveryStore(drv.ledger.engine, drv.ledger.keys)
    def swept() -> bool:
        reaper.sweep(stall_after_s=600)
        return drv.ledger.get_run(run_id).status is RunStatus.RUNNING

    for _ in range(2):  # the approval expires, then the signal wait times out
        assert drv.drive(run_id).status is RunStatus.WAITING
        wait_for(swept, timeout=30, what="the reaper to end the wait")
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {
        "outcome": "gave up after the approval expired"}, run
    return run_id
