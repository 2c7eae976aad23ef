"""What retention leaves of a payload (ledger/retention.py): ``{"$compacted": {"sha256": …}}``
in place of the value, and a seal where the record's own MAC covers the value itself.

* An evidence response: its MAC already covers the response's sha256, so the digest alone
  lets verify check the MAC in full (``response_digest``).
* An effect's result, a signal's payload, a run's result: their MACs cover the value, so the
  marker carries a seal (``signed.compacted_value``) over the digest and what names that
  MAC, written only after the run verified (``sealed``); verify accepts the value as
  compacted on the seal (``is_sealed``). A marker whose seal does not verify is read as an
  ordinary value, whose MAC then fails: an edit is reported, a genuine value of that shape
  still verifies.
* Effect payloads and approval artifacts become ``{"$dropped": true}`` as in a bundle
  (ledger/bundle.py): they are bound through the request hash and artifact hash their
  MACs sign.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger import signed
from ledger.checkpoints import CheckpointKeys, covered_json, sha256_hex
from ledger.exceptions import IntegrityViolation

__all__ = [
    "KEY",
    "digest_of",
    "effect_identity",
    "is_sealed",
    "marker",
    "result_identity",
    "sealed",
    "signal_identity",
]

KEY = "$compacted"


def marker(digest: str) -> dict[str, Any]:
    """What a value whose digest its record's MAC signs becomes."""
    return {KEY: {"sha256": digest}}


def digest_of(stored: Any) -> str | None:
    """The sha256 a compacted value's marker keeps, or None for anything else."""
    if isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(KEY), dict):
        digest = stored[KEY].get("sha256")
        return digest if isinstance(digest, str) else None
    return None


def sealed(keys: CheckpointKeys, kind: str, identity: Mapping[str, Any],
           value: Any) -> dict[str, Any]:
    """``value``'s marker with a seal over its digest and ``identity``."""
    digest = sha256_hex(covered_json(value))
    return {KEY: {"sha256": digest,
                  "seal": keys.sign(signed.compacted_value(kind, identity, digest))}}


def is_sealed(keys: CheckpointKeys, kind: str, identity: Mapping[str, Any],
              stored: Any) -> bool:
    """Whether ``stored`` is a compacted value whose seal verifies for ``identity``."""
    digest = digest_of(stored)
    seal = stored[KEY].get("seal") if digest is not None else None
    if digest is None or not isinstance(seal, str):
        return False
    try:
        keys.check(signed.compacted_value(kind, identity, digest), seal, f"compacted {kind}")
    except IntegrityViolation:
        return False
    return True


def effect_identity(effect: Any) -> dict[str, Any]:
    """What an effect's compacted result is sealed with: the effect and its outcome MAC."""
    return {"effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "status": str(getattr(effect.status, "value", effect.status)),
            "provider_ref": effect.provider_ref, "outcome_mac": effect.outcome_mac}


def signal_identity(row: Mapping[Any, Any]) -> dict[str, Any]:
    """What a signal's compacted payload is sealed with: the signal and its MAC (which
    names the run, the name and the payload)."""
    return {"run_id": str(row["run_id"]), "name": row["name"], "signal_mac": row["mac"]}


def result_identity(run: Mapping[Any, Any]) -> dict[str, Any]:
    return {"run_id": str(run["id"]), "seq": run["seq"], "result_mac": run["result_mac"]}
