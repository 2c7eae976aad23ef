"""Corpora: named sets of recorded runs, pinned as a regression suite (docs/corpus.md).

A corpus belongs to a tenant. Pinning a run records it in ``corpus_runs``: retention (when
onward has it) must skip every run listed there, and the table's foreign key refuses to
delete a run while it is pinned. Only runs that stopped and made their own calls are
pinned: a run still running or waiting would change after it was pinned, and a replay or
branch is an investigation of another run, not a recording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from ledger import compacted
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.clock import TimeOrSpan, at_or_ago
from ledger.exceptions import InvalidInput, OperationRefused, UnknownCorpus
from ledger.retention import keep_shared_txn
from ledger.schema import checkpoints, corpora, corpus_runs, evidence, runs
from ledger.vocabulary import AuditAction, AuditOutcome, LaunchMode, RunStatus

__all__ = [
    "PINNABLE",
    "CorpusSummary",
    "Pinned",
    "PinnedRun",
    "Selection",
    "check_name",
    "get_corpus_txn",
    "list_corpora_txn",
    "pin_ids_txn",
    "pin_txn",
    "pinned_runs_txn",
    "pinned_txn",
    "remove_txn",
]


PINNABLE = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
"""Runs that stopped for good: what a corpus pins."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise InvalidInput(f"corpus name {name!r}: 1-100 letters, digits, '_', '.', ':' or "
                           "'-', starting with a letter or digit")
    return name


@dataclass(frozen=True)
class Selection:
    """Which recorded runs ``corpus add`` pins; every given filter must hold."""

    workflow: str | None = None
    version: int | None = None
    statuses: tuple[RunStatus, ...] = ()  # empty: every status in PINNABLE
    since: TimeOrSpan | None = None  # a span counts back from the database's now
    until: datetime | None = None
    tenant_id: str | None = None  # must be the actor's own (checked)
    run_ids: tuple[UUID, ...] = ()
    limit: int | None = None  # the newest runs first

    def as_json(self) -> dict[str, Any]:
        """What the audit row and each pin record about how runs were chosen."""
        since = self.since
        return {
            "workflow": self.workflow, "version": self.version,
            "statuses": [s.value for s in self.statuses] or None,
            "since": since.isoformat() if isinstance(since, datetime)
            else (f"{since.total_seconds():.0f}s ago" if since is not None else None),
            "until": self.until.isoformat() if self.until else None,
            "tenant_id": self.tenant_id, "run_ids": [str(r) for r in self.run_ids] or None,
            "limit": self.limit,
        }


@dataclass(frozen=True)
class Pinned:
    corpus: str
    added: int
    already: int
    run_ids: list[UUID] = field(default_factory=list)


@dataclass(frozen=True)
class CorpusSummary:
    tenant_id: str
    name: str
    description: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    runs: int
    workflows: dict[str, int]


@dataclass(frozen=True)
class PinnedRun:
    run_id: UUID
    workflow: str
    workflow_version: int | None
    status: str
    seq: int
    created_at: datetime
    finished_at: datetime | None
    pinned_by: str
    pinned_at: datetime


def pin_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, name: str, selection: Selection,
            description: str | None = None) -> Pinned:
    """Create the corpus if needed and pin every run ``selection`` names (audited)."""
    actor.require(AuditAction.CORPUS_ADD)
    check_name(name)
    if selection.tenant_id is not None and selection.tenant_id != actor.tenant_id:
        raise OperationRefused(f"{actor.name} operates tenant {actor.tenant_id!r}, not "
                               f"{selection.tenant_id!r}: use a token of that tenant")
    chosen = _chosen_txn(conn, actor.tenant_id, selection)
    if not chosen:
        raise OperationRefused("no run matches: a corpus pins runs that stopped (completed, "
                               "failed or cancelled) and made their own calls (not replays "
                               "or branches); nothing was pinned")
    added = pin_ids_txn(conn, actor, name, chosen, selection.as_json(), description)
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.CORPUS_ADD, AuditOutcome.DONE, description,
        details={"corpus": name, "selection": selection.as_json(), "added": len(added),
                 "already": len(chosen) - len(added)}))
    return Pinned(name, len(added), len(chosen) - len(added), list(added))


def pin_ids_txn(conn: Connection, actor: Actor, name: str, run_ids: list[UUID],
                selection: dict[str, Any], description: str | None = None) -> list[UUID]:
    """Create the corpus if needed and pin ``run_ids`` (already checked); returns the runs
    that were not pinned in it before."""
    keep_shared_txn(conn)  # ordered against a partition drop (ledger/retention.py)
    _upsert_corpus(conn, actor, name, description)
    added = conn.execute(
        pg_insert(corpus_runs).values([
            {"tenant_id": actor.tenant_id, "corpus": name, "run_id": run_id,
             "pinned_by": actor.name, "selection": selection} for run_id in run_ids
        ]).on_conflict_do_nothing().returning(corpus_runs.c.run_id)).scalars().all()
    _refuse_compacted(conn, run_ids)  # compacted while this pin waited for its row lock
    return [UUID(str(r)) for r in added]


def _compacted(run_id: Any) -> sa.ColumnElement[bool]:
    """Whether retention compacted the run's states or its evidence (ledger/retention.py)."""
    return sa.or_(
        sa.exists().where(checkpoints.c.run_id == run_id,
                          checkpoints.c.compacted_mac.is_not(None)),
        sa.exists().where(evidence.c.run_id == run_id, evidence.c.artifact_sha256.is_(None),
                          evidence.c.response.has_key(compacted.KEY)))


def _refuse_compacted(conn: Connection, run_ids: list[UUID] | tuple[UUID, ...]) -> None:
    """A run retention compacted keeps digests of its answers, not the answers: a corpus
    replay could not answer from it, so it is not pinned."""
    found = conn.execute(sa.select(runs.c.id).where(
        runs.c.id.in_(run_ids), _compacted(runs.c.id))).scalars().first()
    if found is not None:
        raise OperationRefused(f"run {found} was compacted by retention: its recorded answers "
                               "are digests now, so a corpus could not replay it")


def _chosen_txn(conn: Connection, tenant_id: str, selection: Selection) -> list[UUID]:
    if selection.run_ids:
        _check_explicit(conn, tenant_id, selection.run_ids)
        _refuse_compacted(conn, selection.run_ids)
    statuses = selection.statuses or PINNABLE
    refused = [s.value for s in statuses if s not in PINNABLE]
    if refused:
        raise InvalidInput(f"status {', '.join(refused)}: a corpus pins runs that stopped "
                           f"({', '.join(s.value for s in PINNABLE)})")
    query = (sa.select(runs.c.id).where(
        runs.c.tenant_id == tenant_id, runs.c.parent_run_id.is_(None),
        runs.c.status.in_([s.value for s in statuses]), ~_compacted(runs.c.id))
        .order_by(runs.c.id.desc()))
    if selection.workflow is not None:
        query = query.where(runs.c.workflow == selection.workflow)
    if selection.version is not None:
        query = query.where(runs.c.workflow_version == selection.version)
    if selection.since is not None:
        query = query.where(runs.c.created_at >= at_or_ago(selection.since))
    if selection.until is not None:
        query = query.where(runs.c.created_at < selection.until)
    if selection.run_ids:
        query = query.where(runs.c.id.in_(selection.run_ids))
    if selection.limit is not None:
        query = query.limit(selection.limit)
    return [UUID(str(r)) for r in conn.execute(query).scalars()]


def _check_explicit(conn: Connection, tenant_id: str, run_ids: tuple[UUID, ...]) -> None:
    """A run named by id that cannot be pinned is refused by name, not silently skipped."""
    found = {row.id: row for row in conn.execute(
        sa.select(runs.c.id, runs.c.status, runs.c.parent_run_id, runs.c.mode)
        .where(runs.c.tenant_id == tenant_id, runs.c.id.in_(run_ids)))}
    for run_id in run_ids:
        row = found.get(run_id)
        if row is None:
            raise OperationRefused(f"no run {run_id} in tenant {tenant_id!r}")
        if row.parent_run_id is not None:
            raise OperationRefused(
                f"run {run_id} is {LaunchMode(row.mode).child} of run {row.parent_run_id}: pin "
                "the recorded run instead (a corpus holds runs that made their own calls)")
        if RunStatus(row.status) not in PINNABLE:
            raise OperationRefused(
                f"run {run_id} is {row.status}: pin it once it stopped (completed, failed or "
                "cancelled), so the corpus records what it did")


def _upsert_corpus(conn: Connection, actor: Actor, name: str, description: str | None) -> None:
    insert = pg_insert(corpora).values(
        tenant_id=actor.tenant_id, name=name, description=description, created_by=actor.name)
    update: dict[str, Any] = {"updated_at": sa.func.onward.now()}
    if description is not None:
        update["description"] = description
    conn.execute(insert.on_conflict_do_update(
        index_elements=[corpora.c.tenant_id, corpora.c.name], set_=update))


def list_corpora_txn(conn: Connection, tenant_id: str) -> list[CorpusSummary]:
    counts = conn.execute(
        sa.select(corpus_runs.c.corpus, runs.c.workflow, sa.func.count())
        .join(runs, runs.c.id == corpus_runs.c.run_id)
        .where(corpus_runs.c.tenant_id == tenant_id)
        .group_by(corpus_runs.c.corpus, runs.c.workflow)).all()
    by_corpus: dict[str, dict[str, int]] = {}
    for corpus, workflow, count in counts:
        by_corpus.setdefault(corpus, {})[workflow] = int(count)
    rows = conn.execute(sa.select(corpora).where(corpora.c.tenant_id == tenant_id)
                        .order_by(corpora.c.name)).mappings().all()
    return [CorpusSummary(
        row["tenant_id"], row["name"], row["description"], row["created_by"],
        row["created_at"], row["updated_at"], sum(by_corpus.get(row["name"], {}).values()),
        dict(sorted(by_corpus.get(row["name"], {}).items()))) for row in rows]


def get_corpus_txn(conn: Connection, tenant_id: str, name: str) -> CorpusSummary:
    for found in list_corpora_txn(conn, tenant_id):
        if found.name == name:
            return found
    raise UnknownCorpus(f"no corpus {name!r} in tenant {tenant_id!r} (onward corpus ls)")


def pinned_runs_txn(conn: Connection, tenant_id: str, name: str) -> list[PinnedRun]:
    """The corpus's runs, oldest first (the order a replay reports them in)."""
    get_corpus_txn(conn, tenant_id, name)
    rows = conn.execute(
        sa.select(runs.c.id, runs.c.workflow, runs.c.workflow_version, runs.c.status,
                  runs.c.seq, runs.c.created_at, runs.c.finished_at,
                  corpus_runs.c.pinned_by, corpus_runs.c.pinned_at)
        .join(runs, runs.c.id == corpus_runs.c.run_id)
        .where(corpus_runs.c.tenant_id == tenant_id, corpus_runs.c.corpus == name)
        .order_by(runs.c.id)).all()
    return [PinnedRun(UUID(str(r.id)), r.workflow, r.workflow_version, r.status, r.seq,
                      r.created_at, r.finished_at, r.pinned_by, r.pinned_at) for r in rows]


def remove_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, name: str,
               run_ids: tuple[UUID, ...], reason: str | None) -> int:
    """Unpin ``run_ids`` from the corpus, or delete the whole corpus when none are given;
    returns how many pins went (audited)."""
    actor.require(AuditAction.CORPUS_REMOVE)
    get_corpus_txn(conn, actor.tenant_id, name)
    where = [corpus_runs.c.tenant_id == actor.tenant_id, corpus_runs.c.corpus == name]
    if run_ids:
        where.append(corpus_runs.c.run_id.in_(run_ids))
    removed = conn.execute(corpus_runs.delete().where(*where)).rowcount
    if not run_ids:
        conn.execute(corpora.delete().where(corpora.c.tenant_id == actor.tenant_id,
                                            corpora.c.name == name))
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.CORPUS_REMOVE, AuditOutcome.DONE, reason,
        details={"corpus": name, "run_ids": [str(r) for r in run_ids] or "all",
                 "unpinned": removed}))
    return int(removed)


def pinned_txn(conn: Connection, run_ids: list[UUID]) -> set[UUID]:
    """Which of ``run_ids`` some corpus pins: what retention must keep."""
    if not run_ids:
        return set()
    return {UUID(str(r)) for r in conn.execute(
        sa.select(corpus_runs.c.run_id).where(corpus_runs.c.run_id.in_(run_ids)).distinct())
        .scalars()}
