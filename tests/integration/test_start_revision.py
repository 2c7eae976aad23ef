"""A start in the application's own transaction refuses a ledger upgraded under the process
(docs/operating.md, "Upgrading"), against a real PostgreSQL: ``Ledger.start_run_txn`` (a
SQLAlchemy or a psycopg connection) and ``AsyncLedger.start`` write nothing and raise
``SchemaMismatch`` when the stored revision is not the code's, as ``Ledger.start_run`` and
the operator commands do, with no statement added: the start statement checks it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from ledger import Ledger
from ledger.client import AsyncLedger
from ledger.db import HEAD_REVISION, libpq_conninfo
from ledger.exceptions import SchemaMismatch
from ledger.schema import SCHEMA, VERSION_TABLE


def _count(ledger: Ledger, table: str) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM onward.{table}")).scalar_one())


def _set_revision(ledger: Ledger, revision: str) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = :v"),
                     {"v": revision})


@pytest.fixture()
def upgraded(ledger: Ledger) -> Iterator[Ledger]:
    """The ledger as a newer release left it under this process (revision 9999), with a
    run started by an idempotency key before the upgrade."""
    ledger.start_run("wf_unknown", {}, idempotency_key="before", allow_unadvertised=True)
    _set_revision(ledger, "9999")
    yield ledger
    _set_revision(ledger, HEAD_REVISION)


def test_start_run_txn__writes_nothing_on_a_ledger_upgraded_under_the_process(
        upgraded: Ledger) -> None:
    """Invariant: in the caller's transaction, on a SQLAlchemy or a psycopg connection, a
    new start and one with an idempotency key already used both raise SchemaMismatch
    naming the revision and a restart; no run, checkpoint or outbox row is written."""
    counts = [_count(upgraded, t) for t in ("runs", "checkpoints", "outbox")]
    for key in (None, "before"):
        with upgraded.engine.begin() as conn, \
                pytest.raises(SchemaMismatch, match=r"now is at revision 9999.*restart"):
            upgraded.start_run_txn(conn, "wf_unknown", {}, idempotency_key=key,
                                   allow_unadvertised=True)
        with psycopg.connect(libpq_conninfo(upgraded.url)) as raw, \
                pytest.raises(SchemaMismatch, match="nothing was written"):
            upgraded.start_run_txn(raw, "wf_unknown", {}, idempotency_key=key,
                                   allow_unadvertised=True)
    with pytest.raises(SchemaMismatch, match="nothing was written"):
        upgraded.start_run("wf_unknown", {}, allow_unadvertised=True)
    assert [_count(upgraded, t) for t in ("runs", "checkpoints", "outbox")] == counts


def test_async_start__writes_nothing_on_a_ledger_upgraded_under_the_process(
        upgraded: Ledger) -> None:
    """Invariant: ``AsyncLedger.start`` runs the same statement and refuses the same
    way; back at the code's revision, the same call starts the run."""
    runs = _count(upgraded, "runs")

    async def start() -> object:
        async with AsyncLedger(upgraded.settings) as client:
            return await client.start("wf_unknown", {}, allow_unadvertised=True)

    with pytest.raises(SchemaMismatch, match="nothing was written"):
        asyncio.run(start())
    assert _count(upgraded, "runs") == runs
    _set_revision(upgraded, HEAD_REVISION)
    asyncio.run(start())
    assert _count(upgraded, "runs") == runs + 1
