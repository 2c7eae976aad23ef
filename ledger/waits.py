"""Durable waits: approvals, signals, timers and deadlines (docs/design.md section 6).

A waiting run holds no lease and has no broker message. Deciding an approval or sending a
signal is one transaction that records the event and, only then, writes the outbox row that
resumes the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection

from ledger import compacted, signed, sql
from ledger.checkpoints import CheckpointKeys, canonical_json, sha256_hex
from ledger.crypto import Place, approval_field, is_sealed, open_value, seal_value, signal_field
from ledger.exceptions import (
    ApprovalRefused,
    IntegrityViolation,
    InvalidInput,
    MalformedControl,
    UnknownApproval,
    UnknownRun,
)
from ledger.hot import HotConnection
from ledger.schema import approvals, checkpoints, outbox, runs, signals
from ledger.vocabulary import ApprovalStatus, FailReason, ParkReason, RunStatus
from ledger.wait_control import ApprovalControl, parse_control

__all__ = [
    "UNVERIFIED_COMMENT",
    "WAKE_ON_SIGNAL",
    "Approval",
    "WaitStore",
    "WaitSweep",
    "check_decision",
    "check_signal",
    "check_terms",
    "close_unsent",
    "get_approval_txn",
    "list_approvals_txn",
    "may_decide",
    "opened_signal",
    "park_unknown",
    "record_decision_txn",
    "shown_comment",
    "signal_txn",
    "sweep_waits_txn",
    "unknown_effect",
]


@dataclass(frozen=True)
class Approval:
    id: UUID
    run_id: UUID
    seq: int
    workflow_version: int
    step: str
    action: str
    artifact_hash: str
    artifact: Any
    approvers: list[str]
    expires_at: datetime
    status: ApprovalStatus
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None
    created_at: datetime
    tenant_id: str | None = None  # binds a sealed artifact (ledger/crypto.py)
    # signs the decision and its comment (ledger/signed.py approval_decision); not shown
    decision_mac: str | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: Any) -> Approval:
        fields = {name: row.get(name) if name in _OPTIONAL else row[name]
                  for name in cls.__dataclass_fields__}
        fields["status"] = ApprovalStatus(row["status"])
        return cls(**fields)


_OPTIONAL = ("tenant_id", "decision_mac")
UNVERIFIED_COMMENT = "[not verified: this decision does not match its MAC, edited outside onward]"
"""What a comment shown to people starts with when its decision does not verify."""

WAKE_ON_SIGNAL = sql.statement("wake_on_signal")
_QUEUE_STEP = sql.statement("queue_step")
_READ_APPROVAL = sql.statement("read_approval")
_READ_APPROVAL_FOR_STEP = sql.statement("read_approval_for_step")
_SIGNAL_PAYLOAD = sql.statement("signal_payload")


def _lock_run(conn: Connection, run_id: UUID) -> Any:
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update()).mappings()
    found = row.first()
    if found is None:
        raise UnknownRun(f"no run {run_id}")
    return found


def _approval_control(conn: Connection, run_id: UUID, seq: int) -> ApprovalControl:
    """The approval wait checkpoint ``seq`` records; MalformedControl for anything else."""
    value = conn.execute(
        sa.select(checkpoints.c.control)
        .where(checkpoints.c.run_id == run_id, checkpoints.c.seq == seq)
    ).scalar()
    where = f"checkpoint {seq} of run {run_id}"
    control = parse_control(value, where)
    if not isinstance(control, ApprovalControl):
        raise MalformedControl(f"{where} does not record an approval wait "
                               f"(kind {control.kind if control else None!r}): nothing decided")
    return control


def _resume(conn: Connection, run_id: UUID, seq: int, step: str) -> None:
    conn.execute(
        runs.update().where(runs.c.id == run_id)
        .values(status=RunStatus.RUNNING.value, step=step, waiting_on=None, wait_until=None,
                updated_at=sa.func.onward.now())
    )
    conn.exec_driver_sql(_QUEUE_STEP, {"run_id": run_id, "seq": seq})


_NEXT_SIGNAL_ID = sql.text("next_signal_id")
_UNKNOWN_EFFECT = sql.text("unknown_effect")
_CLOSE_UNSENT = sql.text("close_unsent")



def unknown_effect(conn: Connection, run_id: UUID) -> str | None:
    """``"<type> <id>"`` of an effect of the run whose outcome at the provider is unknown."""
    row = conn.execute(_UNKNOWN_EFFECT, {"run_id": run_id}).first()
    return f"{row[0]} {row[1]}" if row else None


def close_unsent(conn: Connection, run_id: UUID, closed_by: str) -> None:
    """Close the run's effects known never to have reached the provider (``unsent``)."""
    conn.execute(_CLOSE_UNSENT, {"run_id": run_id, "closed_by": closed_by})


def park_unknown(conn: Connection, run_id: UUID, effect: str, why: str) -> None:
    """A run that was to end has an effect whose outcome is unknown: a person decides."""
    conn.execute(
        runs.update().where(runs.c.id == run_id)
        .values(status=RunStatus.NEEDS_REVIEW.value,
                parked_reason=ParkReason.EFFECT_OUTCOME_UNKNOWN.value,
                lease_owner=None, lease_expires_at=None, updated_at=sa.func.onward.now(),
                last_error={"type": "EffectOutcomeUnknown",
                            "reason": ParkReason.EFFECT_OUTCOME_UNKNOWN.value,
                            "message": f"{why}, but effect {effect} may have reached the "
                                       "provider: check it there before anything else"})
    )
    conn.execute(outbox.delete().where(outbox.c.run_id == run_id))


def _fail(conn: Connection, run_id: UUID, reason: FailReason, message: str,
          **extra: Any) -> None:
    """End the run ``failed`` with its never-sent effects closed, in the caller's
    transaction; a run with an effect of unknown outcome is parked instead."""
    unknown = unknown_effect(conn, run_id)
    if unknown is not None:
        park_unknown(conn, run_id, unknown, message)
        return
    conn.execute(
        runs.update().where(runs.c.id == run_id)
        .values(status=RunStatus.FAILED.value, waiting_on=None, wait_until=None,
                finished_at=sa.func.onward.now(), updated_at=sa.func.onward.now(),
                last_error={"type": reason, "reason": reason, "message": message, **extra})
    )
    close_unsent(conn, run_id, "run failed")
    # An approval of a run that ended is no longer anyone's to decide: off the inbox.
    conn.execute(
        approvals.update()
        .where(approvals.c.run_id == run_id,
               approvals.c.status == ApprovalStatus.PENDING.value)
        .values(status=ApprovalStatus.INVALIDATED.value, decided_at=sa.func.onward.now(),
                comment=f"run failed ({reason}): {message}"[:2000])
    )


def get_approval_txn(conn: Connection, approval_id: UUID, *, lock: bool = False) -> Approval:
    return Approval.from_row(_approval_row(conn, approval_id, lock=lock))


def _approval_row(conn: Connection, approval_id: UUID, *, lock: bool) -> sa.RowMapping:
    query = sa.select(approvals).where(approvals.c.id == approval_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).mappings().first()
    if row is None:
        raise UnknownApproval(f"no approval {approval_id}")
    return row


def check_terms(keys: CheckpointKeys, row: Mapping[Any, Any]) -> None:
    """Raise IntegrityViolation unless the approval's terms (run, action, artifact hash,
    approvers, created and expiry times) are the ones signed when it was asked for."""
    keys.check(signed.approval_terms(row), row["terms_mac"],
               f"approval {row['id']}'s terms (its artifact binding, who may decide it and "
               "until when)")


def list_approvals_txn(conn: Connection, *, status: ApprovalStatus | None = None,
                       run_id: UUID | None = None, limit: int = 100,
                       tenant_id: str | None = None,
                       before: tuple[datetime, UUID] | None = None,
                       decidable_by: tuple[str, tuple[str, ...]] | None = None,
                       ) -> list[Approval]:
    """Approvals, newest first; ``before`` is a (created_at, id) cursor; ``decidable_by``
    (a name and approver roles) keeps those naming nobody, the name or one of the roles."""
    query = (sa.select(approvals)
             .order_by(approvals.c.created_at.desc(), approvals.c.id.desc()).limit(limit))
    if tenant_id is not None:
        query = query.where(approvals.c.tenant_id == tenant_id)
    if before is not None:
        query = query.where(sa.tuple_(approvals.c.created_at, approvals.c.id) < before)
    if decidable_by is not None:
        name, roles = decidable_by
        query = query.where(sa.or_(
            approvals.c.approvers == sa.cast([], JSONB),
            approvals.c.approvers.op("?|")(sa.cast([name, *(f"role:{r}" for r in roles)],
                                                   ARRAY(sa.Text)))))
    if status is not None:
        query = query.where(approvals.c.status == status.value)
    if run_id is not None:
        query = query.where(approvals.c.run_id == run_id)
    return [Approval.from_row(r) for r in conn.execute(query).mappings()]


def may_decide(approval: Approval, name: str, roles: tuple[str, ...]) -> bool:
    """Whether ``name`` holding approver ``roles`` is among those the approval names (an
    approval that names nobody may be decided by anyone with the approve permission)."""
    allowed = approval.approvers
    return not allowed or name in allowed or any(f"role:{r}" in allowed for r in roles)


def _stored_artifact_hash(keys: CheckpointKeys, approval: Approval) -> str:
    """The sha256 of the artifact as stored: a sealed one opened (with the data key), or,
    where this process has no encryption keys, the hash it is bound to (its binding is
    then checked by whoever opens it: the approver was shown it opened)."""
    artifact = approval.artifact
    if is_sealed(artifact):
        if keys.crypt is None:
            return approval.artifact_hash
        artifact = keys.crypt.open(artifact, tenant=approval.tenant_id or "",
                                   run_id=approval.run_id, seq=approval.seq,
                                   field=approval_field(approval.id))
    try:
        return sha256_hex(canonical_json(artifact))
    except InvalidInput:
        return "not plain JSON"


def record_decision_txn(conn: Connection, keys: CheckpointKeys, approval_id: UUID, *,
                        approve: bool, actor: str, roles: tuple[str, ...], artifact_hash: str,
                        comment: str | None) -> Approval:
    """Check and record one decision, then resume (or end) the run, in the caller's txn.
    The approval's signed terms are checked first: approvers added or an expiry extended
    in the database refuse the decision."""
    row = _approval_row(conn, approval_id, lock=True)
    check_terms(keys, row)
    approval = Approval.from_row(row)
    verb = "approve" if approve else "reject"
    if approval.status is not ApprovalStatus.PENDING:
        raise ApprovalRefused(
            f"approval {approval_id} is already {approval.status.value}"
            + (f" by {approval.decided_by} at {approval.decided_at:%Y-%m-%d %H:%M:%S}"
               if approval.decided_by else "")
            + "; a decision is taken once")
    now = conn.execute(sa.select(sa.func.onward.now())).scalar_one()
    if now >= approval.expires_at:
        raise ApprovalRefused(f"approval {approval_id} expired at "
                              f"{approval.expires_at:%Y-%m-%d %H:%M:%S}; the run must ask again")
    allowed = approval.approvers
    if not may_decide(approval, actor, roles):
        raise ApprovalRefused(f"{actor} may not {verb} approval {approval_id}; allowed: "
                              f"{', '.join(allowed)}")
    stored = _stored_artifact_hash(keys, approval)
    if stored != approval.artifact_hash:
        raise IntegrityViolation(
            f"approval {approval_id}'s stored artifact hashes to {stored[:12]}…, but the run "
            f"asked about {approval.artifact_hash[:12]}…: it was edited outside onward, so "
            f"nobody may decide on it (`onward verify {approval.run_id}`)")
    if artifact_hash != approval.artifact_hash:
        raise ApprovalRefused(
            f"you reviewed artifact {artifact_hash[:12]}…, but approval {approval_id} is for "
            f"{approval.artifact_hash[:12]}…: the artifact changed, an edited artifact needs "
            "a new approval")
    run = _lock_run(conn, approval.run_id)
    if (run["status"] != RunStatus.WAITING.value or run["seq"] != approval.seq
            or run["waiting_on"] != f"approval:{approval_id}"):
        raise ApprovalRefused(f"run {approval.run_id} no longer waits for approval "
                              f"{approval_id} (it is {run['status']} at seq {run['seq']})")
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    conn.execute(
        approvals.update().where(approvals.c.id == approval_id)
        .values(status=status.value, decided_by=actor, decided_at=now, comment=comment)
    )
    control = _approval_control(conn, approval.run_id, approval.seq)
    if approve:
        _resume(conn, approval.run_id, approval.seq, control.then)
    elif control.on_reject:
        _resume(conn, approval.run_id, approval.seq, control.on_reject)
    else:
        _fail(conn, approval.run_id, FailReason.APPROVAL_REJECTED,
              f"{actor} rejected {approval.action}" + (f": {comment}" if comment else ""),
              decided_by=actor)
    return get_approval_txn(conn, approval_id)


def signal_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID, name: str, payload: Any,
               *, max_bytes: int, max_depth: int) -> bool:
    """Store a signal for the run; wake it if it waits for this name. Returns whether it woke.

    A signal sent before the run waits is kept and consumed when the wait begins. A payload
    that is not plain JSON, nests deeper than ``max_depth`` or is larger than ``max_bytes``
    (ONWARD_MAX_SIGNAL_BYTES) is refused before anything is written. The signal is signed
    (its id, run, name, payload): the step that reads it checks that, so an edit of its
    payload in the database, or a copy of the row, parks the run instead of being read.
    With encryption keys the payload is stored sealed (bound to the run's tenant, the run,
    its seq when sent and the signal's id); the MAC covers its digest (``opened_signal``).
    Its id is taken holding the signal id lock shared to the commit, so a corpus import
    never moves the id sequence past a bundle's ids under it (migration 0044).
    """
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > 200:
        raise InvalidInput(f"a signal needs a name: a string of 1 to 200 characters without "
                           f"NUL, got {name!r:.80}")
    try:
        body = canonical_json(payload, max_depth=max_depth)
    except InvalidInput as exc:
        raise InvalidInput(f"signal {name!r} payload: {exc}") from exc
    if len(body) > max_bytes:
        raise InvalidInput(f"signal {name!r} payload is {len(body)} bytes, over the limit of "
                           f"{max_bytes} (ONWARD_MAX_SIGNAL_BYTES); send a reference instead")
    run = _lock_run(conn, run_id)
    if RunStatus(run["status"]).terminal:
        raise ApprovalRefused(f"run {run_id} is {run['status']}; it takes no more signals")
    signal_id = conn.execute(_NEXT_SIGNAL_ID).scalar_one()  # one statement, as before
    stored = seal_value(keys.crypt, payload, Place(run["tenant_id"], run_id, run["seq"],
                                                   signal_field(signal_id)))
    conn.execute(signals.insert().values(
        id=signal_id, run_id=run_id, name=name, payload=stored,
        mac=keys.sign(signed.signal(signal_id, run_id, name, stored))))
    woke = conn.exec_driver_sql(WAKE_ON_SIGNAL, {"run_id": run_id, "seq": run["seq"]}).first()
    return woke is not None


class WaitStore:
    """What a resumed step reads of its wait, on the worker's autocommit connection: the
    approval it asked for and the signal that ended its wait (one statement each)."""

    def __init__(self, conn: HotConnection) -> None:
        self.conn = conn

    def approval(self, approval_id: str) -> dict[str, Any] | None:
        """The approval a resumed step reads its decision from (status, who, comment)."""
        return self.conn.one(_READ_APPROVAL, {"id": approval_id})

    def approval_for_step(self, approval_id: str, run_id: UUID, seq: int) -> dict[str, Any] | None:
        """The approval a resumed step acts on, with ``step_started_at``: when the first
        claim of that step at ``seq`` started (by the database's clock; a claim that handed
        the step back without running it does not count). The claim being checked has
        its own row already, so it is never NULL for a claimed step."""
        return self.conn.one(_READ_APPROVAL_FOR_STEP,
                             {"id": approval_id, "run_id": run_id, "seq": seq})

    def signal(self, run_id: UUID, name: str, seq: int) -> dict[str, Any] | None:
        """The signal ``name`` that ended the run's wait at ``seq`` (payload and MAC; None
        if none did): check it before using the payload (``check_signal``)."""
        return self.conn.one(_SIGNAL_PAYLOAD, {"run_id": run_id, "name": name, "seq": seq})

    def signal_payload(self, run_id: UUID, name: str, seq: int) -> Any:
        """The payload of the signal ``name`` that ended the run's wait at ``seq`` (None if
        none did), unchecked: a step uses ``signal`` and ``check_signal``."""
        row = self.signal(run_id, name, seq)
        return row["payload"] if row else None


def check_decision(keys: CheckpointKeys, row: Mapping[Any, Any]) -> None:
    """Raise IntegrityViolation unless the approval's terms verify and, if it was approved
    or rejected, the decision does too (what a resumed step or an evidence replay follows)."""
    check_terms(keys, row)
    if row["status"] in (ApprovalStatus.APPROVED.value, ApprovalStatus.REJECTED.value):
        keys.check(signed.approval_decision(row), row["decision_mac"],
                   f"the decision on approval {row['id']} ({row['status']} by "
                   f"{row['decided_by']})")


def shown_comment(keys: CheckpointKeys, approval: Approval) -> str | None:
    """The approval's comment as people are shown it: marked ``UNVERIFIED_COMMENT`` when
    the decision it belongs to (approved or rejected) does not verify, so a comment edited
    in the database is never shown as the approver's."""
    if approval.comment is None or approval.status not in (ApprovalStatus.APPROVED,
                                                           ApprovalStatus.REJECTED):
        return approval.comment
    try:
        keys.check(signed.approval_decision(vars(approval)), approval.decision_mac,
                   f"the decision on approval {approval.id}")
    except IntegrityViolation:
        return f"{UNVERIFIED_COMMENT} {approval.comment}"
    return approval.comment


def check_signal(keys: CheckpointKeys, row: Mapping[Any, Any]) -> None:
    """Raise IntegrityViolation unless the signal row is as it was sent (its id, run, name,
    payload): an edited payload and a copied row both fail; or its payload was compacted by
    retention under a seal that verifies."""
    if compacted.digest_of(row["payload"]) is not None and compacted.is_sealed(
            keys, "signal_payload", compacted.signal_identity(row), row["payload"]):
        return
    keys.check(signed.signal(row["id"], row["run_id"], row["name"], row["payload"]), row["mac"],
               f"signal {row['name']!r} to run {row['run_id']}")


def opened_signal(keys: CheckpointKeys, row: Mapping[Any, Any], tenant: str) -> Any:
    """The payload of a signal row (of a run of ``tenant``) opened when it is sealed: what a
    step reads with ``ctx.signal``, after ``check_signal``. Raises SealedValueUnreadable."""
    return open_value(keys.crypt, row["payload"], tenant=tenant, run_id=row["run_id"],
                      field=signal_field(row["id"]))


# -- the reaper's part --------------------------------------------------------------------------

_DUE_APPROVALS = sql.text("due_approvals")
_EXPIRE_APPROVALS = sql.text("expire_approvals")
_WAKE_SIGNALLED = sql.text("wake_signalled")
_SIGNAL_TIMEOUTS = sql.text("signal_timeouts")
_QUEUE_NOW = sql.text("queue_now")
_DEADLINES = sql.text("past_deadline")


@dataclass(frozen=True)
class WaitSweep:
    approvals_expired: int
    signal_timeouts: int
    deadlines: int
    signals_delivered: int = 0  # waiting runs woken by a signal stored before they waited


def _continue_or_fail(conn: Connection, row: Any, continuation: str, reason: FailReason,
                      message: Callable[[Any], str]) -> None:
    """A wait ended without its event: go to the step the workflow declared, or fail (with
    ``message(control)``). A control this code cannot read parks the run for review."""
    try:
        control = parse_control(row["control"], f"checkpoint {row['seq']} of run {row['run_id']}")
    except MalformedControl as exc:
        park_malformed(conn, row["run_id"], exc)
        return
    step = getattr(control, continuation, None)
    if step:
        _resume(conn, row["run_id"], row["seq"], step)
    else:
        _fail(conn, row["run_id"], reason, message(control))


def _expired_message(approval_id: Any) -> Callable[[Any], str]:
    return lambda control: f"approval {approval_id} expired before anyone decided"


def park_malformed(conn: Connection, run_id: UUID, exc: MalformedControl) -> None:
    """A run whose wait control this code cannot read: a person decides, nothing is guessed."""
    conn.execute(
        runs.update().where(runs.c.id == run_id)
        .values(status=RunStatus.NEEDS_REVIEW.value,
                parked_reason=ParkReason.INVALID_CONTROL.value,
                lease_owner=None, lease_expires_at=None, waiting_on=None, wait_until=None,
                updated_at=sa.func.onward.now(),
                last_error={"type": type(exc).__name__,
                            "reason": ParkReason.INVALID_CONTROL.value, "message": str(exc)})
    )
    conn.execute(outbox.delete().where(outbox.c.run_id == run_id))


def sweep_waits_txn(conn: Connection, limit: int = 500) -> WaitSweep:
    delivered = conn.execute(_WAKE_SIGNALLED, {"limit": limit}).rowcount
    due = list(conn.execute(_DUE_APPROVALS, {"limit": limit}).scalars())
    expired = (conn.execute(_EXPIRE_APPROVALS, {"ids": due}).mappings().all() if due else [])
    for row in expired:
        _continue_or_fail(conn, row, "on_expire", FailReason.APPROVAL_EXPIRED,
                          _expired_message(row["id"]))
    timeouts = conn.execute(_SIGNAL_TIMEOUTS, {"limit": limit}).mappings().all()
    for row in timeouts:
        _continue_or_fail(conn, row, "on_timeout", FailReason.SIGNAL_TIMEOUT,
                          lambda control: f"no signal {control.name!r} arrived before "
                                          f"{control.timeout_at}")
    late = conn.execute(_DEADLINES, {"limit": limit}).mappings().all()
    for row in late:
        _deadline(conn, row)
    return WaitSweep(len(expired), len(timeouts), len(late), delivered)


def _deadline(conn: Connection, row: Any) -> None:
    """Fail a run past its deadline. The reaper has no tool code: a running run with an
    effect of unknown outcome is queued now instead, so that a worker's recheck reconciles
    the effect (lookup, status) and then fails the run, or parks it."""
    message = (f"the run's deadline {row['deadline_at']:%Y-%m-%d %H:%M:%S} passed while it "
               f"was {row['status']}")
    if row["status"] == RunStatus.RUNNING.value and unknown_effect(conn, row["run_id"]):
        conn.execute(_QUEUE_NOW, {"run_id": row["run_id"]})
        return
    _fail(conn, row["run_id"], FailReason.DEADLINE_EXCEEDED, message,
          spent={"attempts": row["attempts_total"], "tokens": row["used_tokens"],
                 "cost_usd": float(row["used_cost_usd"])})

