"""Starting runs and reading them back."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection, RowMapping
from uuid6 import uuid7

from ledger import db, signed, sql, tracing
from ledger.checkpoints import (
    ENVELOPE_VERSION,
    SEALED_KEY,
    CheckpointBody,
    CheckpointKeys,
    canonical_json,
    covered_json,
    sealed_envelope,
)
from ledger.crypto import (
    ERROR_FIELD,
    REQUEST_FIELD,
    RESULT_FIELD,
    Keyring,
    Place,
    is_sealed,
    shown_value,
)
from ledger.exceptions import IdempotencyConflict, InvalidInput
from ledger.schema import runs, step_attempts
from ledger.vocabulary import OutcomeKind, Priority, RunStatus

__all__ = [
    "EXISTING_RUN",
    "START_RUN",
    "Budgets",
    "Run",
    "StartRequest",
    "TimelineEntry",
    "driver_connection",
    "existing_run",
    "get_run",
    "input_sealed",
    "list_runs",
    "shown_run",
    "start_params",
    "start_run_txn",
    "started_id",
    "timeline",
    "validate_input",
    "validate_request",
]


@dataclass(frozen=True)
class Run:
    """One row of ``onward.runs``."""

    id: UUID
    tenant_id: str
    workflow: str
    workflow_version: int | None
    conversation_id: str | None
    idempotency_key: str | None
    status: RunStatus
    seq: int
    step: str | None
    attempt: int
    max_attempts: int
    attempts_total: int
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: datetime | None
    restore_count: int
    stale_deliveries: int
    handbacks: int
    last_error: dict[str, Any] | None
    parked_reason: str | None
    result: dict[str, Any] | None
    waiting_on: str | None
    wait_until: datetime | None
    budget_attempts: int | None
    budget_tokens: int | None
    budget_cost_usd: Decimal | None
    deadline_at: datetime | None
    used_tokens: int
    used_cost_usd: Decimal
    state_schema_version: int | None
    parent_run_id: UUID | None
    parent_seq: int | None
    launch_reason: str | None
    mode: str | None
    allow_irreversible: bool
    branch_patch: list[dict[str, Any]] | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    priority: Priority = Priority.NORMAL

    @classmethod
    def from_row(cls, row: RowMapping) -> Run:
        fields = {name: row[name] for name in cls.__dataclass_fields__ if name in row}
        fields["status"] = RunStatus(row["status"])
        if "priority" in fields:
            fields["priority"] = Priority(fields["priority"])
        return cls(**fields)


def shown_run(crypt: Keyring | None, run: Run, *, may_see: bool) -> Run:
    """``run`` with its sealed finish result and error message opened for a reader who
    ``may_see`` them, else masked (``ledger.crypto.shown_value``); plain ones as they are."""
    error = run.last_error
    sealed_error = _sealed_error(error)
    if not (is_sealed(run.result) or sealed_error):
        return run
    def shown(value: Any, field: str) -> Any:
        return shown_value(crypt, value, may_see=may_see, tenant=run.tenant_id, run_id=run.id,
                           field=field, seq=run.seq)

    def shown_error(error: dict[str, Any]) -> dict[str, Any]:
        """The error's message shown, and its ``previous`` one's (the reaper's park after
        spent attempts keeps the step's error there, as it was stored)."""
        out = {**error, "message": shown(error.get("message"), ERROR_FIELD)}
        if "request" in error:  # a diverged replay's report
            out["request"] = shown(error["request"], REQUEST_FIELD)
        if _sealed_error(error.get("previous")):
            out["previous"] = shown_error(error["previous"])
        return out

    if sealed_error:
        assert isinstance(error, dict)
        error = shown_error(error)
    return replace(run, result=shown(run.result, RESULT_FIELD), last_error=error)


def _sealed_error(error: Any) -> bool:
    """Whether a stored error (or the one it keeps as ``previous``) has a sealed message."""
    return isinstance(error, dict) and (is_sealed(error.get("message"))
                                        or is_sealed(error.get("request"))
                                        or _sealed_error(error.get("previous")))


@dataclass(frozen=True)
class Budgets:
    """Limits of one run, debited as they are spent (model and read spend when the answer is
    recorded, attempts at each claim) and never refilled by a restore.

    ``None`` leaves the workflow's default (and, without one, no limit)."""

    attempts: int | None = None  # step executions in total, crashes included
    tokens: int | None = None  # model tokens, input and output
    cost_usd: float | None = None
    deadline: timedelta | None = None  # wall clock from the start of the run


@dataclass(frozen=True)
class StartRequest:
    workflow: str
    input: dict[str, Any]
    tenant_id: str
    conversation_id: str | None
    idempotency_key: str | None
    max_attempts: int
    budgets: Budgets = Budgets()
    priority: Priority = Priority.NORMAL


def validate_input(value: Any, max_bytes: int, max_depth: int | None = None) -> bytes:
    if not isinstance(value, dict):
        raise InvalidInput(f"run input must be a JSON object, got {type(value).__name__}")
    try:
        encoded = canonical_json(value, max_depth=max_depth)
    except InvalidInput as exc:
        raise InvalidInput(f"run input: {exc}") from exc
    if len(encoded) > max_bytes:
        raise InvalidInput(
            f"run input is {len(encoded)} bytes, over the limit of {max_bytes} "
            "(ONWARD_MAX_STATE_BYTES); store large documents as artifacts and pass references"
        )
    return encoded


_MAX_NAME = 500
_MAX_INT = 2**31 - 1  # the columns are PostgreSQL integers
_MAX_COST = Decimal("999999")  # numeric(12, 6)


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be a non-empty name (a string), got {value!r:.80}")
    if "\x00" in value:
        raise InvalidInput(f"{what} holds a NUL character, which PostgreSQL cannot store")
    if len(value) > _MAX_NAME:
        raise InvalidInput(f"{what} is {len(value)} characters long, over {_MAX_NAME}")


def _check_count(value: Any, what: str, minimum: int) -> None:
    if type(value) is not int or not minimum <= value <= _MAX_INT:
        raise InvalidInput(f"{what} must be a whole number from {minimum} to {_MAX_INT}, "
                           f"got {value!r:.80}")


def _check_cost(cost: Any) -> None:
    amount = (Decimal(str(cost)) if isinstance(cost, int | float | Decimal)
              and not isinstance(cost, bool) else None)
    if amount is None or not amount.is_finite() or not Decimal(0) <= amount <= _MAX_COST:
        raise InvalidInput(f"budgets.cost_usd must be a number from 0 to {_MAX_COST}, "
                           f"got {cost!r:.80}")


def validate_request(request: StartRequest) -> None:
    """Refuse, with what to fix, a start the ledger could not store or could never run."""
    _check_text(request.workflow, "workflow")
    _check_text(request.tenant_id, "tenant_id")
    for value, what in ((request.conversation_id, "conversation_id"),
                        (request.idempotency_key, "idempotency_key")):
        if value is not None:
            _check_text(value, what)
    _check_count(request.max_attempts, "max_attempts", 1)
    if request.priority not in tuple(Priority):
        raise InvalidInput(f"priority must be one of {[p.value for p in Priority]}, "
                           f"got {request.priority!r:.80}")
    budgets = request.budgets
    if budgets.attempts is not None:
        _check_count(budgets.attempts, "budgets.attempts", 1)
    if budgets.tokens is not None:
        _check_count(budgets.tokens, "budgets.tokens", 0)
    if budgets.cost_usd is not None:
        _check_cost(budgets.cost_usd)
    deadline = budgets.deadline
    if deadline is not None and (not isinstance(deadline, timedelta)
                                 or deadline <= timedelta(0)):
        raise InvalidInput(f"budgets.deadline must be a positive timedelta, got {deadline!r:.80}")


START_RUN = sql.statement("start_run")

EXISTING_RUN = sql.statement("existing_run")


def driver_connection(conn: Connection | psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn`` (a SQLAlchemy one, or psycopg's own): the
    statements run in the caller's transaction either way."""
    if isinstance(conn, psycopg.Connection):
        return conn
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidInput("start_run_txn needs a psycopg 3 connection (SQLAlchemy's "
                           "postgresql+psycopg driver, or psycopg.connect())")
    return raw


def start_run_txn(conn: Connection | psycopg.Connection[Any], keys: CheckpointKeys,
                  request: StartRequest, sensitive: frozenset[str] = frozenset()) -> UUID:
    """Insert the run, checkpoint 0 and its outbox row inside the caller's transaction, in
    one statement, on a SQLAlchemy connection or a psycopg one.

    With an idempotency key already used by this tenant, returns that run instead (and
    refuses if it was started for another workflow or input).
    """
    raw = driver_connection(conn)
    try:
        inserted = raw.cursor(row_factory=tuple_row).execute(
            START_RUN, start_params(keys, request, sensitive)).fetchone()
    except psycopg.DataError as exc:  # e.g. a NUL character, which PostgreSQL cannot store
        raise InvalidInput(f"the run's workflow name or input cannot be stored: {exc}") from exc
    run_id = started_id(inserted)
    return _existing_run(raw, request, keys) if run_id is None else run_id


def started_id(row: tuple[Any, ...] | None) -> UUID | None:
    """The new run's id from ``START_RUN``'s row, None when its idempotency key had started
    a run already; ``SchemaMismatch`` (nothing written) when the ledger is not at this
    code's revision: an application that started before ``onward db upgrade`` ran under
    it, in its own transaction (``Ledger.start_run_txn``) as in ``Ledger.start_run``."""
    if row is None or row[1] != db.HEAD_REVISION:  # read at each call
        raise db.write_refused(None if row is None else row[1])
    return None if row[0] is None else UUID(str(row[0]))


def start_params(keys: CheckpointKeys, request: StartRequest,
                 sensitive: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The parameters of ``START_RUN`` for a new run (a new run id, checkpoint 0 MAC'd, its
    ``sensitive`` fields sealed when encryption keys are configured)."""
    run_id = uuid7()
    state = sealed_input(keys, request, run_id, sensitive)
    trace_context = tracing.current_context()  # start_run's span (ledger/tracing.py)
    body = CheckpointBody(
        run_id=run_id,
        seq=0,
        parent_hash=None,
        step=None,
        next_step=None,
        outcome=OutcomeKind.START.value,
        state=state,
        workflow_version=None,
        workflow=request.workflow,
    )
    digest = keys.mac(body.as_dict())
    budgets = request.budgets
    return {
        "run_id": run_id, "tenant_id": request.tenant_id, "workflow": request.workflow,
        "conversation_id": request.conversation_id, "idempotency_key": request.idempotency_key,
        "status": RunStatus.RUNNING.value, "max_attempts": request.max_attempts,
        "hash": digest, "head_mac": keys.sign(signed.head(run_id, 0, digest)),
        "launch_mac": keys.sign(signed.launch(run_id, {
            "tenant_id": request.tenant_id, "mode": None, "parent_run_id": None,
            "parent_seq": None, "allow_irreversible": False})),
        "budget_attempts": budgets.attempts, "budget_tokens": budgets.tokens,
        "budget_cost_usd": budgets.cost_usd,
        "deadline_s": budgets.deadline.total_seconds() if budgets.deadline is not None
        else None,
        "key_id": keys.current, "envelope_version": ENVELOPE_VERSION,
        "outcome": OutcomeKind.START.value, "state": Jsonb(state),
        "trace_context": trace_context, "priority": Priority(request.priority).value,
        "revision": db.HEAD_REVISION,
    }


def input_sealed(advertised: frozenset[str] | None, named: tuple[str, ...],
                 input: dict[str, Any]) -> frozenset[str]:
    """The input fields a new run's checkpoint 0 seals (with keys): those the advertised
    state schema marks and those ``named`` (``sensitive=``); with no schema advertised and
    none named, every field: nothing says which are not sensitive, and checkpoint 0 cannot
    be sealed later (it is the root of the chain), so it fails closed. The first worker
    writes the fields its model does not mark plain again from checkpoint 1 on."""
    if advertised is None and not named:
        return frozenset(input)
    return (advertised or frozenset()) | frozenset(named)


def sealed_input(keys: CheckpointKeys, request: StartRequest, run_id: UUID,
                 sensitive: frozenset[str]) -> dict[str, Any]:
    """The run's input with its ``sensitive`` fields sealed for checkpoint 0."""
    if keys.crypt is None or not sensitive:
        return request.input
    return {name: (keys.crypt.seal(value, Place(request.tenant_id, run_id, 0, f"state.{name}"))
                   if name in sensitive and value is not None else value)
            for name, value in request.input.items()}


def _stored_input(keys: CheckpointKeys | None, row: dict[str, Any],
                  request: StartRequest) -> bytes:
    """What the run an idempotency key started must have stored for ``request``'s input,
    as ``covered_json`` writes it (a sealed field as its digest)."""
    stored, wanted = row["state"] or {}, request.input
    if keys is not None and keys.crypt is not None and isinstance(stored, dict):
        crypt = keys.crypt
        wanted = {name: ({SEALED_KEY: crypt.digest(
                              Place(request.tenant_id, row["id"], 0, f"state.{name}"),
                              canonical_json(value), str(stored[name][SEALED_KEY]["d"])
                              .rpartition(":")[0])}
                         if sealed_envelope(stored.get(name)) is not None else value)
                  for name, value in wanted.items()}
    return canonical_json(wanted)


def _existing_run(raw: psycopg.Connection[Any], request: StartRequest,
                  keys: CheckpointKeys | None = None) -> UUID:
    cursor = raw.cursor(row_factory=dict_row)
    row = cursor.execute(EXISTING_RUN, {"tenant_id": request.tenant_id,
                                        "idempotency_key": request.idempotency_key}).fetchone()
    return existing_run(row, request, keys)


def existing_run(row: dict[str, Any] | None, request: StartRequest,
                 keys: CheckpointKeys | None = None) -> UUID:
    """The run an idempotency key already started, if it was for the same request."""
    if row is None:
        raise InvalidInput(f"idempotency key {request.idempotency_key!r} conflicted with a "
                           "run that is not visible; retry")
    # Canonical JSON, not Python equality: {"flag": 1} and {"flag": true} are other inputs.
    if (row["workflow"] != request.workflow
            or covered_json(row["state"]) != _stored_input(keys, row, request)):
        raise IdempotencyConflict(
            f"idempotency key {request.idempotency_key!r} already started run {row['id']} "
            f"of workflow {row['workflow']!r} with other input; a key must not change its request"
        )
    return UUID(str(row["id"]))


def get_run(conn: Connection, run_id: UUID) -> Run | None:
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().first()
    return Run.from_row(row) if row else None


def list_runs(
    conn: Connection,
    *,
    status: RunStatus | None = None,
    workflow: str | None = None,
    conversation_id: str | None = None,
    limit: int = 50,
) -> list[Run]:
    query = sa.select(runs).order_by(runs.c.created_at.desc()).limit(limit)
    if status is not None:
        query = query.where(runs.c.status == status.value)
    if workflow is not None:
        query = query.where(runs.c.workflow == workflow)
    if conversation_id is not None:
        query = query.where(runs.c.conversation_id == conversation_id)
    return [Run.from_row(row) for row in conn.execute(query).mappings()]


@dataclass(frozen=True)
class TimelineEntry:
    """One claimed execution of a step, and the checkpoint it committed (if any)."""

    seq: int
    step: str | None
    attempt: int
    worker: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    error_type: str | None
    error_message: str | None

    @property
    def duration_ms(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds() * 1000.0


def timeline(conn: Connection, run_id: UUID) -> list[TimelineEntry]:
    query = (
        sa.select(step_attempts)
        .where(step_attempts.c.run_id == run_id)
        .order_by(step_attempts.c.lease_epoch)
    )
    return [
        TimelineEntry(
            seq=row["seq"],
            step=row["step"],
            attempt=row["attempt"],
            worker=row["worker"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            outcome=row["outcome"],
            error_type=row["error_type"],
            error_message=row["error_message"],
        )
        for row in conn.execute(query).mappings()
    ]
