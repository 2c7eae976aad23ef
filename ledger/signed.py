"""What a keyed MAC covers, for the rows that are not checkpoints.

Each function returns the body that ``CheckpointKeys.sign`` MACs and ``check`` verifies
(HMAC-SHA256 over canonical JSON, with the checkpoint key; stored as ``key_id:mac``). Every
body names its kind under ``"mac"``, so a MAC of one kind never verifies as another, and a
checkpoint body (which has no ``"mac"`` key) is never confused with one of these. The key
never lives in the database: a row edited there cannot get a matching MAC.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID


def head(run_id: UUID, seq: int, head_hash: str) -> dict[str, Any]:
    """The run's head: the checkpoint it is at. Written by every statement that moves the
    head (start, commit, fork), so the head cannot be pointed back at an earlier checkpoint
    without the key."""
    return {"mac": "head", "run_id": str(run_id), "seq": seq, "head_hash": head_hash}
