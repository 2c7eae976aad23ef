"""The rules' preconditions, as named functions.

Hypothesis describes a lambda precondition by parsing its source file (``ast.parse``) when
it checks it, and CPython 3.11 once raised ``SystemError: AST constructor recursion depth
mismatch`` from that parse in CI, which hypothesis reported as a flaky failure of the
model test; a function defined with ``def`` is described by its name, without parsing."""

from __future__ import annotations

from typing import Any

__all__ = [
    "has_messages",
    "has_refs",
    "idle_worker",
    "idle_worker_and_refs",
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
