"""All ledger tables, on one MetaData in the PostgreSQL schema ``onward``; the values their
CHECK constraints allow come from the enums of ``ledger/vocabulary.py``.

Alembic migrations in ``ledger/migrations`` must produce exactly this catalog;
``tests/integration/test_migrations.py`` checks it.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from ledger.vocabulary import (
    ApprovalStatus,
    AttemptOutcome,
    EffectAttemptKind,
    EffectStatus,
    EvidenceKind,
    LaunchMode,
    OutcomeKind,
    Priority,
    Role,
    RunStatus,
    ToolClass,
)

__all__ = [
    "NULLABLE_JSON",
    "SCHEMA",
    "TS",
    "VERSION_TABLE",
    "approvals",
    "artifacts",
    "audit",
    "audit_heads",
    "call_retries",
    "checkpoints",
    "corpora",
    "corpus_runs",
    "effect_attempts",
    "effects",
    "evidence",
    "limit_grants",
    "limit_waiters",
    "limits",
    "metadata",
    "metric_totals",
    "outbox",
    "runs",
    "signals",
    "step_attempts",
    "tokens",
    "worker_queues",
    "workers",
]


SCHEMA = "onward"
VERSION_TABLE = "onward_alembic_version"

NULLABLE_JSON = JSONB(none_as_null=True)
"""A JSON column that may be absent: Python None is stored as SQL NULL, never as JSON
``null`` (which SQL reads as a value: ``cancel_requested IS NOT NULL`` is a cancel request).
Every write through SQLAlchemy (an import, a fork, continue) then keeps NULL as NULL, as
the hot path's psycopg statements do."""

metadata = MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    },
)


def _in(column: str, enum: type[StrEnum]) -> str:
    values = ", ".join(f"'{member.value}'" for member in enum)
    return f"{column} IN ({values})"


TS = DateTime(timezone=True)

runs = Table(
    "runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("workflow", Text, nullable=False),
    Column("workflow_version", Integer, nullable=True),
    Column("conversation_id", Text, nullable=True),
    Column("idempotency_key", Text, nullable=True),
    Column("status", Text, nullable=False),
    Column("seq", Integer, nullable=False, server_default=text("0")),
    Column("step", Text, nullable=True),  # next step to execute; NULL means the start step
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("attempts_total", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", Text, nullable=True),
    Column("lease_epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_expires_at", TS, nullable=True),
    Column("head_hash", Text, nullable=False),
    Column("head_mac", Text, nullable=True),  # key_id:MAC of (id, seq, head_hash): signed.head
    Column("restore_count", Integer, nullable=False, server_default=text("0")),
    Column("stale_deliveries", Integer, nullable=False, server_default=text("0")),
    # hand-backs by workers lacking the run's version since its last commit or continue
    Column("handbacks", Integer, nullable=False, server_default=text("0")),
    Column("last_error", NULLABLE_JSON, nullable=True),
    Column("parked_reason", Text, nullable=True),
    Column("result", NULLABLE_JSON, nullable=True),
    Column("result_mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py result
    Column("waiting_on", Text, nullable=True),  # e.g. "effect:<effect_id>" while paused
    Column("wait_until", TS, nullable=True),  # a signal wait's timeout
    Column("budget_attempts", Integer, nullable=True),  # NULL: the workflow's default
    Column("budget_tokens", Integer, nullable=True),
    Column("budget_cost_usd", Numeric(12, 6), nullable=True),
    Column("deadline_at", TS, nullable=True),
    Column("used_tokens", Integer, nullable=False, server_default=text("0")),
    Column("used_cost_usd", Numeric(12, 6), nullable=False, server_default=text("0")),
    Column("state_schema_version", Integer, nullable=True),
    Column("parent_run_id", UUID(as_uuid=True), ForeignKey("runs.id"), nullable=True),
    Column("parent_seq", Integer, nullable=True),
    Column("launch_reason", Text, nullable=True),
    Column("mode", Text, nullable=True),  # LaunchMode for replays and branches
    Column("allow_irreversible", Boolean, nullable=False, server_default=text("false")),
    # key_id:MAC of how the run was launched (tenant, mode, parent, irreversible): signed.launch
    Column("launch_mac", Text, nullable=True),
    Column("branch_patch", NULLABLE_JSON, nullable=True),  # RFC 6902 patch a branch began with
    # who asked to cancel a run a worker held, and why: the worker ends it (docs/operating.md)
    Column("cancel_requested", NULLABLE_JSON, nullable=True),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("updated_at", TS, nullable=False, server_default=func.onward.now()),
    Column("finished_at", TS, nullable=True),
    Column("trace_context", Text, nullable=True),  # W3C traceparent of start_run's span
    Column("legal_hold", Text, nullable=True),  # why retention must keep it (NULL: no hold)
    # Ledger.wait/events watchers: progress is NOTIFYed only while above zero (ledger/watch.py)
    Column("watchers", Integer, nullable=False, server_default=text("0")),
    # who goes first in the broker's queues and for a limited tool's slots (docs/limits.md)
    Column("priority", Text, nullable=False, server_default=text("'normal'")),
    CheckConstraint(_in("status", RunStatus), name="status"),
    CheckConstraint(_in("priority", Priority), name="priority"),
    CheckConstraint("seq >= 0", name="seq_nonnegative"),
    Index(
        "ix_runs_tenant_idempotency",
        "tenant_id",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # not the lease: an indexed lease makes every claim and commit a non-HOT update
    Index("ix_runs_status", "status"),
    Index("ix_runs_wait_until", "wait_until", postgresql_where=text("wait_until IS NOT NULL")),
    Index("ix_runs_conversation", "conversation_id"),
    Index("ix_runs_workflow_status", "workflow", "status"),
    Index("ix_runs_parent", "parent_run_id", postgresql_where=text("parent_run_id IS NOT NULL")),
    Index("ix_runs_tenant_id", "tenant_id", "id"),  # the console's runs list, newest first
    Index("ix_runs_tenant_status_id", "tenant_id", "status", "id"),  # ... by status; counts
    Index("ix_runs_tenant_workflow_id", "tenant_id", "workflow", "id"),
    CheckConstraint(f"mode IS NULL OR {_in('mode', LaunchMode)}", name="mode"),
    postgresql_with={"fillfactor": 90},  # room on each page for HOT updates (migration 0040)
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("parent_hash", Text, nullable=True),
    Column("hash", Text, nullable=False),
    Column("key_id", Text, nullable=False),
    Column("envelope_version", Integer, nullable=False),
    Column("step", Text, nullable=True),  # the step that produced it; NULL for seq 0
    Column("next_step", Text, nullable=True),
    Column("outcome", Text, nullable=False),
    # in full (a snapshot; NULL for a delta, or once compacted: ledger/states.py)
    Column("state", NULLABLE_JSON, nullable=True),
    Column("workflow_version", Integer, nullable=True),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("control", NULLABLE_JSON, nullable=True),  # a wait's continuations (MAC'd)
    Column("state_schema_version", Integer, nullable=True),
    Column("refs", NULLABLE_JSON, nullable=True),  # evidence, effects, budgets of the step (MAC'd)
    Column("workflow", Text, nullable=True),  # the run's workflow (MAC'd from envelope 2 on)
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("state_delta", NULLABLE_JSON, nullable=True),  # RFC 6902 patch from seq - 1's state
    Column("snapshot_seq", Integer, nullable=True),  # a delta's chain starts at this snapshot
    Column("chain_bytes", Integer, nullable=True),  # its deltas' bytes since the snapshot
    # compacted by retention: the sha256 of the state it signed, and a seal over it
    Column("state_sha256", Text, nullable=True),
    Column("compacted_mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py compacted
    PrimaryKeyConstraint("run_id", "seq"),
    CheckConstraint(_in("outcome", OutcomeKind), name="outcome"),
    # a state stored apart, by its artifact: what lets a tenant read that artifact
    # (row-level security, migration 0028); only large states have an entry
    Index("ix_checkpoints_state_artifact",
          text("((state -> '$artifact'::text) ->> 'sha256'::text)"),
          postgresql_where=text("state ? '$artifact'::text")),
    CheckConstraint("state_delta IS NULL OR state IS NULL",
                    name="delta"),
)

step_attempts = Table(
    "step_attempts",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("step", Text, nullable=True),
    Column("worker", Text, nullable=False),
    Column("started_at", TS, nullable=False, server_default=func.onward.now()),
    Column("ended_at", TS, nullable=True),
    Column("outcome", Text, nullable=True),
    Column("error_type", Text, nullable=True),
    Column("error_message", Text, nullable=True),
    # partitioned by month of started_at (migration 0038, ledger/partitions.py), so the key
    # must include it; (run_id, lease_epoch) is unique by the claim, which takes the run's
    # next epoch under the run row's lock
    PrimaryKeyConstraint("run_id", "lease_epoch", "started_at"),
    CheckConstraint(f"outcome IS NULL OR {_in('outcome', AttemptOutcome)}", name="outcome"),
    # restores, counted at each scrape (ledger/health.py): few rows, whatever the history
    Index("ix_step_attempts_worker_lost", "run_id",
          postgresql_where=text("outcome = 'worker_lost'")),
    postgresql_partition_by="RANGE (started_at)",
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("due_at", TS, nullable=False, server_default=func.onward.now()),
    Column("worker_publishes", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("published_at", TS, nullable=True),
    Column("publish_count", Integer, nullable=False, server_default=text("0")),
    Column("trace_context", Text, nullable=True),  # traceparent of the span that wrote it
    UniqueConstraint("run_id", "seq"),
    Index("ix_outbox_due_at", "due_at"),
)

# The failures a retry policy counted for one model or tool call (tasks/retry.py): a call
# deferred for a retry finds its count here when the step runs again.
call_retries = Table(
    "call_retries",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("command_id", Text, nullable=False),
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("last_error", NULLABLE_JSON, nullable=True),
    Column("updated_at", TS, nullable=False, server_default=func.onward.now()),
    PrimaryKeyConstraint("run_id", "seq", "command_id"),
)

# Fleet-wide limits (docs/limits.md): one row per limit key (``name`` or ``name:key``) with
# what its client declared; the functions onward.limit_acquire and onward.limit_release
# (migration 0032) are the only writers of these three tables.
limits = Table(
    "limits",
    metadata,
    Column("key", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("concurrency", Integer, nullable=True),  # calls in flight at once; NULL: no limit
    Column("rate_count", Integer, nullable=True),  # calls started per window; NULL: no limit
    Column("rate_window_s", Float(precision=53), nullable=True),
    Column("granted", BigInteger, nullable=False, server_default=text("0")),
    Column("throttled", BigInteger, nullable=False, server_default=text("0")),
    Column("declared_at", TS, nullable=False, server_default=func.onward.now()),
)

# A slot held (released_at NULL, not expired) or a start still inside the rate's window.
limit_grants = Table(
    "limit_grants",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("key", Text, ForeignKey("limits.key", ondelete="CASCADE"), nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("command_id", Text, nullable=False),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("granted_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),  # the holder died if it has not released by then
    Column("released_at", TS, nullable=True),
    Index("ix_limit_grants_key_granted_at", "key", "granted_at"),
    Index("ix_limit_grants_run_id", "run_id"),
)

# Runs waiting for a slot, without a worker: served by rank (priority), then in order.
limit_waiters = Table(
    "limit_waiters",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("key", Text, ForeignKey("limits.key", ondelete="CASCADE"), nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("rank", SmallInteger, nullable=False),
    Column("enqueued_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),
    UniqueConstraint("key", "run_id"),
    Index("ix_limit_waiters_run_id", "run_id"),
)

effects = Table(
    "effects",
    metadata,
    Column("effect_id", Text, nullable=False),  # sha256(run_id : effect type : command_id)
    Column("effect_type", Text, nullable=False),  # the tool name
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),  # the checkpoint the step started from
    Column("step", Text, nullable=False),
    Column("command_id", Text, nullable=False),
    Column("tool_class", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("recipient", Text, nullable=True),
    Column("payload", NULLABLE_JSON, nullable=True),  # NULL: the tool's policy keeps it out
    Column("status", Text, nullable=False),
    Column("provider_ref", Text, nullable=True),
    Column("result", NULLABLE_JSON, nullable=True),
    Column("error", NULLABLE_JSON, nullable=True),
    Column("reconciled", Boolean, nullable=False, server_default=text("false")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("polls", Integer, nullable=False, server_default=text("0")),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("updated_at", TS, nullable=False, server_default=func.onward.now()),
    Column("completed_at", TS, nullable=True),
    Column("intent_mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py effect_intent
    Column("outcome_mac", Text, nullable=True),  # set when completed or failed: effect_outcome
    Column("recipient_mac", Text, nullable=True),  # with a recipient: effect_recipient (0047)
    # where the status-polling window of an accepted effect starts (NULL: created_at); a
    # person who continues a run parked effect_stalled opens a fresh window
    Column("polling_since", TS, nullable=True),
    PrimaryKeyConstraint("effect_type", "effect_id"),
    CheckConstraint(_in("status", EffectStatus), name="status"),
    CheckConstraint(_in("tool_class", ToolClass), name="tool_class"),
    Index("ix_effects_run", "run_id", "seq"),
    Index("ix_effects_status_updated", "status", "updated_at"),
)

effect_attempts = Table(
    "effect_attempts",
    metadata,
    Column("effect_type", Text, nullable=False),
    Column("effect_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Column("worker", Text, nullable=False),
    Column("lease_epoch", BigInteger, nullable=True),
    Column("idempotency_key", Text, nullable=False),
    Column("started_at", TS, nullable=False, server_default=func.onward.now()),
    Column("ended_at", TS, nullable=True),
    # started_at + the call's time limit and lease margin, as its worker's lease was
    # extended to cover it (0048; NULL: a repeat, or begun before)
    Column("covered_until", TS, nullable=True),
    Column("outcome", Text, nullable=True),  # completed, accepted, failed, found, missing, unknown
    Column("provider_ref", Text, nullable=True),
    Column("error", NULLABLE_JSON, nullable=True),
    Column("mac", Text, nullable=True),  # set when it ends: ledger/signed.py effect_attempt
    PrimaryKeyConstraint("effect_type", "effect_id", "attempt"),
    ForeignKeyConstraint(
        ["effect_type", "effect_id"], ["effects.effect_type", "effects.effect_id"],
        ondelete="CASCADE",
    ),
    CheckConstraint(_in("kind", EffectAttemptKind), name="kind"),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("size", Integer, nullable=False),
    Column("media_type", Text, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
)

evidence = Table(
    "evidence",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("command_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("step", Text, nullable=False),
    Column("source", Text, nullable=False),  # model name or tool name
    Column("source_version", Text, nullable=True),
    Column("request_hash", Text, nullable=False),
    Column("response", NULLABLE_JSON, nullable=True),  # inline when small
    Column("artifact_sha256", Text, ForeignKey("artifacts.sha256"), nullable=True),
    Column("input_tokens", Integer, nullable=False, server_default=text("0")),
    Column("output_tokens", Integer, nullable=False, server_default=text("0")),
    Column("cost_usd", Numeric(12, 6), nullable=False, server_default=text("0")),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py evidence
    # the request, sealed (encryption keys configured; migration 0046): a replay report
    # shows its diff to a reader allowed to see sealed values (ledger/evidence.py)
    Column("request", NULLABLE_JSON, nullable=True),
    PrimaryKeyConstraint("run_id", "command_id"),
    CheckConstraint(_in("kind", EvidenceKind), name="kind"),
    CheckConstraint("(response IS NULL) <> (artifact_sha256 IS NULL)", name="one_body"),
    # the artifacts a tenant's evidence names (row-level security, migration 0028)
    Index("ix_evidence_artifact_sha256", "artifact_sha256",
          postgresql_where=text("artifact_sha256 IS NOT NULL")),
    Index("ix_evidence_request_hash", "request_hash"),
    # a claim's "answered at this seq?" (ledger/sql/steps.sql claim; migration 0045)
    Index("ix_evidence_run_seq", "run_id", "seq"),
)

# A model answer or read result that was paid for but could not be recorded as evidence
# (migration 0036): its call, digest, size and why, never its bytes. A retried step that finds
# one standing (``cleared_at`` NULL) fails again without calling; continuing a run failed
# ``invalid_answer`` clears it, so the continued step asks again.
refused_answers = Table(
    "refused_answers",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("command_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("answer_sha256", Text, nullable=True),
    Column("answer_bytes", BigInteger, nullable=True),
    Column("reason", Text, nullable=False),
    Column("input_tokens", Integer, nullable=False, server_default=text("0")),
    Column("output_tokens", Integer, nullable=False, server_default=text("0")),
    Column("cost_usd", Numeric(12, 6), nullable=False, server_default=text("0")),
    Column("lease_epoch", BigInteger, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("cleared_at", TS, nullable=True),
    Column("mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py refused_answer (0042)
    Index("ix_refused_answers_standing", "run_id", "command_id", unique=True,
          postgresql_where=text("cleared_at IS NULL")),
)

approvals = Table(
    "approvals",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),  # the waiting checkpoint
    Column("workflow_version", Integer, nullable=False),
    Column("step", Text, nullable=False),  # the step that asked
    Column("action", Text, nullable=False),
    Column("artifact_hash", Text, nullable=False),  # sha256 of the canonical artifact
    Column("artifact", JSONB, nullable=False),
    Column("approvers", JSONB, nullable=False),  # names or "role:<name>"; [] means anyone
    Column("expires_at", TS, nullable=False),
    Column("status", Text, nullable=False),
    Column("decided_by", Text, nullable=True),
    Column("decided_at", TS, nullable=True),
    Column("comment", Text, nullable=True),
    Column("decision_mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py approval_decision
    Column("terms_mac", Text, nullable=True),  # key_id:MAC, ledger/signed.py approval_terms
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    CheckConstraint(_in("status", ApprovalStatus), name="status"),
    Index("ix_approvals_run", "run_id", "seq"),
    Index("ix_approvals_tenant_status_created", "tenant_id", "status", "created_at", "id"),
    Index("ix_approvals_pending_expiry", "expires_at",
          postgresql_where=text("status = 'pending'")),
)

signals = Table(
    "signals",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("consumed_seq", Integer, nullable=True),  # the seq whose wait it ended
    Column("mac", Text, nullable=True),  # key_id:MAC of (run, name, payload): signed.signal
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Index("ix_signals_run_name", "run_id", "name", "consumed_seq"),
    Index("ix_signals_unconsumed", "run_id", "name",
          postgresql_where=text("consumed_seq IS NULL")),
)

audit = Table(
    "audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", TS, nullable=False, server_default=func.onward.now()),
    Column("tenant_id", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("outcome", Text, nullable=False),  # done, refused
    Column("reason", Text, nullable=True),
    Column("run_id", UUID(as_uuid=True), nullable=True),
    Column("new_run_id", UUID(as_uuid=True), nullable=True),
    Column("effect_id", Text, nullable=True),
    Column("approval_id", UUID(as_uuid=True), nullable=True),
    Column("before_seq", Integer, nullable=True),
    Column("after_seq", Integer, nullable=True),
    Column("details", NULLABLE_JSON, nullable=True),
    Column("token_id", UUID(as_uuid=True), nullable=True),  # the token the actor presented
    Column("mac", Text, nullable=True),  # key_id:MAC of the content, by its writer
    Column("chain_seq", BigInteger, nullable=True),  # place in the tenant's sealed chain
    Column("chain_mac", Text, nullable=True),  # key_id:MAC linking it to the previous row
    Index("ix_audit_run", "run_id"),
    Index("ix_audit_at", "at"),
    Index("ix_audit_tenant_id", "tenant_id", "id"),
    Index("ix_audit_tenant_chain", "tenant_id", "chain_seq", unique=True),
    Index("ix_audit_unsealed", "tenant_id", "id", postgresql_where=text("chain_seq IS NULL")),
)

audit_heads = Table(
    "audit_heads",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("chain_seq", BigInteger, nullable=False),  # the last sealed row's place
    Column("chain_mac", Text, nullable=False),  # and its link
    Column("mac", Text, nullable=False),  # key_id:MAC of the three above
    Column("sealed_at", TS, nullable=False, server_default=func.onward.now()),
)

tenant_keys = Table(
    "tenant_keys",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("key_id", Text, primary_key=True),  # names it in every value it seals
    Column("state", Text, nullable=False),  # active (seals), retired (opens), destroyed
    Column("master_key_id", Text, nullable=True),  # the master key that wraps it
    Column("wrapped", LargeBinary, nullable=True),  # nonce + AES-GCM of the data key
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("destroyed_at", TS, nullable=True),
    CheckConstraint("state IN ('active', 'retired', 'destroyed')", name="state"),
    CheckConstraint("(state = 'destroyed') = (wrapped IS NULL)", name="wrapped"),
    Index("ix_tenant_keys_active", "tenant_id", unique=True,
          postgresql_where=text("state = 'active'")),
    Index("ix_tenant_keys_tenant_id", "tenant_id"),
)
"""Each tenant's data keys, wrapped by a master key (ledger/crypto.py; migration 0037)."""

worker_queues = Table(
    "worker_queues",
    metadata,
    Column("queue", Text, primary_key=True),  # "<base>.<workflow>.v<version>"
    Column("workflow", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("seen_at", TS, nullable=False, server_default=func.onward.now()),
    Column("start_step", Text, nullable=True),  # names a run's first message (Flower)
    Column("state_schema", NULLABLE_JSON, nullable=True),  # JSON Schema of its state model
)

workers = Table(
    "workers",
    metadata,
    Column("node", Text, primary_key=True),  # the Celery node name, e.g. worker@host
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),  # the main process
    Column("pool", Text, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("queues", JSONB, nullable=False),  # every queue it consumes
    Column("workflows", JSONB, nullable=False),  # [{"workflow", "version", "start_step"}]
    Column("in_flight", Integer, nullable=False, server_default=text("0")),
    Column("started_at", TS, nullable=False, server_default=func.onward.now()),
    Column("seen_at", TS, nullable=False, server_default=func.onward.now()),
    Index("ix_workers_seen_at", "seen_at"),
)

metric_totals = Table(
    "metric_totals",
    metadata,
    Column("workflow", Text, nullable=False),
    Column("version", Integer, nullable=False),  # 0: not bound to a version yet
    Column("metric", Text, nullable=False),  # e.g. steps_committed, step_seconds_bucket
    Column("label", Text, nullable=False),  # e.g. an outcome, a bucket's upper bound
    Column("value", Float(precision=53), nullable=False),
    Column("updated_at", TS, nullable=False, server_default=func.onward.now()),
    PrimaryKeyConstraint("workflow", "version", "metric", "label"),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("token_hash", Text, nullable=False),  # sha256 of the secret; the secret is never kept
    Column("actor", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("approver_roles", JSONB, nullable=False),  # e.g. ["sales_lead"]
    Column("tenant_id", Text, nullable=False),
    Column("note", Text, nullable=True),
    Column("created_by", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("expires_at", TS, nullable=False),
    Column("revoked_at", TS, nullable=True),
    Column("revoked_by", Text, nullable=True),
    Column("last_used_at", TS, nullable=True),
    CheckConstraint(_in("role", Role), name="role"),
    Index("ix_tokens_hash", "token_hash", unique=True),
)

corpora = Table(
    "corpora",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=True),
    Column("created_by", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.onward.now()),
    Column("updated_at", TS, nullable=False, server_default=func.onward.now()),
    PrimaryKeyConstraint("tenant_id", "name"),
)

# A pinned run is kept: retention (when it exists) must skip every run listed here, and the
# foreign key (no ON DELETE) refuses to delete one while it is pinned.
corpus_runs = Table(
    "corpus_runs",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("corpus", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.id"), nullable=False),
    Column("pinned_by", Text, nullable=False),
    Column("pinned_at", TS, nullable=False, server_default=func.onward.now()),
    Column("selection", NULLABLE_JSON, nullable=True),  # the filter that pinned it (corpus add)
    PrimaryKeyConstraint("tenant_id", "corpus", "run_id"),
    ForeignKeyConstraint(["tenant_id", "corpus"], ["corpora.tenant_id", "corpora.name"],
                         ondelete="CASCADE"),
    Index("ix_corpus_runs_run_id", "run_id"),
)
