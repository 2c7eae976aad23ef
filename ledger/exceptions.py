"""Errors raised by the ledger. One base class; each message says what to do.

Every error onward raises derives from ``OnwardError``; the ledger's are defined here, the
authoring API's and the executor's in ``tasks/exceptions.py``, the processes' in
``workers/exceptions.py`` and the command line's in ``console/exceptions.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from ledger.verify import Problem
    from ledger.vocabulary import RunStatus

__all__ = [
    "AnchorRefused",
    "AnchorUnavailable",
    "ApprovalRefused",
    "CancelRequested",
    "CatalogueError",
    "EffectConflict",
    "EffectFenced",
    "EncryptionUnavailable",
    "EvidenceFenced",
    "IdempotencyConflict",
    "IntegrityViolation",
    "InvalidInput",
    "LedgerUnavailable",
    "MalformedControl",
    "NotPlainJson",
    "OnwardError",
    "OperationRefused",
    "PermissionDenied",
    "RollbackFound",
    "SchemaMismatch",
    "SealedValueUnreadable",
    "StatementRefused",
    "TracingUnavailable",
    "Unauthenticated",
    "UnknownApproval",
    "UnknownCorpus",
    "UnknownEffect",
    "UnknownRun",
    "UnknownToken",
    "UnknownWorkflow",
    "WaitTimedOut",
]


class OnwardError(Exception):
    """Base of every onward error."""


class LedgerUnavailable(OnwardError):
    """The database could not be reached or failed; the driver error is chained."""


class SchemaMismatch(OnwardError):
    """The database schema is not the revision this code expects."""


class UnknownRun(OnwardError):
    """No run with this id exists."""


class InvalidInput(OnwardError):
    """Input to a ledger operation is malformed, too large or not JSON."""


class NotPlainJson(InvalidInput, ValueError):
    """Text that is JSON as Python reads it, but not JSON onward can store (or parse): nested
    past the parser, NaN or Infinity, an integer of thousands of digits, a NUL or a lone
    surrogate (``ledger.json_input.read_json``). A ``ValueError`` too, as any bad JSON is."""


class MalformedControl(InvalidInput):
    """A checkpoint's wait control is not a timer, approval or signal wait this code reads."""


class StatementRefused(OnwardError):
    """The database refused a statement (a value it cannot store, a constraint): nothing it
    would have written was written. The driver error is chained."""


class IntegrityViolation(OnwardError):
    """Stored history does not verify against its hashes and MACs."""


class OperationRefused(OnwardError):
    """An operator command was refused (the run's state, the role, the input): nothing changed.

    The refusal itself is written to the audit log."""


class PermissionDenied(OperationRefused):
    """The operator's role does not allow this command; the message names the role needed."""


# starting runs and waiting for them (ledger/runs.py, ledger/catalog.py, ledger/watch.py)

class IdempotencyConflict(OnwardError):
    """The idempotency key was first used to start a different run."""


class UnknownWorkflow(InvalidInput):
    """No worker has advertised a workflow of this name."""


class WaitTimedOut(OnwardError, TimeoutError):
    """The run did not stop within the timeout; it is still running (or waiting)."""

    def __init__(self, run_id: UUID, timeout: float, status: RunStatus, seq: int) -> None:
        super().__init__(f"run {run_id} did not stop within {timeout:g}s (it is {status} at "
                         f"seq {seq}); wait again, or look with `onward runs show {run_id}`")
        self.run_id, self.status, self.seq = run_id, status, seq


# a step's records (ledger/effects.py, ledger/evidence.py)

class EffectFenced(OnwardError):
    """The step's lease was taken over: this holder may not record new effects."""


class EffectConflict(OnwardError):
    """The same effect key was first requested with a different payload."""


class CancelRequested(OnwardError):
    """An operator asked to cancel the run: the step starts no new call and ends the run
    ``cancelled`` once its effects are resolved (docs/operating.md, "Cancel")."""


class EvidenceFenced(OnwardError):
    """The step's lease was taken over (or the run stopped): this holder records nothing."""


# people and operators (ledger/waits.py, ledger/operations.py, ledger/tokens.py, ledger/corpus.py)

class ApprovalRefused(OnwardError):
    """The decision cannot be taken: decided already, expired, wrong approver or artifact."""


class UnknownApproval(OnwardError):
    """No approval with this id exists."""


class UnknownEffect(OperationRefused):
    """No effect with this type and id exists."""


class Unauthenticated(OnwardError):
    """No token, or one that is unknown, expired or revoked: nothing was done."""


class UnknownToken(OperationRefused):
    """No token with this id in the actor's tenant."""


class UnknownCorpus(OperationRefused):
    """No corpus of that name in the actor's tenant."""


# encryption at rest (ledger/crypto.py)

class SealedValueUnreadable(IntegrityViolation):
    """A sealed value that does not open: moved from another tenant, run, seq or field,
    edited, or sealed under a data key that is unknown or was erased. Nothing guesses its
    content: the run that needs it is parked for review."""


class EncryptionUnavailable(OnwardError):
    """Encryption keys are misconfigured, or the ``cryptography`` package is missing."""


# anchors (ledger/anchor.py, ledger/anchor_store.py, ledger/anchoring.py)

class AnchorRefused(IntegrityViolation):
    """An anchor that does not verify: nothing is compared against it."""


class AnchorUnavailable(OnwardError):
    """The anchor location could not be listed, read or written; the cause is chained."""


class RollbackFound(IntegrityViolation):
    """The ledger does not match the latest anchor: no new anchor was written."""

    def __init__(self, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.problems = problems


# processes (ledger/tracing.py)

class TracingUnavailable(OnwardError):
    """ONWARD_OTEL=1 but OpenTelemetry is not installed."""


# the SQL catalogue (ledger/sql/)

class CatalogueError(OnwardError):
    """A malformed ``ledger/sql/*.sql`` file or an unknown statement name: a bug in onward,
    found at import."""
