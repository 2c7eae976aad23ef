"""What a keyed MAC covers, for the rows that are not checkpoints.

Each function returns the body that ``CheckpointKeys.sign`` MACs and ``check`` verifies
(HMAC-SHA256 over canonical JSON, with the checkpoint key; stored as ``key_id:mac``). Every
body names its kind under ``"mac"``, so a MAC of one kind never verifies as another, and a
checkpoint body (which has no ``"mac"`` key) is never confused with one of these. The key
never lives in the database: a row edited there cannot get a matching MAC.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from uuid import UUID

__all__ = [
    "AUDIT_FIELDS",
    "DROPPED_COMMENT",
    "EVIDENCE_FIELDS",
    "INTENT_FIELDS",
    "REFUSED_FIELDS",
    "anchor",
    "approval_decision",
    "approval_terms",
    "audit_head",
    "audit_link",
    "audit_row",
    "comment_digest",
    "compacted",
    "dropped_comment",
    "effect_attempt",
    "effect_intent",
    "effect_outcome",
    "evidence",
    "head",
    "launch",
    "micros",
    "money",
    "refused_answer",
    "result",
    "signal",
]


def head(run_id: UUID, seq: int, head_hash: str) -> dict[str, Any]:
    """The run's head: the checkpoint it is at. Written by every statement that moves the
    head (start, commit, fork), so the head cannot be pointed back at an earlier checkpoint
    without the key."""
    return {"mac": "head", "run_id": str(run_id), "seq": seq, "head_hash": head_hash}


def launch(run_id: UUID, fields: Mapping[Any, Any]) -> dict[str, Any]:
    """How a run was launched, which decides what it may do to the outside world: its
    tenant, its mode (None: an ordinary run; evidence, simulation, live, branch), the run
    and checkpoint it was copied from, and whether it may send irreversible effects.
    Written once, when the run is created (start, replay, branch); checked by every claim
    and by ``verify``. ``fields`` is the run's row or the values being inserted."""
    parent = fields["parent_run_id"]
    return {"mac": "launch", "run_id": str(run_id), "tenant_id": fields["tenant_id"],
            "mode": fields["mode"], "parent_run_id": str(parent) if parent else None,
            "parent_seq": fields["parent_seq"],
            "allow_irreversible": bool(fields["allow_irreversible"])}


def signal(signal_id: int, run_id: UUID, name: str, payload: Any) -> dict[str, Any]:
    """A signal as it was sent: which one (its row id: a copied row is another signal, never
    signed), to which run, under which name, with which payload (what the step that consumes
    it reads with ``ctx.signal``). Written by the send; checked when a step or an evidence
    replay reads it, and by ``verify``."""
    return {"mac": "signal", "id": int(signal_id), "run_id": str(run_id), "name": name,
            "payload": payload}


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


REFUSED_FIELDS = ("seq", "command_id", "kind", "source", "request_hash", "answer_sha256",
                  "answer_bytes", "reason", "input_tokens", "output_tokens", "lease_epoch")


def refused_answer(run_id: UUID, fields: Mapping[Any, Any]) -> dict[str, Any]:
    """A model answer or read the ledger refused to record (``refused_answers``): which run,
    seq and call (command id, kind, source, request hash), the answer's sha256 and size, why,
    what it cost and under which lease. Written by the statement that debits it; checked by
    the retried step that finds it (it fails the step without calling again only if it
    verifies) and by ``verify``. ``fields`` is the row or the values being inserted."""
    return {"mac": "refused_answer", "run_id": str(run_id),
            **{name: fields[name] for name in REFUSED_FIELDS},
            "cost_usd": f"{money(fields['cost_usd']):f}"}


def result(run_id: UUID, seq: int, value: Any) -> dict[str, Any]:
    """A finished run's result (``runs.result``), bound to the run and the seq it ended at."""
    return {"mac": "result", "run_id": str(run_id), "seq": seq, "result": value}


AUDIT_FIELDS = ("tenant_id", "actor", "role", "action", "outcome", "reason", "run_id",
                "new_run_id", "effect_id", "approval_id", "before_seq", "after_seq",
                "details", "token_id")


def audit_row(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """One audit row's content (who, what, to which run, why, the outcome), signed by the
    transaction that writes it. Its id and time are covered by the chain (``audit_link``)."""
    return {"mac": "audit", **{name: _plain(fields[name]) for name in AUDIT_FIELDS}}


def audit_link(tenant_id: str, chain_seq: int, row_id: int, at_us: int, row_mac: str | None,
               previous: str | None) -> dict[str, Any]:
    """One link of a tenant's audit chain, written by the sealer in chain order: the row's
    place, id, time (microseconds since the epoch) and own MAC, and the previous link."""
    return {"mac": "audit_link", "tenant_id": tenant_id, "chain_seq": chain_seq,
            "row_id": row_id, "at_us": at_us, "row_mac": row_mac, "previous": previous}


def audit_head(tenant_id: str, chain_seq: int, chain_mac: str | None) -> dict[str, Any]:
    """The last link of a tenant's chain: rows deleted from its end are missed without it."""
    return {"mac": "audit_head", "tenant_id": tenant_id, "chain_seq": chain_seq,
            "chain_mac": chain_mac}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, UUID) else value


def approval_decision(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """A person's decision on an approval: which approval (of which run and seq, for which
    action and artifact hash), approved or rejected, by whom, when, and what they wrote
    (the sha256 of the comment, ``comment_sha256``: a bundle may leave the comment out and
    keep its digest, ``DROPPED_COMMENT``). Written where the decision is taken; a resumed
    step acts on it only if it verifies, and a comment that does not is shown as such."""
    decided_at = fields["decided_at"]
    return {"mac": "approval_decision", "id": str(fields["id"]),
            "run_id": str(fields["run_id"]), "seq": fields["seq"], "action": fields["action"],
            "artifact_hash": fields["artifact_hash"], "status": str(fields["status"]),
            "decided_by": fields["decided_by"],
            "decided_at_us": micros(decided_at) if decided_at is not None else None,
            "comment_sha256": comment_digest(fields["comment"])}


DROPPED_COMMENT = "$dropped sha256:"
"""What a bundle that leaves an approver's comment out keeps in its place: this prefix and
the comment's sha256, which the decision's MAC covers."""


def dropped_comment(comment: str | None) -> str | None:
    """What a comment becomes where it is left out (a bundle, retention): ``DROPPED_COMMENT``
    and its sha256, so the decision that signed it still verifies."""
    if comment is None or comment.startswith(DROPPED_COMMENT):
        return comment
    return f"{DROPPED_COMMENT}{comment_digest(comment)}"


def comment_digest(comment: str | None) -> str | None:
    """The sha256 of an approver's comment as a decision's MAC covers it (None: none)."""
    if comment is None:
        return None
    if comment.startswith(DROPPED_COMMENT):
        return comment[len(DROPPED_COMMENT):]
    return hashlib.sha256(comment.encode()).hexdigest()


def approval_terms(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """What an approval asks and of whom, as the step that asked recorded it: which run,
    seq, step and tenant; the action and the artifact hash it is bound to; who may decide
    (``approvers``) and from when until when (``created_at`` and ``expires_at``). Written
    with the approval (by the commit that asks, or the fork that asks again); approve and
    reject, the step it resumes and ``verify`` check it, so adding an approver or extending
    the expiry in the database is refused."""
    return {"mac": "approval_terms", "id": str(fields["id"]), "run_id": str(fields["run_id"]),
            "tenant_id": fields["tenant_id"], "seq": fields["seq"],
            "workflow_version": fields["workflow_version"], "step": fields["step"],
            "action": fields["action"], "artifact_hash": fields["artifact_hash"],
            "approvers": list(fields["approvers"]),
            "created_at_us": micros(fields["created_at"]),
            "expires_at_us": micros(fields["expires_at"])}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(at: datetime) -> int:
    """A time as a MAC covers it: microseconds since the epoch (time zone free)."""
    return (at - _EPOCH) // timedelta(microseconds=1)


def anchor(header: Mapping[str, Any]) -> dict[str, Any]:
    """An anchor's header (ledger/anchor.py): when it was taken, how many runs it holds and
    the Merkle root over their heads, what it was compared with. Kept outside the ledger."""
    return {"mac": "anchor", **header}


INTENT_FIELDS = ("effect_type", "effect_id", "run_id", "tenant_id", "seq", "step",
                 "command_id", "tool_class", "request_hash")


def effect_intent(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """An effect as it was requested, before any call: which run, step and call asked for
    what. The payload is bound through its request hash (``onward verify`` checks a stored
    payload against it), so a bundle may leave the payload out and still verify; the
    recipient, derived from the payload for display, has a MAC of its own
    (``effect_recipient``)."""
    return {"mac": "effect_intent", **{name: _plain(fields[name]) for name in INTENT_FIELDS}}


def effect_recipient(effect_type: str, effect_id: str, recipient: str) -> dict[str, Any]:
    """Where an effect went, as the column shows it (``effects.recipient``: the text the
    tool derived from the payload, or ``***`` beside a sealed payload), bound to its effect.
    Apart from the intent MAC so that retention or a bundle can drop the text (nothing to
    check then) while the request still verifies."""
    return {"mac": "effect_recipient", "effect_type": effect_type, "effect_id": effect_id,
            "recipient": recipient}


def effect_outcome(effect_type: str, effect_id: str, status: str, provider_ref: str | None,
                   result: Any) -> dict[str, Any]:
    """What an effect came to (completed or failed): the provider's reference and the
    result a re-executed step or an evidence replay is answered with. (The provider's error
    text is informative, not signed: a bundle may leave it out.)"""
    return {"mac": "effect_outcome", "effect_type": effect_type, "effect_id": effect_id,
            "status": status, "provider_ref": provider_ref, "result": result}


def effect_attempt(effect_type: str, effect_id: str, attempt: int, kind: str,
                   idempotency_key: str, outcome: str | None,
                   provider_ref: str | None) -> dict[str, Any]:
    """One call, lookup, status poll or repeat as it ended: its kind, the key it sent, and
    what it learnt (outcome, the provider's reference; the error text is not signed)."""
    return {"mac": "effect_attempt", "effect_type": effect_type, "effect_id": effect_id,
            "attempt": attempt, "kind": kind, "idempotency_key": idempotency_key,
            "outcome": outcome, "provider_ref": provider_ref}


def compacted(run_id: UUID, seq: int, checkpoint_hash: str, state_sha256: str) -> dict[str, Any]:
    """A checkpoint whose state retention dropped (ledger/retention.py): its hash (the MAC
    of the body it had) and the sha256 of the state that body signed, sealed when the
    checkpoint still verified. Verify accepts the checkpoint as compacted on this seal, and
    an edit of the digest or the hash fails it."""
    return {"mac": "compacted", "run_id": str(run_id), "seq": seq, "hash": checkpoint_hash,
            "state_sha256": state_sha256}


def compacted_value(kind: str, identity: Mapping[str, Any], value_sha256: str) -> dict[str, Any]:
    """A value retention dropped whose own MAC covers the value itself (an effect's result,
    a signal's payload, a run's result; ledger/compacted.py): what it was part of
    (``identity``, which names that MAC) and the sha256 of the value, sealed when the run
    still verified. Verify accepts the value as compacted on this seal."""
    return {"mac": "compacted_value", "kind": kind,
            **{key: _plain(value) for key, value in identity.items()},
            "value_sha256": value_sha256}
