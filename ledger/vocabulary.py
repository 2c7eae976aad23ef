"""onward's vocabulary: every value the ledger stores that names a state, a kind or a reason,
as an enum defined once (docs/design.md section 2). Values are what PostgreSQL stores, so a
member compares equal to the stored string; nothing else in the code spells these strings
out (SQL statements aside, which name them in their text).

``ledger/schema.py`` builds its CHECK constraints from these enums."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "SYSTEM_ROLE",
    "WORKER_ACTOR",
    "ApprovalStatus",
    "AttemptOutcome",
    "AuditAction",
    "AuditOutcome",
    "CallFailure",
    "EffectAttemptKind",
    "EffectAttemptOutcome",
    "EffectStatus",
    "EvidenceKind",
    "FailReason",
    "LaunchMode",
    "OutcomeKind",
    "ParkReason",
    "Priority",
    "Role",
    "RunStatus",
    "ToolClass",
    "WaitKind",
]


# -- runs and their steps ------------------------------------------------------------------

class RunStatus(StrEnum):
    """Where a run stands (``runs.status``)."""

    RUNNING = "running"  # runnable: queued, leased, or waiting for a delayed retry
    COMPLETED = "completed"
    FAILED = "failed"
    NEEDS_REVIEW = "needs_review"  # parked: a person must look before anything runs
    CANCELLED = "cancelled"
    WAITING = "waiting"  # for a person's decision or a signal: no lease, no message
    DIVERGED = "diverged"  # an evidence replay asked for something its parent never did

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED,
                        RunStatus.DIVERGED)


class Priority(StrEnum):
    """Which runs go first (``runs.priority``): in the broker's queues and for a limited
    tool's slots (docs/limits.md)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Higher goes first (``limit_waiters.rank``)."""
        return {Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 0}[self]


class OutcomeKind(StrEnum):
    """What produced a checkpoint (``checkpoints.outcome``)."""

    START = "start"
    GOTO = "goto"
    FINISH = "finish"
    FAIL = "fail"
    WAIT = "wait"  # the step asked for an approval, a signal or a timer
    # Written by older releases: the migrated state as its own checkpoint. A migration now
    # happens in memory at the run's seq and the step's checkpoint records ``migrated_from``.
    MIGRATION = "migration"
    FORK = "fork"  # the first checkpoint of a replay or branch: a copy of its parent's


class AttemptOutcome(StrEnum):
    """How one claimed execution of a step ended (``step_attempts.outcome``; NULL while
    running or if the worker died)."""

    COMMITTED = "committed"
    FAILED = "failed"  # the step raised; the error is recorded
    LEASE_LOST = "lease_lost"  # another worker took over; the result was discarded
    RELEASED = "released"  # the worker gave the lease back without running (e.g. unknown workflow)
    PARKED = "parked"  # the executor parked the run instead of running the step
    WORKER_LOST = "worker_lost"  # the lease expired with no result: the worker died or hung
    WAITING = "waiting"  # the step paused (e.g. an accepted effect) and gave the lease back
    CANCELLED = "cancelled"  # the worker honoured a cancel request and ended the run


class ParkReason(StrEnum):
    """Why a run was parked for review (``runs.parked_reason`` of a ``needs_review`` run):
    docs/operating.md says what to do for each."""

    INTEGRITY = "integrity"  # stored history does not verify, or the row disagrees with it
    UNKNOWN_STEP = "unknown_step"  # the checkpoint names a step this code does not define
    INCOMPATIBLE_VERSION = "incompatible_version"  # no compatible code, no migration path
    INVALID_STATE = "invalid_state"  # the state does not validate as the workflow's model
    # no worker that claimed it had the run's workflow (or its version): handed back
    # handback_limit times in a row
    NO_WORKER_FOR_VERSION = "no_worker_for_version"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # crashes or hangs spent every attempt
    EFFECT_CONFLICT = "effect_conflict"  # a key came back with another request
    EFFECT_OUTCOME_UNKNOWN = "effect_outcome_unknown"  # a call may have reached the provider
    EFFECT_STALLED = "effect_stalled"  # an accepted job did not finish in its status window
    EFFECT_UNPOLLABLE = "effect_unpollable"  # accepted, and the tool has no status call
    EVIDENCE_CONFLICT = "evidence_conflict"  # a recorded answer is for another request
    SIMULATION_ACCEPTED = "simulation_accepted"  # a sandbox accepted a job: nothing to poll
    INVALID_CONTROL = "invalid_control"  # a checkpoint's wait control this code cannot read
    # a restore's refusals that give the message back instead of parking (never stored)
    UNKNOWN_WORKFLOW = "unknown_workflow"  # this worker has no such workflow
    NEWER_VERSION = "newer_version"  # the run is at a version newer than this worker's


class FailReason(StrEnum):
    """Why a run stopped for good by decision rather than by a step's error
    (``runs.last_error.reason`` of a failed, cancelled or diverged run)."""

    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_INVALID = "approval_invalid"  # the approval a resumed step needs is not approved
    SIGNAL_TIMEOUT = "signal_timeout"
    IRREVERSIBLE_BLOCKED = "irreversible_blocked"  # a replay may not send it (no --allow)
    NO_SIMULATION = "no_simulation"  # a simulation replay met a tool without simulate
    INVALID_ANSWER = "invalid_answer"  # a model or tool answer the ledger cannot record
    CANCELLED = "cancelled"  # an operator cancelled the run
    DIVERGED = "diverged"  # an evidence replay asked for something its parent never did


class WaitKind(StrEnum):
    """What a waiting run waits for: the ``kind`` of a wait's control (tasks/waiting.py,
    ledger/wait_control.py) and the prefix of ``runs.waiting_on`` (``signal:go``)."""

    APPROVAL = "approval"
    SIGNAL = "signal"
    TIMER = "timer"
    EFFECT = "effect"  # an accepted effect's next status poll (waiting_on only)
    REPLAYED = "replayed"  # a replay passing its parent's wait (waiting_on only)
    LIMIT = "limit"  # a slot of a fleet-wide limit (waiting_on only: ``limit:<key>``)
    RETRY = "retry"  # a call's retry backoff or Retry-After (waiting_on only)


class LaunchMode(StrEnum):
    """How a replay or branch run reaches the outside world (docs/design.md section 8)."""

    EVIDENCE = "evidence"  # parent's recorded results only; nothing external is called
    SIMULATION = "simulation"  # tools run their sandbox implementation
    LIVE = "live"  # real calls; irreversible effects only if explicitly allowed
    BRANCH = "branch"  # a new run from an edited state, live

    @property
    def child(self) -> str:
        """What a run launched this way is called in a sentence: "an evidence replay",
        "a live replay", "a branch"."""
        if self is LaunchMode.BRANCH:
            return "a branch"
        return f"{'an' if self is LaunchMode.EVIDENCE else 'a'} {self.value} replay"


# -- effects and evidence ------------------------------------------------------------------

class EffectStatus(StrEnum):
    """Where one external effect stands (docs/design.md section 5)."""

    PENDING = "pending"  # intent recorded; the outcome of any call is unknown
    ACCEPTED = "accepted"  # the provider took the job; poll its status
    COMPLETED = "completed"
    FAILED = "failed"  # the provider refused definitively
    # Closed when its run ended, known never to have reached the provider: no call was
    # started, or each call was refused or followed by a lookup that found nothing
    # (ledger/effects.py, UNKNOWN_CALL). The same run's step
    # (after ``continue``) may send it again under the same key.
    UNSENT = "unsent"


class ToolClass(StrEnum):
    """How a tool may be retried."""

    READ = "read"  # repeat freely
    IDEMPOTENT_WRITE = "idempotent_write"  # repeat with the same key
    IRREVERSIBLE = "irreversible"  # never repeated blindly: reconcile first


class CallFailure(StrEnum):
    """Why a call to a model or a tool failed, as a retry policy reads it (tasks/retry.py)
    and ``call_retries.last_error`` records it."""

    TIMEOUT = "timeout"  # no answer within the call's time limit
    CONNECTION = "connection"  # the request may not have left: refused, reset, DNS
    RATE_LIMITED = "rate_limited"  # HTTP 429: refused before doing anything
    SERVER_ERROR = "server_error"  # HTTP 5xx, or a refusal the tool calls retryable


class EffectAttemptKind(StrEnum):
    """What one attempt at an effect did (``effect_attempts.kind``)."""

    CALL = "call"
    LOOKUP = "lookup"
    STATUS = "status"
    REPEAT = "repeat"  # an operator's privileged re-send
    RESOLVE = "resolve"  # a person's finding at the provider (`onward effects resolve`)


class EffectAttemptOutcome(StrEnum):
    """How one attempt at an effect ended (``effect_attempts.outcome``; NULL while the call
    is in flight, or if its worker died during it)."""

    COMPLETED = "completed"  # the provider did it
    ACCEPTED = "accepted"  # the provider took a job; its status is polled later
    FAILED = "failed"  # the provider refused (retryable or not)
    FOUND = "found"  # a lookup (or a person) found the object the key produced
    MISSING = "missing"  # a lookup (or a person) found nothing under the key
    UNKNOWN = "unknown"  # no answer: the call may or may not have reached the provider


class EvidenceKind(StrEnum):
    """What a recorded answer answers (``evidence.kind``)."""

    LLM = "llm"
    READ = "read"


# -- people ---------------------------------------------------------------------------------

class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"


class Role(StrEnum):
    """What an operator may do (docs/design.md section 10); each role includes the ones before."""

    VIEWER = "viewer"  # reads (and the reads are audited where they show a run's detail)
    APPROVER = "approver"  # decide approvals that name them or one of their approver roles
    OPERATOR = "operator"  # start, signal, continue, replay, branch, cancel
    ADMIN = "admin"  # privileged: repeat an external effect, manage tokens

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


SYSTEM_ROLE = "system"
"""The role on audit rows onward writes itself (a worker parking a run); no token has it."""

WORKER_ACTOR = "onward-worker"
"""The actor on audit rows a worker writes."""


class AuditAction(StrEnum):
    """What an audit row records (``audit.action``)."""

    CONTINUE = "continue"
    REPLAY = "replay"
    BRANCH = "branch"
    CANCEL = "cancel"
    APPROVE = "approve"
    REJECT = "reject"
    REPEAT_EFFECT = "repeat_effect"
    RESOLVE_EFFECT = "resolve_effect"  # a person records what they found at the provider
    INSPECT = "inspect"  # a run's or an effect's full detail was read
    VERIFY = "verify"  # a run's stored history was checked
    START = "start"  # a run started by an operator or a service (CLI, HTTP API)
    SIGNAL = "signal"
    TOKEN_CREATE = "token_create"
    TOKEN_REVOKE = "token_revoke"
    CORPUS_ADD = "corpus_add"  # runs pinned into a regression corpus (exempt from retention)
    CORPUS_REMOVE = "corpus_remove"
    CORPUS_EXPORT = "corpus_export"  # a corpus's records written to a bundle (data leaves)
    CORPUS_IMPORT = "corpus_import"
    ANCHOR = "anchor"  # every run's head written to the anchor location (docs/guarantees.md)
    RETENTION = "retention"  # old runs' states compacted by policy (ledger/retention.py)
    HOLD = "hold"  # a run put on legal hold, or released from it (details say which)
    PARK = "park"  # a worker parked a run for review (written by the worker, not a command)
    KEYS = "keys"  # data keys rotated, or a tenant's erased (ledger/crypto.py, rotation.py)
    SEAL_AUDIT = "seal_audit"  # an admin sealed the tenant's pending audit rows (verify --seal)
    SHOW_SEALED = "show_sealed"  # a report showed sealed values opened (replay --show-sealed)


class AuditOutcome(StrEnum):
    DONE = "done"
    REFUSED = "refused"
