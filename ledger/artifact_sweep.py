"""Artifacts nothing references any more go (issue 15 item 5; docs/operating.md#retention).

Artifacts are content-addressed and shared: an answer's body stored apart (evidence
``artifact_sha256``), a kept request (under the evidence's ``request_hash``) and a state
stored apart (a checkpoint's ``{"$artifact": {"sha256": …}}``) may be the same bytes for
many runs, branches, replays and imported copies. Compaction takes the run's references
away (ledger/retention.py); an artifact is deleted once no row references it, in the same
transaction as the compaction that took the last reference (its bytes counted in that run's
audit row), or by ``sweep`` for one left over (a compaction by an earlier version, a body
whose evidence row lost its insert race), a page at a time, each page audited.

**Races.** A check (no reference) followed by a delete would lose an artifact to a writer
that references it between the two without inserting it (``ON CONFLICT DO NOTHING`` finds
it present and locks nothing). So every writer of a reference holds the artifact's advisory
lock ``(ARTIFACT_LOCK, hashtext(sha256))`` shared to its commit: the hot statements in the
insert's own ``WHERE`` (record_evidence, the commit), a branch or replay copying a state
stored apart, a corpus import, opened replays through ``share_txn``. A deletion takes it
exclusively with a try-lock (never waits, so never deadlocks with a writer), skips what it
cannot lock, and checks the references in its DELETE statement, after the lock: a writer
in flight keeps its artifact (left for a later pass); a writer that comes after the deletion
commits waits for it and inserts the bytes again (its conflict check sees the row gone).

**A request named, not kept.** Evidence that did not keep its request as an artifact
(sealed in its own row instead, too large, or its bytes not hashing to it) still names its
``request_hash`` but takes no lock on it. No run can lose a request it kept that way: the
run that kept the bytes held the lock until its own row committed, and from then on that
row is what the DELETE's re-check finds (it keeps the bytes while *any* evidence not
compacted names the hash, whether that row kept them or not). The bytes go only once no
keeper is in flight and no committed row needs them; a row naming the hash without keeping
it that commits afterwards reads as what it is: its own sealed request, or a request not
kept (readers find a plain request by its hash: present means kept).

Only a role that sees every tenant's rows deletes anything: ``onward_app`` has no DELETE
policy on ``artifacts`` (migration 0027), and its reference checks would see one tenant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from sqlalchemy.engine import Connection, Engine

from ledger import sql
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.db import wrap_driver_errors
from ledger.vocabulary import AuditAction, AuditOutcome

__all__ = [
    "ARTIFACT_LOCK",
    "Freed",
    "free_txn",
    "freed_by_txn",
    "may_delete_txn",
    "referenced_txn",
    "release_txn",
    "share_txn",
    "sweep",
]

ARTIFACT_LOCK = 0x0A0DA27F
"""The first key of an artifact's advisory lock; the second is ``hashtext(sha256)`` (a
collision only makes a writer wait for an unrelated sweep, or a sweep skip)."""

_OF_RUN = sql.text("artifacts_of_run")
_LOCK = sql.text("artifacts_lock")
_SHARE = sql.text("artifacts_share")
_RELEASE = sql.text("artifacts_release")
_UNREFERENCED = sql.text("artifacts_unreferenced")
_MAY_DELETE = sql.text("artifacts_may_delete")
_FREED_BY = sql.text("artifacts_freed_by")


@dataclass
class Freed:
    """Artifacts deleted (or that would be), and their bytes."""

    artifacts: int = 0
    bytes: int = 0
    shas: list[str] = field(default_factory=list)

    def add(self, other: Freed) -> None:
        self.artifacts += other.artifacts
        self.bytes += other.bytes
        self.shas += other.shas


def may_delete_txn(conn: Connection) -> bool:
    """Whether this connection's role may delete artifacts: one that sees every tenant's
    references. As ``onward_app`` a DELETE finds no row, and a count of what nothing
    references would leave out every other tenant's references (and so count artifacts
    they share as going): plan and sweep count and read nothing there."""
    return bool(conn.execute(_MAY_DELETE).scalar_one())


def referenced_txn(conn: Connection, run_id: UUID) -> list[str]:
    """The artifacts ``run_id`` references now (read before compacting it)."""
    return list(conn.execute(_OF_RUN, {"run_id": run_id}).scalars())


def share_txn(conn: Connection, shas: Sequence[str]) -> None:
    """Before writing references to ``shas`` outside the hot statements: hold their locks
    shared to commit (waits for a deletion in progress, which then has committed)."""
    if shas:
        conn.execute(_SHARE, {"lock": ARTIFACT_LOCK, "shas": sorted(set(shas))})


def release_txn(conn: Connection, shas: Sequence[str]) -> Freed:
    """Delete those of ``shas`` nothing references, in the caller's transaction: each one
    whose lock is free, checked after the lock (a writer holding it keeps its artifact)."""
    if not shas:
        return Freed()
    locked = list(conn.execute(_LOCK, {"lock": ARTIFACT_LOCK,
                                       "shas": sorted(set(shas))}).scalars())
    if not locked:
        return Freed()
    gone = conn.execute(_RELEASE, {"shas": locked}).all()
    return Freed(len(gone), sum(int(r.size) for r in gone), sorted(r.sha256 for r in gone))


def _page(conn: Connection, after: str | None, limit: int) -> tuple[list[tuple[str, int]],
                                                                    str | None]:
    """One page of artifacts by sha256: those nothing references now, with their sizes, and
    the sha the next page starts after."""
    rows = conn.execute(_UNREFERENCED, {"after": after, "limit": limit}).all()
    free = [(r.sha256, int(r.size)) for r in rows if r.free]
    return free, (rows[-1].sha256 if len(rows) == limit else None)


def freed_by_txn(conn: Connection, states_runs: Sequence[UUID],
                 evidence_runs: Sequence[UUID]) -> Freed:
    """A dry run: the artifacts nothing would reference once ``states_runs``' states and
    ``evidence_runs``' evidence are compacted, those already unreferenced included (none
    for a role that may not delete them); one statement, whatever the number of runs."""
    if not may_delete_txn(conn):
        return Freed()
    row = conn.execute(_FREED_BY, {"states_runs": list(states_runs),
                                   "evidence_runs": list(evidence_runs)}).one()
    return Freed(int(row.artifacts), int(row.bytes))


def free_txn(conn: Connection, after: str | None, limit: int) -> tuple[Freed, str | None]:
    """Delete one page's unreferenced artifacts; what went, and where the next page starts."""
    free, after = _page(conn, after, limit)
    return release_txn(conn, [sha for sha, _ in free]), after


def sweep(engine: Engine, keys: CheckpointKeys, actor: Actor, *, batch: int = 500) -> Freed:
    """Delete every artifact nothing references, ``batch`` read per transaction, each
    transaction that deleted any with one audit row (by ``actor``: artifacts are shared
    between tenants, so the row is in the sweeping actor's). Resumable: each page commits
    on its own, and a stop leaves only unreferenced artifacts for the next sweep. Nothing
    for a role that may not delete them (``may_delete_txn``)."""
    done, after = Freed(), None
    with wrap_driver_errors("deleting unreferenced artifacts"), engine.connect() as conn:
        if not may_delete_txn(conn):
            return done
    while True:
        with wrap_driver_errors("deleting unreferenced artifacts"), engine.begin() as conn:
            freed, after = free_txn(conn, after, batch)
            if freed.artifacts:
                record_txn(conn, keys, actor, AuditRecord(
                    AuditAction.RETENTION, AuditOutcome.DONE, "unreferenced artifacts",
                    details={"artifacts": freed.artifacts, "bytes": freed.bytes,
                             "sha256": freed.shas[:20]}))
        done.add(freed)
        if after is None:
            return done
