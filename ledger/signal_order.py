"""Which signals a run has consumed, as its checkpoints sign it: a consumed signal made
consumable again in the database (``consumed_seq`` set back to NULL) is not consumed twice.

Every checkpoint a step commits carries, in its refs (under its MAC), the id of the last
signal the run consumed for each signal name (``refs["signals"]``: ``{"run_id": …, "last":
{name: id}}``), copied from the checkpoint it started from and raised when the step was
resumed by a signal. A run consumes the signals of one name in id order: a signal's id is
taken under the run's row lock (ledger/waits.py ``signal_txn``), so ids follow commit order
within a run, and every path that consumes one (the commit that begins a wait, a send, the
reaper) takes the lowest unconsumed id of the name. So a step resumed by a signal whose id
is not above its name's mark was resumed by a signal the run had consumed already: the run
parks ``integrity`` instead of acting on it a second time.

The marks name their run: a replay or branch inherits its parent's checkpoint, whose marks
name the parent's signals, and starts without marks of its own. Checkpoints written before
this existed carry none, so a run is protected from its first signal-resumed step on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

__all__ = ["MARKS_KEY", "carried_marks", "marks_ref", "replayed"]

MARKS_KEY = "signals"


def carried_marks(refs: Mapping[str, Any] | None, run_id: UUID) -> dict[str, int]:
    """The last consumed signal id per name that ``refs`` (a checkpoint's, MAC'd with it)
    records for ``run_id``; empty when it records none, or another run's."""
    found = (refs or {}).get(MARKS_KEY)
    if not isinstance(found, Mapping) or found.get("run_id") != str(run_id):
        return {}
    last = found.get("last")
    if not isinstance(last, Mapping):
        return {}
    return {str(name): value for name, value in last.items()
            if isinstance(value, int) and not isinstance(value, bool)}


def marks_ref(run_id: UUID, marks: Mapping[str, int]) -> dict[str, Any] | None:
    """What a checkpoint's refs record under ``MARKS_KEY`` (None: nothing consumed yet)."""
    return {"run_id": str(run_id), "last": dict(marks)} if marks else None


def replayed(marks: Mapping[str, int], name: str, signal_id: int) -> bool:
    """Whether the signal ``signal_id`` of ``name`` was consumed by the run before: its id
    is not above the last one the run's checkpoints record for the name."""
    last = marks.get(name)
    return last is not None and signal_id <= last
