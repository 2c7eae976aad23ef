"""The rules' preconditions, as named functions.

Hypothesis describes a lambda precondition by parsing its source file (``ast.parse``) when
it checks it, and CPython 3.11 once raised ``SystemError: AST constructor recursion depth
mismatch`` from that parse in CI, which hypothesis reported as a flaky failure of the
model test; a function defined with ``def`` is described by its name, without parsing."""

from __future__ import annotations

from typing import Any
from uuid import UUID

__all__ = [
    "has_messages",
    "has_refs",
    "idle_worker",
    "idle_worker_and_refs",
    "no_worker_inside",
    "open_effect",
    "sealed_book",
    "suspended_and_idle",
    "suspended_worker",
    "unsettled",
]


def has_refs(machine: Any) -> bool:
    return bool(machine.refs > 0)


def idle_worker_and_refs(machine: Any) -> bool:
    return has_refs(machine) and idle_worker(machine)


def has_messages(machine: Any) -> bool:
    return bool(machine.broker.messages)


def suspended_worker(machine: Any) -> bool:
    return any(w.suspended for w in machine.workers)


def idle_worker(machine: Any) -> bool:
    return any(w.idle for w in machine.workers)


def suspended_and_idle(machine: Any) -> bool:
    return suspended_worker(machine) and idle_worker(machine)


def sealed_book(machine: Any) -> bool:
    return bool(machine.book.sealed)


def unsettled(machine: Any) -> bool:
    return not machine.settled


def no_worker_inside(machine: Any, run_id: UUID) -> bool:
    """No worker is stopped inside a step of ``run_id`` (at a fault point, in a hung call):
    such a worker holds a claim of the run, the head it restored in memory, and the lease
    epoch that fences its commit, even after its lease lapsed and the reaper cleared the
    owner (a requeue does not move the epoch; only the next claim does). A rule that
    rewrites the run's head in place (``newer_control``) must not pick it: the worker's
    commit would chain onto the head it restored, not the rewritten one, which no real
    process can bring about (nothing in onward rewrites a run's head at its seq: a newer
    onward writes one by committing it, under a claim that fences the older one out)."""
    return not any(w.suspended and w.run_id == run_id for w in machine.workers)


def open_effect(machine: Any) -> bool:
    """Some run has an effect not resolved yet (pending or accepted): a fork beside it."""
    row = machine.env.checker.execute(
        "SELECT EXISTS (SELECT 1 FROM onward.effects WHERE status IN ('pending', 'accepted'))"
    ).fetchone()
    return bool(row is not None and row[0])
