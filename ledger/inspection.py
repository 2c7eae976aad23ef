"""Operator reads: runs by filter and page, a run's checkpoints and lineage, effects across
runs. Nothing here writes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.clock import TimeOrSpan, at_or_ago
from ledger.effects import Effect
from ledger.exceptions import InvalidInput, UnknownApproval, UnknownEffect, UnknownRun
from ledger.runs import Run, TimelineEntry
from ledger.schema import approvals, checkpoints, effects, evidence, runs, step_attempts
from ledger.states import checkpoint_row_txn
from ledger.vocabulary import EffectStatus, RunStatus

__all__ = [
    "ATTENTION",
    "CheckpointSummary",
    "CheckpointView",
    "ModelCall",
    "RunFilter",
    "TimelinePage",
    "attention_counts_txn",
    "checkpoint_summaries_txn",
    "find_effect_txn",
    "get_checkpoint_txn",
    "id_range",
    "list_effects_txn",
    "list_runs_txn",
    "model_calls_txn",
    "resolve_approval_txn",
    "resolve_run_txn",
    "timeline_page_txn",
]


@dataclass(frozen=True)
class RunFilter:
    """What ``onward runs ls`` filters on; None means any."""

    status: RunStatus | None = None
    workflow: str | None = None
    workflow_version: int | None = None
    tenant_id: str | None = None
    id_prefix: str | None = None  # hex digits a run id starts with
    until: datetime | None = None
    conversation_id: str | None = None
    idempotency_key: str | None = None
    since: TimeOrSpan | None = None  # a span counts back from the database's now
    parent_run_id: UUID | None = None
    before: UUID | None = None  # cursor: runs created before this one (uuid7 sorts by time)


def list_runs_txn(conn: Connection, where: RunFilter, *, limit: int = 50,
                  offset: int = 0) -> list[Run]:
    """Runs, newest first (run ids are uuid7, so id order is creation order)."""
    query = sa.select(runs).order_by(runs.c.id.desc()).limit(limit).offset(offset)
    if where.status is not None:
        query = query.where(runs.c.status == where.status.value)
    if where.workflow is not None:
        query = query.where(runs.c.workflow == where.workflow)
    if where.conversation_id is not None:
        query = query.where(runs.c.conversation_id == where.conversation_id)
    if where.idempotency_key is not None:
        query = query.where(runs.c.idempotency_key == where.idempotency_key)
    if where.since is not None:
        query = query.where(runs.c.created_at >= at_or_ago(where.since))
    if where.until is not None:
        query = query.where(runs.c.created_at < where.until)
    if where.tenant_id is not None:
        query = query.where(runs.c.tenant_id == where.tenant_id)
    if where.workflow_version is not None:
        query = query.where(runs.c.workflow_version == where.workflow_version)
    if where.id_prefix is not None:
        low, high = id_range(where.id_prefix)
        query = query.where(runs.c.id.between(low, high))
    if where.parent_run_id is not None:
        query = query.where(runs.c.parent_run_id == where.parent_run_id)
    if where.before is not None:
        query = query.where(runs.c.id < where.before)
    return [Run.from_row(row) for row in conn.execute(query).mappings()]


def id_range(prefix: str, noun: str = "run") -> tuple[UUID, UUID]:
    """The first and last uuid starting with ``prefix`` (hex digits, dashes ignored): a
    prefix search that the primary key's index answers."""
    digits = prefix.strip().lower().replace("-", "")
    if not re.fullmatch(r"[0-9a-f]{1,32}", digits):
        raise InvalidInput(f"{prefix!r} is not {'an' if noun[0] in 'aeiou' else 'a'} {noun} "
                           "id or the start of one (hex digits)")
    return UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f"))


def resolve_run_txn(conn: Connection, text: str, tenant_id: str) -> UUID:
    """The one run of ``tenant_id`` whose id is ``text`` or starts with it (6+ hex digits)."""
    try:
        return _resolve_id(conn, runs, "run", text, tenant_id)
    except LookupError:
        raise UnknownRun(f"no run {text}") from None


def resolve_approval_txn(conn: Connection, text: str, tenant_id: str) -> UUID:
    """The one approval of ``tenant_id`` whose id is ``text`` or starts with it (6+ hex
    digits): what ``approvals ls`` prints is enough to name it, as for runs."""
    try:
        return _resolve_id(conn, approvals, "approval", text, tenant_id)
    except LookupError:
        raise UnknownApproval(f"no approval {text}") from None


def _resolve_id(conn: Connection, table: sa.Table, noun: str, text: str,
                tenant_id: str) -> UUID:
    """The one row id of ``table`` in ``tenant_id`` that is ``text`` or starts with it;
    LookupError when none does, InvalidInput (listing them) when several do."""
    if len(text.strip().replace("-", "")) < 6:
        raise InvalidInput(f"{noun} id {text!r}: give the id, or at least its first 6 digits")
    low, high = id_range(text, noun)
    found = list(conn.execute(
        sa.select(table.c.id).where(table.c.id.between(low, high),
                                    table.c.tenant_id == tenant_id)
        .order_by(table.c.id).limit(3)).scalars())
    if not found:
        raise LookupError(text)
    if len(found) > 1:
        raise InvalidInput(f"{noun} id prefix {text} is ambiguous ({', '.join(map(str, found))}"
                           f"{', …' if len(found) > 2 else ''}): give more of it")
    return UUID(str(found[0]))


ATTENTION = (RunStatus.NEEDS_REVIEW, RunStatus.WAITING, RunStatus.RUNNING, RunStatus.FAILED)


def attention_counts_txn(conn: Connection, tenant_id: str) -> dict[str, int]:
    """Runs per status that needs a person or is in flight (parked, waiting, running, failed)."""
    counts = dict.fromkeys((s.value for s in ATTENTION), 0)
    for status in ATTENTION:  # one index probe each, rather than a scan grouped by status
        counts[status.value] = conn.execute(
            sa.select(sa.func.count()).select_from(runs)
            .where(runs.c.tenant_id == tenant_id, runs.c.status == status.value)
        ).scalar_one()
    return counts


@dataclass(frozen=True)
class CheckpointView:
    """One checkpoint as an operator reads it."""

    seq: int
    step: str | None
    next_step: str | None
    outcome: str
    hash: str
    parent_hash: str | None
    workflow_version: int | None
    state: dict[str, Any] | None  # None: compacted (or its chain does not rebuild)
    control: dict[str, Any] | None
    created_at: datetime


def get_checkpoint_txn(conn: Connection, run_id: UUID, seq: int) -> CheckpointView | None:
    row = checkpoint_row_txn(conn, run_id, seq)
    if row is None:
        return None
    return CheckpointView(**{f: row[f] for f in CheckpointView.__dataclass_fields__})


def list_effects_txn(conn: Connection, *, run_id: UUID | None = None,
                     status: EffectStatus | None = None, effect_type: str | None = None,
                     limit: int = 50, offset: int = 0,
                     tenant_id: str | None = None) -> list[Effect]:
    query = (sa.select(effects).order_by(effects.c.created_at.desc(), effects.c.effect_id)
             .limit(limit).offset(offset))
    if tenant_id is not None:
        query = query.where(effects.c.tenant_id == tenant_id)
    if run_id is not None:
        query = query.where(effects.c.run_id == run_id)
    if status is not None:
        query = query.where(effects.c.status == status.value)
    if effect_type is not None:
        query = query.where(effects.c.effect_type == effect_type)
    return [Effect.from_row(dict(r)) for r in conn.execute(query).mappings()]


def find_effect_txn(conn: Connection, effect_id: str, effect_type: str | None = None, *,
                    tenant_id: str | None = None) -> Effect:
    """An effect by its id, or by a unique prefix of at least 8 characters."""
    if len(effect_id) < 8:
        raise InvalidInput("give at least 8 characters of the effect id")
    query = sa.select(effects).where(effects.c.effect_id.startswith(effect_id, autoescape=True))
    if tenant_id is not None:
        query = query.where(effects.c.tenant_id == tenant_id)
    if effect_type is not None:
        query = query.where(effects.c.effect_type == effect_type)
    found = [Effect.from_row(dict(r)) for r in conn.execute(query.limit(2)).mappings()]
    if not found:
        raise UnknownEffect(f"no effect {effect_id}")
    if len(found) > 1:
        raise InvalidInput(f"effect id prefix {effect_id} is ambiguous; give more of it")
    return found[0]


@dataclass(frozen=True)
class TimelinePage:
    """The newest step executions of a run, oldest first, and the cursor to older ones."""

    entries: list[TimelineEntry]
    older: int | None  # pass as ``before_epoch`` for the previous page; None: no more
    total: int


def timeline_page_txn(conn: Connection, run_id: UUID, *, limit: int = 200,
                      before_epoch: int | None = None) -> TimelinePage:
    """Up to ``limit`` executions before ``before_epoch``, from the primary key's index."""
    query = (sa.select(step_attempts).where(step_attempts.c.run_id == run_id)
             .order_by(step_attempts.c.lease_epoch.desc()).limit(limit + 1))
    if before_epoch is not None:
        query = query.where(step_attempts.c.lease_epoch < before_epoch)
    rows = list(conn.execute(query).mappings())
    more = len(rows) > limit
    rows = rows[:limit][::-1]
    total = conn.execute(sa.select(sa.func.count()).select_from(step_attempts)
                         .where(step_attempts.c.run_id == run_id)).scalar_one()
    entries = [TimelineEntry(**{f: row[f] for f in TimelineEntry.__dataclass_fields__})
               for row in rows]
    return TimelinePage(entries, rows[0]["lease_epoch"] if more and rows else None, total)


@dataclass(frozen=True)
class CheckpointSummary:
    seq: int
    step: str | None
    next_step: str | None
    outcome: str
    hash: str
    created_at: datetime


def checkpoint_summaries_txn(conn: Connection, run_id: UUID, *, limit: int = 200,
                             before_seq: int | None = None) -> list[CheckpointSummary]:
    """The newest ``limit`` checkpoints before ``before_seq`` (no state), oldest first."""
    query = (sa.select(checkpoints.c.seq, checkpoints.c.step, checkpoints.c.next_step,
                       checkpoints.c.outcome, checkpoints.c.hash, checkpoints.c.created_at)
             .where(checkpoints.c.run_id == run_id)
             .order_by(checkpoints.c.seq.desc()).limit(limit))
    if before_seq is not None:
        query = query.where(checkpoints.c.seq < before_seq)
    rows = conn.execute(query).mappings().all()
    return [CheckpointSummary(**dict(row)) for row in reversed(rows)]


@dataclass(frozen=True)
class ModelCall:
    """A recorded model call or read (evidence): what answered, at what cost."""

    seq: int
    step: str
    command_id: str
    kind: str
    source: str
    source_version: str | None
    request_hash: str
    response: Any  # None when the answer is kept as an artifact
    artifact_sha256: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: Any
    created_at: datetime


def model_calls_txn(conn: Connection, run_id: UUID, *, limit: int = 200) -> list[ModelCall]:
    query = (sa.select(*(evidence.c[f] for f in ModelCall.__dataclass_fields__))
             .where(evidence.c.run_id == run_id)
             .order_by(evidence.c.seq.desc(), evidence.c.created_at.desc()).limit(limit))
    return [ModelCall(**dict(row)) for row in reversed(conn.execute(query).mappings().all())]
