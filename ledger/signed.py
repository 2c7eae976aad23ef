"""What a keyed MAC covers, for the rows that are not checkpoints.

Each function returns the body that ``CheckpointKeys.sign`` MACs and ``check`` verifies
(HMAC-SHA256 over canonical JSON, with the checkpoint key; stored as ``key_id:mac``). Every
body names its kind under ``"mac"``, so a MAC of one kind never verifies as another, and a
checkpoint body (which has no ``"mac"`` key) is never confused with one of these. The key
never lives in the database: a row edited there cannot get a matching MAC.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from uuid import UUID


def head(run_id: UUID, seq: int, head_hash: str) -> dict[str, Any]:
    """The run's head: the checkpoint it is at. Written by every statement that moves the
    head (start, commit, fork), so the head cannot be pointed back at an earlier checkpoint
    without the key."""
    return {"mac": "head", "run_id": str(run_id), "seq": seq, "head_hash": head_hash}


def money(value: Any) -> Decimal:
    """An amount as the ledger stores it (``Numeric(12, 6)``): what a MAC covers must be the
    value read back, so it is rounded here, before it is written."""
    return Decimal(str(value)).quantize(_MICRO, rounding=ROUND_HALF_UP)


_MICRO = Decimal("0.000001")

EVIDENCE_FIELDS = ("command_id", "kind", "seq", "step", "source", "source_version",
                   "request_hash", "input_tokens", "output_tokens")


def evidence(run_id: UUID, fields: Mapping[Any, Any], response_sha256: str) -> dict[str, Any]:
    """A recorded model answer or read: what was asked (request hash), by which call, what
    came back (the sha256 of its canonical JSON, inline or as an artifact) and what it cost.
    ``fields`` is the evidence row or the record being written (same names)."""
    return {"mac": "evidence", "run_id": str(run_id),
            **{name: fields[name] for name in EVIDENCE_FIELDS},
            "cost_usd": f"{money(fields['cost_usd']):f}", "response_sha256": response_sha256}


def result(run_id: UUID, seq: int, value: Any) -> dict[str, Any]:
    """A finished run's result (``runs.result``), bound to the run and the seq it ended at."""
    return {"mac": "result", "run_id": str(run_id), "seq": seq, "result": value}
