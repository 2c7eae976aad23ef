"""onward's ledger: the PostgreSQL store. No Celery imports here."""

from __future__ import annotations

from ledger.api import Ledger
from ledger.catalog import UnknownWorkflow
from ledger.client import AsyncLedger
from ledger.exceptions import (
    IntegrityViolation,
    InvalidInput,
    LedgerUnavailable,
    OnwardError,
    SchemaMismatch,
    UnknownRun,
)
from ledger.runs import IdempotencyConflict, Run
from ledger.schema import AttemptOutcome, OutcomeKind, RunStatus
from ledger.settings import OnwardSettings
from ledger.watch import EventKind, RunEvent, RunOutcome, WaitTimedOut

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
