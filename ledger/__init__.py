"""onward's ledger: the PostgreSQL store. No Celery imports here."""

from __future__ import annotations

from ledger.api import Ledger
from ledger.client import AsyncLedger
from ledger.exceptions import (
    IdempotencyConflict,
    IntegrityViolation,
    InvalidInput,
    LedgerUnavailable,
    OnwardError,
    SchemaMismatch,
    UnknownRun,
    UnknownWorkflow,
    WaitTimedOut,
)
from ledger.runs import Run
from ledger.settings import OnwardSettings
from ledger.vocabulary import AttemptOutcome, OutcomeKind, RunStatus
from ledger.watch import EventKind, RunEvent, RunOutcome

__all__ = [
    "AsyncLedger",
    "AttemptOutcome",
    "EventKind",
    "IdempotencyConflict",
    "IntegrityViolation",
    "InvalidInput",
    "Ledger",
    "LedgerUnavailable",
    "OnwardError",
    "OnwardSettings",
    "OutcomeKind",
    "Run",
    "RunEvent",
    "RunOutcome",
    "RunStatus",
    "SchemaMismatch",
    "UnknownRun",
    "UnknownWorkflow",
    "WaitTimedOut",
]
