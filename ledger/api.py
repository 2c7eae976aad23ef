"""``Ledger``: the one object application code and operators use to talk to onward.

No Celery here: starting a run writes the run, checkpoint 0 and an outbox row in one
transaction; the dispatcher publishes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace as dc_replace
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ledger import (
    audit_chain,
    catalog,
    forks,
    inspection,
    operations,
    partitions,
    retention,
    rotation,
    tracing,
    verify,
    waits,
    watch,
)
from ledger import runs as run_ops
from ledger import tokens as token_ops
from ledger.audit import Actor, AuditEntry, AuditRecord, list_audit_txn, record_txn
from ledger.checkpoints import CheckpointKeys, canonical_json
from ledger.clock import TimeOrSpan
from ledger.crypto import (
    ERROR_FIELD,
    Keyring,
    approval_field,
    is_sealed,
    open_value,
    shown_value,
    signal_field,
)
from ledger.db import (
    create_engine,
    database_url,
    require_current_schema,
    require_revision_txn,
    scoped_to_tenant,
    set_tenant,
    snapshot,
    wrap_driver_errors,
)
from ledger.effects import (
    Effect,
    EffectAttempt,
    effect_error,
    effect_field,
    list_attempts_txn,
    list_effects_txn,
)
from ledger.envelope import CheckpointEnvelope
from ledger.exceptions import (
    ApprovalRefused,
    IntegrityViolation,
    InvalidInput,
    OperationRefused,
    SealedValueUnreadable,
    UnknownApproval,
    UnknownRun,
    UnknownToken,
)
from ledger.limits import LimitState, limit_states_txn
from ledger.schema import approvals as approvals_table
from ledger.schema import runs as runs_table
from ledger.schema import signals as signals_table
from ledger.settings import OnwardSettings
from ledger.states import checkpoint_rows_txn
from ledger.stats import BatchStats, batch_stats
from ledger.vocabulary import (
    ApprovalStatus,
    AuditAction,
    AuditOutcome,
    EffectAttemptOutcome,
    EffectStatus,
    LaunchMode,
    Priority,
    Role,
    RunStatus,
)

__all__ = ["REFUSALS", "Ledger"]


T = TypeVar("T")


def _priority(value: Priority | str) -> Priority:
    try:
        return Priority(value)
    except ValueError:
        raise InvalidInput(f"priority must be one of {[p.value for p in Priority]}, "
                           f"got {value!r:.80}") from None

@contextlib.contextmanager
def _rolled_back(engine: Engine) -> Iterator[Connection]:
    """A transaction rolled back at its end, whatever its body wrote (a dry run)."""
    with engine.connect() as conn, conn.begin() as transaction:
        yield conn
        transaction.rollback()


REFUSALS: tuple[type[Exception], ...] = (
    OperationRefused, UnknownRun, InvalidInput, IntegrityViolation, ApprovalRefused,
    UnknownApproval, UnknownToken)
"""Errors that mean "refused, nothing changed" (the CLI exits 2 for these). An operator
command that meets history that does not verify (a replay of a tampered checkpoint) is
refused like any other, and audited."""


class Ledger:
    """Transactional operations on the onward ledger (docs/design.md section 3).

    Operator commands act as ``actor``: the token's actor (``authenticate``), or, for code
    that holds the database's credentials and so may do anything anyway, ``settings.actor``
    as an admin of ``settings.tenant_id``. Each command checks the actor's role before
    anything else and writes one audit row, refusals included; every read is scoped to the
    actor's tenant.
    """

    def __init__(self, engine: Engine, settings: OnwardSettings,
                 actor: Actor | None = None) -> None:
        self.settings = settings
        self.keys = CheckpointKeys.from_settings(settings)
        self.actor = actor or Actor(settings.actor, Role.ADMIN, settings.tenant_id)
        self.engine = scoped_to_tenant(engine, self.actor.tenant_id)

    def acting_as(self, actor: str, role: Role | str, approver_roles: tuple[str, ...] = (),
                  *, tenant_id: str | None = None) -> Ledger:
        """The same ledger, with commands done by ``actor`` in ``role`` (trusted code only:
        people and services authenticate with a token instead)."""
        return self.with_actor(Actor(actor, Role(role), tenant_id or self.actor.tenant_id,
                                     tuple(approver_roles)))

    def with_actor(self, actor: Actor) -> Ledger:
        return Ledger(self.engine, self.settings, actor)

    def authenticate(self, secret: str) -> Ledger:
        """The same ledger acting as the token ``secret`` names; raises Unauthenticated."""
        with wrap_driver_errors("checking a token"), self.engine.begin() as conn:
            return self.with_actor(token_ops.authenticate_txn(conn, secret).actor_of())

    @classmethod
    def from_env(cls, settings: OnwardSettings | None = None) -> Ledger:
        """Connect with ``ONWARD_*`` settings (the embedded PostgreSQL when none is set)."""
        settings = settings or OnwardSettings()
        return cls(create_engine(settings), settings)

    @property
    def url(self) -> str:
        return database_url(self.settings)

    def require_current_schema(self) -> None:
        require_current_schema(self.engine)

    # -- starting runs ---------------------------------------------------------------------
    def start_run(
        self,
        workflow: str,
        input: dict[str, Any],
        *,
        conversation_id: str | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        budgets: run_ops.Budgets | None = None,
        allow_unadvertised: bool | None = None,
        priority: Priority | str = Priority.NORMAL,
        sensitive: tuple[str, ...] = (),
    ) -> UUID:
        """Start a run of ``workflow``; the same ``idempotency_key`` returns the same run.
        ``priority`` (high, normal, low) decides who goes first in the broker's queues and
        for a limited tool's slots (docs/limits.md). With encryption keys configured, the
        input fields the workflow's advertised state schema marks sensitive, and those named
        in ``sensitive`` (for a workflow no worker has advertised yet: without it, every
        field), are stored sealed.

        Refused (``UnknownWorkflow``, listing the known ones) when no worker has advertised
        ``workflow``, and (``InvalidInput``) when every advertised version's state model
        rejects ``input``; ``allow_unadvertised=True`` (default: ONWARD_START_UNADVERTISED)
        starts it anyway, e.g. before the first worker of a new workflow is deployed."""
        with tracing.start_run_span(workflow) as span, \
                wrap_driver_errors("starting a run"), self.engine.begin() as conn:
            run_id = self.start_run_txn(  # which refuses a ledger upgraded under this code
                conn,
                workflow,
                input,
                conversation_id=conversation_id,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                budgets=budgets,
                allow_unadvertised=allow_unadvertised,
                priority=priority,
                sensitive=sensitive,
            )
            tracing.name_run(span, run_id)
            return run_id

    def start_run_txn(
        self,
        conn: Connection | psycopg.Connection[Any],
        workflow: str,
        input: dict[str, Any],
        *,
        conversation_id: str | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        budgets: run_ops.Budgets | None = None,
        allow_unadvertised: bool | None = None,
        priority: Priority | str = Priority.NORMAL,
        sensitive: tuple[str, ...] = (),
    ) -> UUID:
        """Start a run inside the caller's own transaction (atomic with their business
        write), on a SQLAlchemy connection or a psycopg 3 one (not in autocommit mode, or
        the run is committed at once); checked as ``start_run`` says. On a ledger not at
        this code's revision (``onward db upgrade`` ran under the process) it writes nothing
        and raises ``SchemaMismatch``: its one statement checks the revision.

        Bad input raises InvalidInput (what to fix) before anything is written; nothing
        raised here is a driver error."""
        run_ops.validate_input(input, self.settings.max_state_bytes, self.settings.max_json_depth)
        request = run_ops.StartRequest(
            workflow=workflow,
            input=input,
            tenant_id=self.actor.tenant_id,
            conversation_id=conversation_id,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts or self.settings.step_max_attempts,
            budgets=budgets or run_ops.Budgets(),
            priority=_priority(priority),
        )
        run_ops.validate_request(request)
        raw = run_ops.driver_connection(conn)
        with wrap_driver_errors("starting a run"):
            set_tenant(raw, request.tenant_id)  # the caller's transaction may have none yet
            if not (self.settings.start_unadvertised if allow_unadvertised is None
                    else allow_unadvertised):
                catalog.check_start(raw, workflow, input)
            sealed = (run_ops.input_sealed(catalog.sensitive_fields(raw, workflow), sensitive,
                                           input)
                      if self.keys.crypt is not None else frozenset())
            return run_ops.start_run_txn(raw, self.keys, request, sealed)

    def limits(self) -> list[LimitState]:
        """Every fleet-wide limit key: what its client declared and its current use (slots
        in flight, starts in the rate's window, runs waiting), docs/limits.md."""
        with wrap_driver_errors("reading limits"), self.engine.connect() as conn:
            return limit_states_txn(conn)

    # -- waiting on runs (no polling: LISTEN/NOTIFY, ledger/watch.py) ------------------------
    def wait(self, run_id: UUID, timeout: float | None = None, *,
             through_waits: bool = False) -> watch.RunOutcome:
        """Block until the run stops and return its outcome: completed (with its result),
        failed, cancelled, diverged, parked (needs_review) or waiting for a person, a signal
        or a timer (unless ``through_waits``). Raises ``WaitTimedOut`` after ``timeout``
        seconds and ``UnknownRun`` for a run not in the actor's tenant. Holds one database
        connection while it waits."""
        return watch.wait_blocking(self.url, self.actor.tenant_id, run_id, timeout,
                                   through_waits=through_waits, shown=self._shown_run)

    def events(self, run_id: UUID, *, after_seq: int = 0,
               timeout: float | None = None) -> Iterator[watch.RunEvent]:
        """The run's progress as it happens: a ``step_committed`` event per checkpoint after
        ``after_seq`` (all of them by default, so nothing is missed by subscribing late),
        and one event each time its status changes (waiting, resumed, parked, completed,
        failed, cancelled, diverged). Every commit and the final status are reported; a
        status the run passed through between two reads (resumed, then waiting again) may
        not be. Ends after a final status; raises ``WaitTimedOut`` after ``timeout``."""
        return watch.events_blocking(self.url, self.actor.tenant_id, run_id,
                                     after_seq=after_seq, timeout=timeout,
                                     shown=self._shown_run)

    # -- reads -----------------------------------------------------------------------------
    def now(self) -> datetime:
        """The database's time (``onward.now()``): what every comparison the ledger makes
        uses, so what a console shows agrees with what the ledger decides."""
        with wrap_driver_errors("reading the database clock"), self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.onward.now())).scalar_one()

    def get_run(self, run_id: UUID) -> run_ops.Run | None:
        """The run, if it exists in the actor's tenant."""
        with wrap_driver_errors("reading a run"), self.engine.connect() as conn:
            run = run_ops.get_run(conn, run_id)
        if run is None or run.tenant_id != self.actor.tenant_id:
            return None
        return self._shown_run(run)

    def resolve_run(self, text: str) -> UUID:
        """A run id from its full text or a unique prefix (6+ hex digits), in the actor's
        tenant: what ``runs ls`` prints short is enough to name a run."""
        with wrap_driver_errors("finding a run"), self.engine.connect() as conn:
            return inspection.resolve_run_txn(conn, text, self.actor.tenant_id)

    def resolve_approval(self, text: str) -> UUID:
        """An approval id from its full text or a unique prefix (6+ hex digits), in the
        actor's tenant, as ``resolve_run`` does for runs."""
        with wrap_driver_errors("finding an approval"), self.engine.connect() as conn:
            return inspection.resolve_approval_txn(conn, text, self.actor.tenant_id)

    def _own_run(self, conn: Connection, run_id: UUID) -> None:
        found = conn.execute(sa.select(runs_table.c.tenant_id)
                             .where(runs_table.c.id == run_id)).scalar()
        if found != self.actor.tenant_id:
            raise UnknownRun(f"no run {run_id}")

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        workflow: str | None = None,
        conversation_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
        idempotency_key: str | None = None,
        since: TimeOrSpan | None = None,
        parent_run_id: UUID | None = None,
        before: UUID | None = None,
    ) -> list[run_ops.Run]:
        """Runs, newest first, filtered; page with ``offset`` or the cursor ``before``."""
        where = inspection.RunFilter(status=status, workflow=workflow,
                                  conversation_id=conversation_id,
                                  idempotency_key=idempotency_key, since=since,
                                  parent_run_id=parent_run_id, before=before)
        return self.find_runs(where, limit=limit, offset=offset)

    def find_runs(self, where: inspection.RunFilter, *, limit: int = 50,
                  offset: int = 0) -> list[run_ops.Run]:
        """Runs of the actor's tenant matching ``where``, newest first."""
        where = inspection.RunFilter(**{**where.__dict__, "tenant_id": self.actor.tenant_id})
        with wrap_driver_errors("listing runs"), self.engine.connect() as conn:
            found = inspection.list_runs_txn(conn, where, limit=limit, offset=offset)
        return [self._shown_run(run) for run in found]

    def run_counts(self) -> dict[str, int]:
        """How many runs of the actor's tenant are in each status that needs attention."""
        with wrap_driver_errors("counting runs"), self.engine.connect() as conn:
            return inspection.attention_counts_txn(conn, self.actor.tenant_id)

    def children(self, run_id: UUID) -> list[run_ops.Run]:
        """The replays and branches started from ``run_id``."""
        return self.list_runs(parent_run_id=run_id, limit=1000)

    def checkpoint(self, run_id: UUID, seq: int) -> inspection.CheckpointView | None:
        with wrap_driver_errors("reading a checkpoint"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            found = inspection.get_checkpoint_txn(conn, run_id, seq)
            source = self._source_of(conn, run_id)
        if found is None:
            return None
        return dc_replace(found, state=self._shown_state(found.state, run_id, seq, source))

    def find_effects(self, *, run_id: UUID | None = None, status: EffectStatus | None = None,
                     effect_type: str | None = None, limit: int = 50,
                     offset: int = 0) -> list[Effect]:
        with wrap_driver_errors("listing effects"), self.engine.connect() as conn:
            found = inspection.list_effects_txn(conn, run_id=run_id, status=status,
                                             effect_type=effect_type, limit=limit,
                                             offset=offset, tenant_id=self.actor.tenant_id)
        return [self._shown_effect(e) for e in found]

    def find_effect(self, effect_id: str, effect_type: str | None = None) -> Effect:
        """One effect by id (or a unique prefix of at least 8 characters)."""
        with wrap_driver_errors("reading an effect"), self.engine.connect() as conn:
            found = inspection.find_effect_txn(conn, effect_id, effect_type,
                                            tenant_id=self.actor.tenant_id)
        return self._shown_effect(found)

    def audit(self, *, run_id: UUID | None = None, action: str | None = None,
              actor: str | None = None, outcome: str | None = None,
              since: TimeOrSpan | None = None, limit: int = 50,
              offset: int = 0, before: int | None = None) -> list[AuditEntry]:
        """The actor's tenant's audit log, newest first (``before``: an id cursor)."""
        with wrap_driver_errors("reading the audit log"), self.engine.connect() as conn:
            found = list_audit_txn(conn, tenant_id=self.actor.tenant_id, run_id=run_id,
                                   action=action, actor=actor, outcome=outcome, since=since,
                                   limit=limit, offset=offset, before=before)
        return [self._shown_audit(entry) for entry in found]

    def timeline(self, run_id: UUID) -> list[run_ops.TimelineEntry]:
        with wrap_driver_errors("reading a timeline"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            return run_ops.timeline(conn, run_id)

    def timeline_page(self, run_id: UUID, *, limit: int = 200,
                      before_epoch: int | None = None) -> inspection.TimelinePage:
        """The run's newest step executions (a page; ``older`` pages back)."""
        with wrap_driver_errors("reading a timeline"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            return inspection.timeline_page_txn(conn, run_id, limit=limit,
                                             before_epoch=before_epoch)

    def checkpoint_summaries(self, run_id: UUID, *, limit: int = 200,
                             before_seq: int | None = None) -> list[inspection.CheckpointSummary]:
        with wrap_driver_errors("listing checkpoints"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            return inspection.checkpoint_summaries_txn(conn, run_id, limit=limit,
                                                    before_seq=before_seq)

    def model_calls(self, run_id: UUID, *, limit: int = 200) -> list[inspection.ModelCall]:
        """The run's recorded model calls and reads (newest ``limit``), oldest first."""
        with wrap_driver_errors("reading model calls"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            return inspection.model_calls_txn(conn, run_id, limit=limit)

    def state_diff(self, run_id: UUID, from_seq: int,
                   to_seq: int) -> list[forks.PatchChange]:
        """What changed in the state between two checkpoints of the run."""
        import jsonpatch

        before, after = self.checkpoint(run_id, from_seq), self.checkpoint(run_id, to_seq)
        if before is None or after is None:
            missing = from_seq if before is None else to_seq
            raise InvalidInput(f"run {run_id} has no checkpoint {missing}")
        if before.state is None or after.state is None:
            gone = from_seq if before.state is None else to_seq
            raise InvalidInput(f"the state of checkpoint {gone} of run {run_id} was compacted "
                               "(docs/operating.md#retention): there is nothing to compare")
        patch = jsonpatch.make_patch(before.state, after.state).patch
        return forks.describe_patch(before.state, patch)

    def batch_stats(self, run_ids: list[UUID]) -> BatchStats:
        with wrap_driver_errors("counting runs"), self.engine.connect() as conn:
            return batch_stats(conn, run_ids)

    def effects(self, run_id: UUID) -> list[Effect]:
        """The run's effects, in the order its steps requested them."""
        with wrap_driver_errors("reading effects"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            found = list_effects_txn(conn, run_id)
        return [self._shown_effect(e) for e in found]

    def effect_attempts(self, effect: Effect) -> list[EffectAttempt]:
        """Every call, lookup and status poll made for one effect."""
        with wrap_driver_errors("reading effect attempts"), self.engine.connect() as conn:
            found = list_attempts_txn(conn, effect)
        return [self._shown_attempt(effect, a) for a in found]

    # -- operator commands (docs/design.md section 8), each audited --------------------------------
    def _command(self, action: AuditAction, body: Callable[[Connection], T], *,
                 reason: str | None = None, run_id: UUID | None = None,
                 effect_id: str | None = None, approval_id: UUID | None = None,
                 dry_run: bool = False) -> T:
        """Check the actor's role, then run one command in one transaction (it writes its
        own audit row); a refusal is recorded in a transaction of its own and raised again.

        ``dry_run``: the same command, checks and locks included, in a transaction rolled
        back at its end, so it writes nothing, its audit row included; a refusal is raised
        and audited exactly as the command's own. A person's command asks this before it
        asks the person, so nobody confirms what the ledger would refuse; the command
        itself then checks again under its locks and decides, the target may have changed
        in between. Only commands whose every write is in ``body``'s transaction offer it
        (or that leave out, in a dry run, a write made elsewhere: ``erase_tenant_keys``)."""
        try:
            self.actor.require(action)
            with wrap_driver_errors(f"{action.value}"), \
                    (_rolled_back(self.engine) if dry_run else self.engine.begin()) as conn:
                require_revision_txn(conn)  # not a refusal: nothing is audited
                return body(conn)
        except REFUSALS as exc:
            with wrap_driver_errors("auditing a refusal"), self.engine.begin() as conn:
                record_txn(conn, self.keys, self.actor, AuditRecord(
                    action, AuditOutcome.REFUSED, reason, run_id=run_id, effect_id=effect_id,
                    approval_id=approval_id,
                    details={"error": str(exc), "type": type(exc).__name__}))
            raise

    # -- encryption keys (ledger/crypto.py, ledger/rotation.py) -----------------------------------
    def _keyring(self) -> Keyring:
        if self.keys.crypt is None:
            raise InvalidInput("no encryption keys are configured (ONWARD_ENCRYPTION_KEYS or "
                               "ONWARD_ENCRYPTION_KEY_FILE)")
        crypt = self.keys.crypt
        crypt.use_engine(self.engine)
        return crypt

    def rotate_keys(self, *, batch: int = 500, new_keys: bool = True,
                    progress: Callable[[str, int, int], None] = lambda *_: None
                    ) -> rotation.RotationReport:
        """Rewrap the data keys under the active master key, give each tenant a new data key
        and re-encrypt every sealed value under it, in batches (admin; audited; resumable:
        ``new_keys=False`` goes on after a stop). Covers the rows this connection sees: the
        actor's tenant as ``onward_app``, every tenant as ``onward_operator``."""
        self.actor.require(AuditAction.KEYS)
        try:
            report = rotation.rotate(self.engine, self._keyring(), batch=batch,
                                     new_keys=new_keys, progress=progress)
        except REFUSALS as exc:  # e.g. a master key missing: refused before any change
            raise self.refuse(AuditAction.KEYS, exc, reason="rotate") from None
        with wrap_driver_errors("auditing a rotation"), self.engine.begin() as conn:
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.KEYS, AuditOutcome.DONE, "rotate", details=report.as_dict()))
        return report

    def erase_tenant_keys(self, reason: str | None = None, *, dry_run: bool = False) -> int:
        """Destroy the data keys of the actor's tenant (admin; audited): its sealed values
        can no longer be read by anyone, nothing more is sealed for it, and every MAC and
        chain still verifies. Returns how many keys were destroyed. ``dry_run``: refuse
        (audited) as it would, e.g. with no keys configured, erasing nothing (``_command``;
        the keyring writes on its own connection, so its erase is left out, not rolled
        back)."""
        def body(conn: Connection) -> int:
            keyring = self._keyring()
            if dry_run:
                return 0
            erased = keyring.erase_tenant(self.actor.tenant_id)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.KEYS, AuditOutcome.DONE, reason or "erase tenant",
                details={"erased_keys": erased}))
            return erased

        return self._command(AuditAction.KEYS, body, reason=reason, dry_run=dry_run)

    # -- retention (ledger/retention.py) ----------------------------------------------------------
    def retention_plan(self) -> retention.Plan:
        """What the retention policies would compact now (admin; a dry run)."""
        self.actor.require(AuditAction.RETENTION)
        policies = retention.parse_policies(self.settings.retention_policies)
        with wrap_driver_errors("planning retention"), self.engine.connect() as conn:
            return retention.plan_txn(conn, policies)

    def retention_apply(self, *, batch: int = 100,
                        max_runs: int | None = None) -> retention.Applied:
        """Compact what the policies make due: one run per transaction, each audited."""
        self.actor.require(AuditAction.RETENTION)
        policies = retention.parse_policies(self.settings.retention_policies)
        return retention.apply(self.engine, self.keys, policies, actor=self.actor,
                               batch=batch, max_runs=max_runs)

    def partitions_plan(self) -> dict[str, str | None]:
        """Each ended month's partition and why the policies keep it (None: due)."""
        self.actor.require(AuditAction.RETENTION)
        policies = retention.parse_policies(self.settings.retention_policies)
        with wrap_driver_errors("planning retention"), self.engine.connect() as conn:
            return partitions.plan_txn(conn, policies)

    def partitions_expire(self) -> partitions.Expired:
        """Drop the ended months' partitions the policies let go of entirely (audited)."""
        self.actor.require(AuditAction.RETENTION)
        policies = retention.parse_policies(self.settings.retention_policies)
        return partitions.expire(self.engine, self.keys, policies, actor=self.actor)

    def hold(self, run_id: UUID, reason: str | None, *, release: bool = False) -> None:
        """Put a run on legal hold (retention keeps it) or release it (admin; audited)."""
        def body(conn: Connection) -> None:
            if not (reason or "").strip():
                raise InvalidInput("a legal hold and its release need --reason")
            self._own_run(conn, run_id)
            retention.keep_shared_txn(conn)  # ordered against a partition drop
            conn.execute(runs_table.update().where(runs_table.c.id == run_id)
                         .values(legal_hold=None if release else reason))
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.HOLD, AuditOutcome.DONE, reason, run_id=run_id,
                details={"hold": not release}))

        self._command(AuditAction.HOLD, body, reason=reason, run_id=run_id)

    def refuse(self, action: AuditAction, error: Exception, *, reason: str | None = None,
               run_id: UUID | None = None, effect_id: str | None = None,
               approval_id: UUID | None = None) -> Exception:
        """Audit a refusal decided outside the ledger (e.g. by tasks/operator.py) and return
        the error for the caller to raise."""
        def body(conn: Connection) -> None:
            raise error

        with contextlib.suppress(*REFUSALS):
            self._command(action, body, reason=reason, run_id=run_id, effect_id=effect_id,
                          approval_id=approval_id)
        return error

    def inspected(self, *, run_id: UUID | None = None, effect_id: str | None = None) -> None:
        """Record that the actor read a run's or an effect's full detail: inspection is
        audited like every other operator command (docs/design.md sections 8 and 10)."""
        def body(conn: Connection) -> None:
            self.actor.require(AuditAction.INSPECT)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.INSPECT, AuditOutcome.DONE, run_id=run_id, effect_id=effect_id))

        self._command(AuditAction.INSPECT, body, run_id=run_id, effect_id=effect_id)

    def require(self, action: AuditAction, *, run_id: UUID | None = None,
                effect_id: str | None = None, approval_id: UUID | None = None) -> None:
        """Raise (audited) PermissionDenied unless the actor's role allows ``action``: a
        command asks this before it shows or asks anything."""
        if not self.actor.may(action):
            self._command(action, lambda conn: None, run_id=run_id, effect_id=effect_id,
                          approval_id=approval_id)

    def verified(self, run_id: UUID | None, checked: int, problems: int, *,
                 mode: str) -> None:
        """Record that the actor verified ``run_id`` (None: every run of the tenant, or its
        audit log), ``mode`` saying which check (``run``, ``all``, ``audit``; ``anchor`` is
        recorded by ``Anchors.compare``), with the runs checked and the problems found."""
        def body(conn: Connection) -> None:
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.VERIFY, AuditOutcome.DONE, run_id=run_id,
                details={"mode": mode, "checked": checked, "problems": problems}))

        self._command(AuditAction.VERIFY, body, run_id=run_id)

    def showing_sealed(self, what: str, details: dict[str, Any] | None = None) -> None:
        """Record that the actor is shown sealed values opened in ``what`` (a report:
        ``onward corpus replay --show-sealed``), before it is made; raises PermissionDenied
        (audited) for a viewer, who sees sealed values masked or as hashes only."""
        def body(conn: Connection) -> None:
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.SHOW_SEALED, AuditOutcome.DONE, what, details=details))

        self._command(AuditAction.SHOW_SEALED, body, reason=what)

    def start_run_command(self, workflow: str, input: dict[str, Any], *,
                          conversation_id: str | None = None,
                          idempotency_key: str | None = None,
                          priority: Priority | str = Priority.NORMAL) -> UUID:
        """Start a run for an operator or a service (CLI, HTTP API): needs the operator role,
        runs in the actor's tenant, and writes one audit row with the run it started."""
        def body(conn: Connection) -> UUID:
            scoped = self.settings.model_copy(update={"tenant_id": self.actor.tenant_id})
            run_id = Ledger(self.engine, scoped, self.actor).start_run_txn(
                conn, workflow, input, conversation_id=conversation_id,
                idempotency_key=idempotency_key, priority=priority)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.START, AuditOutcome.DONE, run_id=run_id, new_run_id=run_id,
                details={"workflow": workflow, "idempotency_key": idempotency_key}))
            return run_id

        return self._command(AuditAction.START, body)

    def continue_run(self, run_id: UUID, reason: str | None, *,
                     dry_run: bool = False) -> operations.Continued:
        """Resume the original run at its current seq (parked, failed by an error, or stalled).

        Refused for finished runs, waits (decide or signal them), runs a worker holds, failures
        that were decisions (budgets, rejections, ctx.fail) and replays. ``dry_run``: refuse
        (audited) as it would, writing nothing (``_command``)."""
        return self._command(
            AuditAction.CONTINUE,
            lambda c: operations.continue_run_txn(c, self.keys, self.actor, run_id, reason),
            reason=reason, run_id=run_id, dry_run=dry_run)

    def replay(self, run_id: UUID, from_seq: int, mode: LaunchMode | str, reason: str | None,
               *, budgets: forks.BudgetPolicy | str = forks.BudgetPolicy.INHERITED,
               allow_irreversible: bool = False, allow_unresolved: bool = False,
               dry_run: bool = False) -> forks.Launched:
        """A new run from a copy of checkpoint ``from_seq`` of ``run_id``: ``evidence``
        (recorded answers only), ``simulation`` (tools' sandboxes) or ``live`` (real calls;
        irreversible effects only with ``allow_irreversible``; refused while the parent has
        an effect of unknown outcome it would make again, unless ``allow_unresolved``).
        ``dry_run``: refuse (audited) as it would, creating nothing (``_command``)."""
        request = forks.ForkRequest(run_id, from_seq, LaunchMode(mode), reason,
                                    forks.BudgetPolicy(budgets), allow_irreversible,
                                    allow_unresolved=allow_unresolved)
        return self._fork(AuditAction.REPLAY, request, dry_run=dry_run)

    def branch(self, run_id: UUID, from_seq: int, patch: list[dict[str, Any]],
               reason: str | None, *, allow_irreversible: bool = False,
               budgets: forks.BudgetPolicy | str = forks.BudgetPolicy.INHERITED,
               check_state: forks.StateCheck | None = None, allow_unresolved: bool = False,
               dry_run: bool = False) -> forks.Launched:
        """A new live run from checkpoint ``from_seq`` with its state edited by an RFC 6902
        ``patch``. ``check_state`` validates the result against the workflow's model.
        Refused while the parent has an effect of unknown outcome it would make again,
        unless ``allow_unresolved``. ``dry_run``: refuse (audited) as it would, creating
        nothing (``_command``)."""
        request = forks.ForkRequest(run_id, from_seq, LaunchMode.BRANCH, reason,
                                    forks.BudgetPolicy(budgets), allow_irreversible, patch,
                                    allow_unresolved)
        return self._fork(AuditAction.BRANCH, request, check_state, dry_run=dry_run)

    def _fork(self, action: AuditAction, request: forks.ForkRequest,
              check_state: forks.StateCheck | None = None, *,
              dry_run: bool = False) -> forks.Launched:
        return self._command(
            action,
            lambda c: forks.fork_txn(c, self.keys, self.actor, request,
                                     default_max_attempts=self.settings.step_max_attempts,
                                     max_state_bytes=self.settings.max_state_bytes,
                                     check_state=check_state),
            reason=request.reason, run_id=request.parent_run_id, dry_run=dry_run)

    def preview_branch(self, run_id: UUID, from_seq: int,
                       patch: list[dict[str, Any]]) -> list[forks.PatchChange]:
        """The diff a branch would start from (nothing is written)."""
        with wrap_driver_errors("previewing a branch"), self.engine.connect() as conn:
            return forks.preview_txn(conn, self.keys, run_id, from_seq, patch,
                                     self.settings.max_state_bytes)

    def cancel(self, run_id: UUID, reason: str | None, *,
               dry_run: bool = False) -> operations.Cancelled:
        """Stop a non-terminal run; a step in flight cannot commit afterwards. ``dry_run``:
        refuse (audited) as it would, writing nothing (``_command``)."""
        return self._command(
            AuditAction.CANCEL,
            lambda c: operations.cancel_txn(c, self.keys, self.actor, run_id, reason),
            reason=reason, run_id=run_id, dry_run=dry_run)

    def begin_repeat(self, effect_type: str, effect_id: str, reason: str | None,
                     plan: dict[str, Any], *,
                     dry_run: bool = False) -> operations.RepeatStarted:
        """Record (and commit) a privileged repeat attempt with its own key, before the call.
        ``dry_run``: refuse (audited) as it would, recording nothing (``_command``)."""
        return self._command(
            AuditAction.REPEAT_EFFECT,
            lambda c: operations.begin_repeat_txn(c, self.keys, self.actor, effect_type, effect_id,
                                                  reason, plan),
            reason=reason, effect_id=effect_id, dry_run=dry_run)

    def finish_repeat(self, started: operations.RepeatStarted, *, outcome: EffectAttemptOutcome,
                      provider_ref: str | None = None, result: dict[str, Any] | None = None,
                      error: dict[str, Any] | None = None) -> Effect:
        with wrap_driver_errors("recording a repeat"), self.engine.begin() as conn:
            return operations.finish_repeat_txn(conn, self.keys, started, outcome=outcome,
                                                provider_ref=provider_ref, result=result,
                                                error=error)

    def resolve_effect(self, effect_type: str, effect_id: str, reason: str | None,
                       plan: dict[str, Any], *, finding: operations.Finding,
                       provider_ref: str | None = None,
                       result: dict[str, Any] | None = None,
                       allow_in_flight: bool = False,
                       dry_run: bool = False) -> Effect:
        """Record what a person found at the provider for an effect whose outcome is unknown
        (admin, audited): ``completed`` with the provider's reference and result, or
        ``not_sent`` (closed ``unsent``; the run's step sends it again with the same key),
        refused while a call of it may still land (never seen to end, or ended without an
        answer) unless ``allow_in_flight`` (``operations.Landing``, ONWARD_CALL_LANDING_S).
        ``plan`` is what was shown (``operations.resolve_plan``); refused if the effect
        changed since. The run is not moved: continue it afterwards. ``dry_run``: refuse
        (audited) as it would, recording nothing (``_command``)."""
        def body(conn: Connection) -> Effect:
            self._check_result(result)
            return operations.resolve_effect_txn(
                conn, self.keys, self.actor, effect_type, effect_id, reason, plan,
                finding=finding, provider_ref=provider_ref, result=result,
                landing=operations.Landing(self.settings.call_landing_s,
                                           self.settings.tool_timeout_s, allow_in_flight))

        try:  # a refusal is audited with the effect's run, when there is one
            run_id: UUID | None = self.find_effect(effect_id, effect_type).run_id
        except REFUSALS:
            run_id = None
        return self._command(AuditAction.RESOLVE_EFFECT, body, reason=reason, run_id=run_id,
                             effect_id=effect_id, dry_run=dry_run)

    def _check_result(self, result: dict[str, Any] | None) -> None:
        """A result a person gives: a JSON object within the effect payload limits."""
        if result is None:
            return
        if not isinstance(result, dict):
            raise InvalidInput("the result is a JSON object (what the provider answered)")
        size = len(canonical_json(result, max_depth=self.settings.max_json_depth))
        if size > self.settings.max_effect_payload_bytes:
            raise InvalidInput(f"the result is {size} bytes, over the limit of "
                               f"{self.settings.max_effect_payload_bytes} "
                               "(ONWARD_MAX_EFFECT_PAYLOAD_BYTES)")

    # -- approvals and signals (docs/design.md section 6) ------------------------------------------
    def approve(self, approval_id: UUID, *, artifact_hash: str,
                comment: str | None = None, dry_run: bool = False) -> waits.Approval:
        """Approve what ``artifact_hash`` names; resumes the run in the same transaction.

        Needs the approver role (or above); when the approval names approvers, the actor
        must be one of them by name or hold one of the ``role:<name>`` it names among its
        approver roles (from its token, never from the caller). ``dry_run``: refuse
        (audited) as it would, deciding nothing (``_command``)."""
        return self._decide(approval_id, True, artifact_hash, comment, dry_run)

    def reject(self, approval_id: UUID, *, artifact_hash: str,
               comment: str | None = None, dry_run: bool = False) -> waits.Approval:
        """Reject; the run goes to its declared rejection step or fails (approval_rejected).
        ``dry_run``: refuse (audited) as it would, deciding nothing (``_command``)."""
        return self._decide(approval_id, False, artifact_hash, comment, dry_run)

    def _decide(self, approval_id: UUID, approve: bool, artifact_hash: str,
                comment: str | None, dry_run: bool) -> waits.Approval:
        return self._command(
            AuditAction.APPROVE if approve else AuditAction.REJECT,
            lambda c: operations.decide_approval_txn(c, self.keys, self.actor, approval_id,
                                                     approve=approve, artifact_hash=artifact_hash,
                                                     comment=comment),
            reason=comment, approval_id=approval_id, dry_run=dry_run)

    def get_approval(self, approval_id: UUID) -> waits.Approval:
        with wrap_driver_errors("reading an approval"), self.engine.connect() as conn:
            approval = waits.get_approval_txn(conn, approval_id)
            tenant = conn.execute(sa.select(approvals_table.c.tenant_id).where(
                approvals_table.c.id == approval_id)).scalar()
        if tenant != self.actor.tenant_id:
            raise UnknownApproval(f"no approval {approval_id}")
        return self._shown_approval(approval)

    def approvals(self, *, status: ApprovalStatus | None = None, run_id: UUID | None = None,
                  limit: int = 100, before: tuple[datetime, UUID] | None = None,
                  approver: bool = False) -> list[waits.Approval]:
        """Approvals of the actor's tenant, newest first; ``before`` is a (created_at, id)
        cursor; ``approver`` keeps only those the actor may decide."""
        mine = (self.actor.name, self.actor.approver_roles) if approver else None
        with wrap_driver_errors("listing approvals"), self.engine.connect() as conn:
            found = waits.list_approvals_txn(conn, status=status, run_id=run_id, limit=limit,
                                             tenant_id=self.actor.tenant_id, before=before,
                                             decidable_by=mine)
        return [self._shown_approval(a) for a in found]

    def signal(self, run_id: UUID, name: str, payload: Any = None) -> bool:
        """Send a named signal to a run (operator role; audited); returns whether it woke the
        run now. A signal sent before the run waits for it is kept, not lost."""
        def body(conn: Connection) -> bool:
            self._own_run(conn, run_id)
            woke = waits.signal_txn(conn, self.keys, run_id, name,
                                    payload if payload is not None else {},
                                    max_bytes=self.settings.max_signal_bytes,
                                    max_depth=self.settings.max_json_depth)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.SIGNAL, AuditOutcome.DONE, run_id=run_id,
                details={"name": name, "woke": woke}))
            return woke

        return self._command(AuditAction.SIGNAL, body, run_id=run_id)

    def signals(self, run_id: UUID) -> list[dict[str, Any]]:
        """The signals sent to the run, oldest first: id, name, payload (a sealed one opened,
        or masked for a viewer: ``may_see_sealed``), the seq whose wait it ended, when sent."""
        with wrap_driver_errors("reading signals"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            found = conn.execute(sa.select(signals_table).where(
                signals_table.c.run_id == run_id).order_by(signals_table.c.id)).mappings().all()
        return [{"id": row["id"], "name": row["name"],
                 "payload": self._shown(row["payload"], run_id, signal_field(row["id"])),
                 "consumed_seq": row["consumed_seq"], "created_at": row["created_at"]}
                for row in found]

    # -- tokens (admin) --------------------------------------------------------------------
    def create_token(self, request: token_ops.TokenRequest) -> token_ops.Issued:
        """A new token in the actor's own tenant; its secret is in the result only."""
        def body(conn: Connection) -> token_ops.Issued:
            if request.tenant_id != self.actor.tenant_id:
                raise OperationRefused(f"{self.actor.name} administers tenant "
                                       f"{self.actor.tenant_id!r}, not {request.tenant_id!r}")
            issued = token_ops.issue_txn(conn, request, self.actor.name)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.TOKEN_CREATE, AuditOutcome.DONE, request.note,
                details={"token": str(issued.token.id), "actor": request.actor,
                         "role": request.role.value,
                         "approver_roles": list(request.approver_roles),
                         "expires_at": issued.token.expires_at.isoformat()}))
            return issued

        return self._command(AuditAction.TOKEN_CREATE, body, reason=request.note)

    def tokens(self, *, include_inactive: bool = False) -> list[token_ops.Token]:
        """The tenant's tokens (admin): who holds what, until when, last used when."""
        self.require(AuditAction.TOKEN_CREATE)
        with wrap_driver_errors("listing tokens"), self.engine.connect() as conn:
            return token_ops.list_txn(conn, self.actor.tenant_id,
                                      include_inactive=include_inactive)

    def revoke_token(self, token_id: str, reason: str | None = None) -> token_ops.Token:
        """Revoke a token (by id or a unique prefix of it) now."""
        def body(conn: Connection) -> token_ops.Token:
            found = token_ops.find_txn(conn, token_id, self.actor.tenant_id)
            revoked = token_ops.revoke_txn(conn, found, self.actor.tenant_id, self.actor.name)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.TOKEN_REVOKE, AuditOutcome.DONE, reason,
                details={"token": str(found), "actor": revoked.actor}))
            return revoked

        return self._command(AuditAction.TOKEN_REVOKE, body, reason=reason)

    # -- verification --------------------------------------------------------------------------
    def verify_run(self, run_id: UUID) -> list[verify.Problem]:
        """Check a run's stored history offline; an empty list means it verifies. Read in
        one snapshot: a retention compaction committing meanwhile deletes the artifacts the
        states it compacted named, which checkpoints read before it would miss."""
        with wrap_driver_errors("verifying a run"), snapshot(self.engine) as conn:
            self._own_run(conn, run_id)
            return verify.verify_run_txn(conn, self.keys, run_id)

    def verify_audit(self) -> list[verify.Problem]:
        """Check the actor's tenant's audit log: each row's MAC, the sealed chain (gaps,
        links, its head) and rows left unsealed (ledger/audit_chain.py)."""
        with wrap_driver_errors("verifying the audit log"), self.engine.connect() as conn:
            return audit_chain.verify_audit_txn(conn, self.keys, self.actor.tenant_id,
                                                grace_s=self.settings.audit_seal_grace_s)

    def seal_audit(self, batch: int = 1000) -> audit_chain.Sealed:
        """Link the tenant's committed, unsealed audit rows into its chain now, as the
        reaper's sealer would (admin; audited): for a deployment with no reaper running,
        such as the embedded demo after it ends. Sealing hides nothing: an edited row still
        fails its own MAC, and a chain whose end does not verify is refused, not extended."""
        def body(conn: Connection) -> audit_chain.Sealed:
            done = audit_chain.seal_txn(conn, self.keys, batch,
                                        tenant_id=self.actor.tenant_id)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.SEAL_AUDIT, AuditOutcome.DONE,
                details={"sealed": done.rows, "refused": done.refused}))
            return done

        total, refused = 0, list[str]()
        while True:
            done = self._command(AuditAction.SEAL_AUDIT, body)
            total, refused = total + done.rows, refused + done.refused
            if done.rows < batch:
                return audit_chain.Sealed(total, refused)

    def result_problem(self, run_id: UUID) -> str | None:
        """Why the run's recorded result does not verify against its MAC, or None (also when
        it has no result): what ``runs show`` marks."""
        with wrap_driver_errors("verifying a result"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            run = conn.execute(sa.select(runs_table).where(runs_table.c.id == run_id)
                               ).mappings().one()
            return verify.result_problem(self.keys, run)

    def verify_all(self, batch: int = 500) -> Iterator[tuple[UUID, list[verify.Problem]]]:
        """Every run of the actor's tenant, in id order, with its problems (in batches)."""
        after: UUID | None = None
        while True:
            with wrap_driver_errors("listing runs to verify"), self.engine.connect() as conn:
                ids = verify.run_ids_txn(conn, after=after, limit=batch,
                                         tenant_id=self.actor.tenant_id)
            if not ids:
                return
            for run_id in ids:
                yield run_id, self.verify_run(run_id)
            after = ids[-1]

    def checkpoints(self, run_id: UUID) -> list[CheckpointEnvelope]:
        """The run's checkpoints as validated envelopes (docs/design.md section 9), oldest first."""
        with wrap_driver_errors("reading checkpoints"), self.engine.connect() as conn:
            self._own_run(conn, run_id)
            rows = checkpoint_rows_txn(conn, run_id)
            source = self._source_of(conn, run_id)
        envelopes = [CheckpointEnvelope.from_row(row) for row in rows]
        return [e.model_copy(update={"state": self._shown_state(
                    e.state, run_id, e.identity.seq, source)}) for e in envelopes]

    # -- sealed values (ledger/crypto.py): opened for roles that may see them, else masked --
    @property
    def may_see_sealed(self) -> bool:
        """Whether this actor is shown sensitive values opened: an approver (who must see
        what they decide), an operator or an admin, in a process holding the encryption
        keys. A viewer sees them masked (``***``)."""
        return self.actor.role is not Role.VIEWER and self.keys.crypt is not None

    def _shown(self, value: Any, run_id: UUID, field: str, *, seq: int | None = None,
               seq_at_most: int | None = None) -> Any:
        return shown_value(self.keys.crypt, value, may_see=self.may_see_sealed,
                           tenant=self.actor.tenant_id, run_id=run_id, field=field, seq=seq,
                           seq_at_most=seq_at_most)

    def _shown_run(self, run: run_ops.Run) -> run_ops.Run:
        """The run with its sealed finish result opened (or masked: ``_shown``)."""
        return run_ops.shown_run(self.keys.crypt, run, may_see=self.may_see_sealed)

    @staticmethod
    def _source_of(conn: Connection, run_id: UUID) -> UUID | None:
        """The run a replay or branch was copied from (None: a recorded run)."""
        found: UUID | None = conn.execute(sa.select(runs_table.c.parent_run_id).where(
            runs_table.c.id == run_id)).scalar()
        return found

    def _shown_state(self, state: Any, run_id: UUID, seq: int,
                     source: UUID | None = None) -> Any:
        """A checkpoint's state, each sealed field opened (or masked: ``_shown``). The state
        a replay or branch starts from keeps its source's envelopes, sealed for the source's
        place, until its next checkpoint seals them again (tasks/sensitive.py
        ``open_state``): those open as the source's."""
        if not isinstance(state, dict):
            return state
        return {name: self._shown_field(value, run_id, f"state.{name}", seq, source)
                for name, value in state.items()}

    def _shown_field(self, value: Any, run_id: UUID, field: str, seq: int,
                     source: UUID | None) -> Any:
        if source is not None and self.may_see_sealed and is_sealed(value):
            try:
                return open_value(self.keys.crypt, value, tenant=self.actor.tenant_id,
                                  run_id=run_id, field=field, seq_at_most=seq)
            except SealedValueUnreadable:
                return self._shown(value, source, field)
        return self._shown(value, run_id, field, seq_at_most=seq)

    def _shown_error(self, effect: Effect, error: dict[str, Any] | None,
                     attempt: int | None) -> dict[str, Any] | None:
        return effect_error(error, effect, attempt, lambda value, field: self._shown(
            value, effect.run_id, field, seq=effect.seq))

    def _shown_audit(self, entry: AuditEntry) -> AuditEntry:
        """An audit row of a park or a failure keeps the run's error as it was stored: its
        sealed message opened (or masked), as the run's own ``last_error`` is shown."""
        details = entry.details
        if not (isinstance(details, dict) and is_sealed(details.get("message"))
                and entry.run_id is not None):
            return entry
        return dc_replace(entry, details={**details, "message": self._shown(
            details["message"], entry.run_id, ERROR_FIELD, seq=entry.before_seq)})

    def _shown_attempt(self, effect: Effect, attempt: EffectAttempt) -> EffectAttempt:
        error = self._shown_error(effect, attempt.error, attempt.attempt)
        return attempt if error is attempt.error else dc_replace(attempt, error=error)

    def _shown_effect(self, effect: Effect) -> Effect:
        error = self._shown_error(effect, effect.error, None)
        if error is not effect.error:
            effect = dc_replace(effect, error=error)
        if not (is_sealed(effect.payload) or is_sealed(effect.result)):
            return effect
        return dc_replace(
            effect,
            payload=self._shown(effect.payload, effect.run_id, effect_field(
                effect.effect_type, effect.effect_id, "payload"), seq=effect.seq),
            result=self._shown(effect.result, effect.run_id, effect_field(
                effect.effect_type, effect.effect_id, "result"), seq=effect.seq))

    def _shown_approval(self, approval: waits.Approval) -> waits.Approval:
        comment = waits.shown_comment(self.keys, approval)
        if comment != approval.comment:
            approval = dc_replace(approval, comment=comment)
        if not is_sealed(approval.artifact):
            return approval
        return dc_replace(approval, artifact=self._shown(
            approval.artifact, approval.run_id, approval_field(approval.id), seq=approval.seq))
