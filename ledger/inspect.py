"""Deprecated alias (issue 12): this module is ``ledger/inspection.py`` (a module named
``inspect`` shadows the standard library's). Kept for one landing window."""

from ledger.inspection import *  # noqa: F403
from ledger.inspection import RunFilter  # noqa: F401
