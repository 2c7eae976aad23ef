"""onward's ledger: the PostgreSQL store. No Celery imports here."""

from __future__ import annotations

from ledger.api import Ledger
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

__all__ = [
    "AttemptOutcome",
    "IdempotencyConflict",
    "IntegrityViolation",
    "InvalidInput",
    "Ledger",
    "LedgerUnavailable",
    "OnwardError",
    "OnwardSettings",
    "OutcomeKind",
    "Run",
    "RunStatus",
    "SchemaMismatch",
    "UnknownRun",
]
