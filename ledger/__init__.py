"""onward's ledger: the PostgreSQL store. No Celery imports here.

An application starts, waits for, inspects and operates runs through what this package
exports (``from ledger import Ledger, RunStatus``): the two clients, the records their
methods return, the vocabulary those records use and the errors they raise. The
submodules are the store's implementation. ``tests/unit/test_public_api.py`` pins this
list, so a change to it is a deliberate one.
"""

from __future__ import annotations

from ledger.api import Ledger
from ledger.client import AsyncLedger
from ledger.effects import Effect, EffectAttempt
from ledger.envelope import CheckpointEnvelope
from ledger.exceptions import (
    ApprovalRefused,
    EffectConflict,
    IdempotencyConflict,
    IntegrityViolation,
    InvalidInput,
    LedgerUnavailable,
    OnwardError,
    OperationRefused,
    PermissionDenied,
    SchemaMismatch,
    Unauthenticated,
    UnknownApproval,
    UnknownEffect,
    UnknownRun,
    UnknownWorkflow,
    WaitTimedOut,
)
from ledger.limits import LimitState
from ledger.operations import Cancelled, Continued
from ledger.runs import Run, TimelineEntry
from ledger.settings import OnwardSettings
from ledger.stats import BatchStats
from ledger.verify import Problem
from ledger.vocabulary import (
    ApprovalStatus,
    AttemptOutcome,
    EffectAttemptOutcome,
    EffectStatus,
    FailReason,
    LaunchMode,
    OutcomeKind,
    ParkReason,
    Priority,
    Role,
    RunStatus,
)
from ledger.waits import Approval
from ledger.watch import EventKind, RunEvent, RunOutcome

__all__ = [
    "Approval",
    "ApprovalRefused",
    "ApprovalStatus",
    "AsyncLedger",
    "AttemptOutcome",
    "BatchStats",
    "Cancelled",
    "CheckpointEnvelope",
    "Continued",
    "Effect",
    "EffectAttempt",
    "EffectAttemptOutcome",
    "EffectConflict",
    "EffectStatus",
    "EventKind",
    "FailReason",
    "IdempotencyConflict",
    "IntegrityViolation",
    "InvalidInput",
    "LaunchMode",
    "Ledger",
    "LedgerUnavailable",
    "LimitState",
    "OnwardError",
    "OnwardSettings",
    "OperationRefused",
    "OutcomeKind",
    "ParkReason",
    "PermissionDenied",
    "Priority",
    "Problem",
    "Role",
    "Run",
    "RunEvent",
    "RunOutcome",
    "RunStatus",
    "SchemaMismatch",
    "TimelineEntry",
    "Unauthenticated",
    "UnknownApproval",
    "UnknownEffect",
    "UnknownRun",
    "UnknownWorkflow",
    "WaitTimedOut",
]
