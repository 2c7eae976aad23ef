"""The audit log: who did what to which run, why, and whether it was refused.

Every operator command writes exactly one row. A command that changes something writes its
row inside the same transaction as the change (so there is no change without its row); a
refused command writes its row in a transaction of its own, after the refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger import signed
from ledger.checkpoints import CheckpointKeys
from ledger.clock import TimeOrSpan, at_or_ago
from ledger.exceptions import PermissionDenied
from ledger.schema import audit
from ledger.vocabulary import AuditAction, AuditOutcome, Role

__all__ = ["REQUIRED_ROLE", "Actor", "AuditEntry", "AuditRecord", "list_audit_txn", "record_txn"]


REQUIRED_ROLE: dict[AuditAction, Role] = {
    AuditAction.CONTINUE: Role.OPERATOR,
    AuditAction.REPLAY: Role.OPERATOR,
    AuditAction.BRANCH: Role.OPERATOR,
    AuditAction.CANCEL: Role.OPERATOR,
    AuditAction.APPROVE: Role.APPROVER,
    AuditAction.REJECT: Role.APPROVER,
    AuditAction.REPEAT_EFFECT: Role.ADMIN,
    AuditAction.RESOLVE_EFFECT: Role.ADMIN,
    AuditAction.INSPECT: Role.VIEWER,
    AuditAction.VERIFY: Role.VIEWER,
    AuditAction.START: Role.OPERATOR,
    AuditAction.SIGNAL: Role.OPERATOR,
    AuditAction.TOKEN_CREATE: Role.ADMIN,
    AuditAction.TOKEN_REVOKE: Role.ADMIN,
    AuditAction.CORPUS_ADD: Role.OPERATOR,
    AuditAction.CORPUS_REMOVE: Role.OPERATOR,
    AuditAction.CORPUS_EXPORT: Role.OPERATOR,
    AuditAction.CORPUS_IMPORT: Role.OPERATOR,
    AuditAction.ANCHOR: Role.ADMIN,
    AuditAction.RETENTION: Role.ADMIN,
    AuditAction.HOLD: Role.ADMIN,
    AuditAction.KEYS: Role.ADMIN,
    AuditAction.SEAL_AUDIT: Role.ADMIN,
    AuditAction.SHOW_SEALED: Role.APPROVER,  # the roles shown sealed values (not a viewer)
}


@dataclass(frozen=True)
class Actor:
    """The person (or service) behind a command: who, in which role, for which tenant, with
    which approver roles (matched against the ``role:<name>`` entries an approval names),
    and the token they presented (None for a local admin, who needs none)."""

    name: str
    role: Role
    tenant_id: str
    approver_roles: tuple[str, ...] = ()
    token_id: UUID | None = None

    def may(self, action: AuditAction) -> bool:
        return self.role.allows(REQUIRED_ROLE[action])

    def require(self, action: AuditAction) -> None:
        """Raise PermissionDenied unless this actor's role allows ``action``."""
        needed = REQUIRED_ROLE[action]
        if not self.role.allows(needed):
            raise PermissionDenied(
                f"{action.value} needs the {needed.value} role; {self.name} acts as "
                f"{self.role.value} (an admin can give you a token with that role: "
                f"onward tokens create {self.name} --role {needed.value})")


@dataclass(frozen=True)
class AuditEntry:
    """One row of ``onward.audit``."""

    id: int
    at: datetime
    tenant_id: str
    actor: str
    role: str
    action: str
    outcome: str
    reason: str | None
    run_id: UUID | None
    new_run_id: UUID | None
    effect_id: str | None
    approval_id: UUID | None
    before_seq: int | None
    after_seq: int | None
    details: dict[str, Any] | None
    token_id: UUID | None

    @classmethod
    def from_row(cls, row: Any) -> AuditEntry:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AuditRecord:
    """What one command did (or was refused), before it is written."""

    action: AuditAction
    outcome: AuditOutcome
    reason: str | None = None
    run_id: UUID | None = None
    new_run_id: UUID | None = None
    effect_id: str | None = None
    approval_id: UUID | None = None
    before_seq: int | None = None
    after_seq: int | None = None
    details: dict[str, Any] | None = None


def record_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, record: AuditRecord) -> int:
    """Append one audit row, signed (ledger/signed.py ``audit_row``), inside the caller's
    transaction; returns its id. The reaper later seals it into its tenant's chain."""
    values = {
        "tenant_id": actor.tenant_id, "actor": actor.name, "role": actor.role.value,
        "action": record.action.value, "outcome": record.outcome.value, "reason": record.reason,
        "run_id": record.run_id, "new_run_id": record.new_run_id, "effect_id": record.effect_id,
        "approval_id": record.approval_id, "before_seq": record.before_seq,
        "after_seq": record.after_seq, "details": record.details, "token_id": actor.token_id,
    }
    return int(conn.execute(
        audit.insert().values(**values, mac=keys.sign(signed.audit_row(values)))
        .returning(audit.c.id)
    ).scalar_one())


def list_audit_txn(conn: Connection, *, tenant_id: str | None = None,
                   run_id: UUID | None = None, action: str | None = None,
                   actor: str | None = None, outcome: str | None = None,
                   since: TimeOrSpan | None = None, limit: int = 50,
                   offset: int = 0, before: int | None = None) -> list[AuditEntry]:
    """Audit rows, newest first; ``run_id`` matches the run acted on or the run it created;
    ``before`` is a cursor (rows with a smaller id)."""
    query = sa.select(audit).order_by(audit.c.id.desc()).limit(limit).offset(offset)
    if tenant_id is not None:
        query = query.where(audit.c.tenant_id == tenant_id)
    if before is not None:
        query = query.where(audit.c.id < before)
    if run_id is not None:
        query = query.where(sa.or_(audit.c.run_id == run_id, audit.c.new_run_id == run_id))
    if action is not None:
        query = query.where(audit.c.action == action)
    if actor is not None:
        query = query.where(audit.c.actor == actor)
    if outcome is not None:
        query = query.where(audit.c.outcome == outcome)
    if since is not None:
        query = query.where(audit.c.at >= at_or_ago(since))
    return [AuditEntry.from_row(r) for r in conn.execute(query).mappings()]
