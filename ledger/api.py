"""``Ledger``: the one object application code and operators use to talk to onward.

No Celery here: starting a run writes the run, checkpoint 0 and an outbox row in one
transaction; the dispatcher publishes it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection, Engine

from ledger import runs as run_ops
from ledger import waits
from ledger.effects import Effect, EffectAttempt, list_attempts_txn, list_effects_txn
from ledger.schema import ApprovalStatus
from ledger.checkpoints import CheckpointKeys
from ledger.db import create_engine, database_url, require_current_schema, wrap_driver_errors
from ledger.schema import RunStatus
from ledger.settings import OnwardSettings
from ledger.stats import BatchStats, batch_stats


class Ledger:
    """Transactional operations on the onward ledger (DESIGN.md section 3)."""

    def __init__(self, engine: Engine, settings: OnwardSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.keys = CheckpointKeys.from_settings(settings)

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
    ) -> UUID:
        """Start a run of ``workflow``; the same ``idempotency_key`` returns the same run."""
        with wrap_driver_errors("starting a run"), self.engine.begin() as conn:
            return self.start_run_txn(
                conn,
                workflow,
                input,
                conversation_id=conversation_id,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                budgets=budgets,
            )

    def start_run_txn(
        self,
        conn: Connection,
        workflow: str,
        input: dict[str, Any],
        *,
        conversation_id: str | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        budgets: run_ops.Budgets | None = None,
    ) -> UUID:
        """Start a run inside the caller's own transaction (atomic with their business write)."""
        run_ops.validate_input(input, self.settings.max_state_bytes)
        if not workflow or not isinstance(workflow, str):
            raise run_ops.InvalidInput("workflow must be a non-empty name")
        request = run_ops.StartRequest(
            workflow=workflow,
            input=input,
            tenant_id=self.settings.tenant_id,
            conversation_id=conversation_id,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts or self.settings.step_max_attempts,
            budgets=budgets or run_ops.Budgets(),
        )
        return run_ops.start_run_txn(conn, self.keys, request)

    # -- reads -----------------------------------------------------------------------------
    def get_run(self, run_id: UUID) -> run_ops.Run | None:
        with wrap_driver_errors("reading a run"), self.engine.connect() as conn:
            return run_ops.get_run(conn, run_id)

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        workflow: str | None = None,
        conversation_id: str | None = None,
        limit: int = 50,
    ) -> list[run_ops.Run]:
        with wrap_driver_errors("listing runs"), self.engine.connect() as conn:
            return run_ops.list_runs(
                conn, status=status, workflow=workflow, conversation_id=conversation_id,
                limit=limit,
            )

    def timeline(self, run_id: UUID) -> list[run_ops.TimelineEntry]:
        with wrap_driver_errors("reading a timeline"), self.engine.connect() as conn:
            return run_ops.timeline(conn, run_id)

    def batch_stats(self, run_ids: list[UUID]) -> BatchStats:
        with wrap_driver_errors("counting runs"), self.engine.connect() as conn:
            return batch_stats(conn, run_ids)

    def effects(self, run_id: UUID) -> list[Effect]:
        """The run's effects, in the order its steps requested them."""
        with wrap_driver_errors("reading effects"), self.engine.connect() as conn:
            return list_effects_txn(conn, run_id)

    def effect_attempts(self, effect: Effect) -> list[EffectAttempt]:
        """Every call, lookup and status poll made for one effect."""
        with wrap_driver_errors("reading effect attempts"), self.engine.connect() as conn:
            return list_attempts_txn(conn, effect)

    # -- approvals and signals (DESIGN.md section 6) ------------------------------------------
    def approve(self, approval_id: UUID, actor: str, *, artifact_hash: str,
                comment: str | None = None, roles: tuple[str, ...] = ()) -> waits.Approval:
        """Approve what ``artifact_hash`` names; resumes the run in the same transaction."""
        with wrap_driver_errors("approving"), self.engine.begin() as conn:
            return waits.decide_txn(conn, approval_id, approve=True, actor=actor, roles=roles,
                                    artifact_hash=artifact_hash, comment=comment)

    def reject(self, approval_id: UUID, actor: str, *, artifact_hash: str,
               comment: str | None = None, roles: tuple[str, ...] = ()) -> waits.Approval:
        """Reject; the run goes to its declared rejection step or fails (approval_rejected)."""
        with wrap_driver_errors("rejecting"), self.engine.begin() as conn:
            return waits.decide_txn(conn, approval_id, approve=False, actor=actor, roles=roles,
                                    artifact_hash=artifact_hash, comment=comment)

    def get_approval(self, approval_id: UUID) -> waits.Approval:
        with wrap_driver_errors("reading an approval"), self.engine.connect() as conn:
            return waits.get_approval_txn(conn, approval_id)

    def approvals(self, *, status: ApprovalStatus | None = None, run_id: UUID | None = None,
                  limit: int = 100) -> list[waits.Approval]:
        with wrap_driver_errors("listing approvals"), self.engine.connect() as conn:
            return waits.list_approvals_txn(conn, status=status, run_id=run_id, limit=limit)

    def signal(self, run_id: UUID, name: str, payload: Any = None) -> bool:
        """Send a named signal to a run; returns whether it woke the run now. A signal sent
        before the run waits for it is kept, not lost."""
        with wrap_driver_errors("signalling"), self.engine.begin() as conn:
            return waits.signal_txn(conn, run_id, name, payload if payload is not None else {})
