"""Shared pieces of the ``test_first_step`` deploys (tests/versions/first_step_v*.py): a
payment provider that dedupes by key and can lose the answer of a call that acted.

Version 1 names the payment by its ordinal (``pay@0#1``), version 2 by a business key
(``key="invoice-<to>"``): the two versions' first steps send the same payment under
different idempotency keys, so a retry of v2's step run by v1 would pay twice.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks.tools import Tool, ToolResult

OBJECTS: list[dict[str, Any]] = []  # what the provider holds: one per payment made
LOSE_NEXT_ANSWER: list[bool] = []  # pop one: the next call acts, then its answer is lost


class Money(BaseModel):
    amount: int
    to: str = "acme"


def _found(key: str) -> ToolResult | None:
    for made in OBJECTS:
        if made["key"] == key:
            return ToolResult("completed", made["id"], {"id": made["id"]})
    return None


def _pay(payload: dict[str, Any], key: str) -> ToolResult:
    made = _found(key)
    if made is None:
        OBJECTS.append({"id": f"pay_{len(OBJECTS) + 1}", "key": key, "payload": payload})
        made = _found(key)
    assert made is not None
    if LOSE_NEXT_ANSWER and LOSE_NEXT_ANSWER.pop():
        raise TimeoutError("read timed out (the payment was made)")
    return made


pay = Tool("test.first_step_pay", ToolClass.IRREVERSIBLE, call=_pay, lookup=_found)
