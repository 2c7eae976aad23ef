"""Errors of the command line and the web console. All derive from ``OnwardError``
(``ledger/exceptions.py``)."""

from __future__ import annotations

from ledger.exceptions import InvalidInput

__all__ = ["ArtifactNotShown"]


class ArtifactNotShown(InvalidInput):
    """The artifact could not be shown in full, so it cannot be decided here."""
