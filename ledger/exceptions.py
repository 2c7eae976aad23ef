"""Errors raised by the ledger. One base class; each message says what to do."""

from __future__ import annotations


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
