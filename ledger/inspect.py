"""Operator reads: runs by filter and page, a run's checkpoints and lineage, effects across
runs. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.effects import Effect
from ledger.exceptions import InvalidInput
from ledger.operations import UnknownEffect
from ledger.runs import Run
from ledger.schema import EffectStatus, RunStatus, checkpoints, effects, runs


@dataclass(frozen=True)
class RunFilter:
    """What ``onward runs ls`` filters on; None means any."""

    status: RunStatus | None = None
    workflow: str | None = None
    conversation_id: str | None = None
    idempotency_key: str | None = None
    since: datetime | None = None
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
        query = query.where(runs.c.created_at >= where.since)
    if where.parent_run_id is not None:
        query = query.where(runs.c.parent_run_id == where.parent_run_id)
    if where.before is not None:
        query = query.where(runs.c.id < where.before)
    return [Run.from_row(row) for row in conn.execute(query).mappings()]


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
    state: dict[str, Any]
    control: dict[str, Any] | None
    created_at: datetime


def get_checkpoint_txn(conn: Connection, run_id: UUID, seq: int) -> CheckpointView | None:
    row = conn.execute(sa.select(checkpoints).where(
        checkpoints.c.run_id == run_id, checkpoints.c.seq == seq)).mappings().first()
    if row is None:
        return None
    return CheckpointView(**{f: row[f] for f in CheckpointView.__dataclass_fields__})


def list_effects_txn(conn: Connection, *, run_id: UUID | None = None,
                     status: EffectStatus | None = None, effect_type: str | None = None,
                     limit: int = 50, offset: int = 0) -> list[Effect]:
    query = (sa.select(effects).order_by(effects.c.created_at.desc(), effects.c.effect_id)
             .limit(limit).offset(offset))
    if run_id is not None:
        query = query.where(effects.c.run_id == run_id)
    if status is not None:
        query = query.where(effects.c.status == status.value)
    if effect_type is not None:
        query = query.where(effects.c.effect_type == effect_type)
    return [Effect.from_row(dict(r)) for r in conn.execute(query).mappings()]


def find_effect_txn(conn: Connection, effect_id: str, effect_type: str | None = None) -> Effect:
    """An effect by its id, or by a unique prefix of at least 8 characters."""
    if len(effect_id) < 8:
        raise InvalidInput("give at least 8 characters of the effect id")
    query = sa.select(effects).where(effects.c.effect_id.startswith(effect_id, autoescape=True))
    if effect_type is not None:
        query = query.where(effects.c.effect_type == effect_type)
    found = [Effect.from_row(dict(r)) for r in conn.execute(query.limit(2)).mappings()]
    if not found:
        raise UnknownEffect(f"no effect {effect_id}")
    if len(found) > 1:
        raise InvalidInput(f"effect id prefix {effect_id} is ambiguous; give more of it")
    return found[0]
