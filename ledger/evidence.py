"""Evidence: recorded model calls and reads, and the content-addressed artifacts that hold
large bodies. A re-executed step gets the recorded response for the same ``command_id``.

Recording an answer debits its tokens and cost from the run's budgets in the same
statement, under the step's lease: what was paid is spent whether or not the step ever
commits (a crash, an error, a refusal), so no restore refills a budget.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from ledger import compacted, signed, sql
from ledger.artifact_sweep import ARTIFACT_LOCK
from ledger.checkpoints import CheckpointKeys, canonical_json, covered_json, sha256_hex
from ledger.crypto import Place, open_value, seal_value
from ledger.exceptions import (
    CancelRequested,
    EvidenceFenced,
    IntegrityViolation,
    InvalidInput,
    OnwardError,
    OperationRefused,
)
from ledger.hot import HotConnection

__all__ = ["INLINE_LIMIT", "Evidence", "EvidenceRecord", "EvidenceStore", "checked_response",
           "request_field"]


INLINE_LIMIT = 8 * 1024
"""Responses larger than this (canonical JSON bytes) go to an artifact."""


@dataclass(frozen=True)
class Evidence:
    run_id: UUID
    command_id: str
    kind: str
    seq: int
    step: str
    source: str
    source_version: str | None
    request_hash: str
    response: Any
    artifact_sha256: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: Decimal
    created_at: datetime


@dataclass(frozen=True)
class EvidenceRecord:
    run_id: UUID
    command_id: str
    kind: str
    seq: int
    step: str
    source: str
    source_version: str | None
    request_hash: str
    response: Any
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    lease_epoch: int = 0
    # what was asked, so a replay can show how a changed request differs (docs/corpus.md):
    # kept as the artifact its request hash names, or sealed in the row with encryption
    # keys (``request_field``); None keeps nothing
    request: Any = None
    tenant_id: str | None = None  # the run's; binds a sealed response (ledger/crypto.py)


@dataclass(frozen=True)
class Refusal:
    """An answer to a call that was paid for but could not be recorded (debited and refused
    by ``EvidenceStore.refuse``): what a retried attempt finds instead of an answer, so it
    fails the step again without calling again."""

    command_id: str
    kind: str
    source: str
    reason: str
    answer_sha256: str | None
    answer_bytes: int | None
    tokens: int
    cost_usd: Decimal


_FIND = sql.statement("find_evidence")
_FIND_OR_COVER = sql.statement("find_evidence_or_cover_call")
_RECORD = sql.statement("record_evidence")
_DEBIT_LATE = sql.statement("debit_late_answer")
_DEBIT = sql.statement("debit_unrecorded_answer")


def _signs(keys: CheckpointKeys, row: Mapping[Any, Any], digest: str, what: str) -> bool:
    try:
        keys.check(signed.evidence(row["run_id"], row, digest), row["mac"], what)
    except IntegrityViolation:
        return False
    return True


def checked_response(keys: CheckpointKeys, row: Mapping[Any, Any], *,
                     compacted_ok: bool = False) -> Any:
    """The response an evidence row records, once its MAC verifies: a body stored as an
    artifact must hash to the row's ``artifact_sha256``, and the row (call, request, the
    response's sha256, cost) must match its MAC. Raises IntegrityViolation otherwise. A
    response retention compacted (its digest kept, ledger/compacted.py) verifies on its MAC
    as well; it is returned as its marker when ``compacted_ok`` (verify), else refused
    (OperationRefused): nothing is answered with it."""
    what = f"evidence {row['command_id']} of run {row['run_id']}"
    kept = compacted.digest_of(row["response"]) if row["artifact_sha256"] is None else None
    if kept is not None and _signs(keys, row, kept, what):  # retention dropped the response
        if compacted_ok:
            return row["response"]
        raise OperationRefused(f"{what}: its response was compacted by retention "
                               "(docs/operating.md#retention): there is nothing to answer with")
    if row["artifact_sha256"] is None:
        response = row["response"]
        digest = sha256_hex(covered_json(response))
    else:
        body = bytes(row["artifact_body"]) if row["artifact_body"] is not None else None
        if body is None or sha256_hex(body) != row["artifact_sha256"]:
            raise IntegrityViolation(f"{what}: its artifact {row['artifact_sha256'][:12]}… is "
                                     "missing or does not match its sha256")
        response, digest = json.loads(body), row["artifact_sha256"]
    keys.check(signed.evidence(row["run_id"], row, digest), row["mac"], what)
    return response


def evidence_field(command_id: str) -> str:
    """The field a sealed recorded answer is bound to (ledger/crypto.py)."""
    return f"evidence:{command_id}:response"


def request_field(command_id: str) -> str:
    """The field a sealed recorded request (``evidence.request``) is bound to."""
    return f"evidence:{command_id}:request"


class EvidenceStore:
    def __init__(self, conn: HotConnection, *, max_artifact_bytes: int,
                 keys: CheckpointKeys, max_json_depth: int | None = None) -> None:
        self.conn = conn
        self.max_artifact_bytes = max_artifact_bytes
        self.keys = keys
        self.max_json_depth = max_json_depth

    def find(self, run_id: UUID, command_id: str) -> Evidence | None:
        """The recorded answer to ``command_id``, or None; raises IntegrityViolation when it
        does not verify (never answers with an edited record)."""
        row = self.conn.one(_FIND, {"run_id": run_id, "command_id": command_id})
        return self._evidence(row) if row is not None else None

    def find_or_cover(self, run_id: UUID, command_id: str, *, epoch: int,
                      cover_s: float) -> Evidence | Refusal | None:
        """The recorded answer to ``command_id``; the standing Refusal of an answer to it
        that could not be recorded (the call is not made again); or None, once the live
        lease of ``epoch`` was extended to cover ``cover_s`` (the call's time limit and a
        margin) in the same statement, so the caller may make the call. Raises
        CancelRequested once the run's cancel was requested, EvidenceFenced when the lease
        is no longer live (the call is not started), IntegrityViolation for a record that
        does not verify."""
        row = self.conn.one(_FIND_OR_COVER, {"run_id": run_id, "command_id": command_id,
                                             "epoch": epoch, "cover_s": cover_s})
        if row is not None and row["command_id"] is not None:
            return self._evidence(row)
        if row is not None and row["refused_reason"] is not None:
            self._check_refusal(run_id, command_id, row)
            return Refusal(command_id=command_id, kind=row["refused_kind"],
                           source=row["refused_source"], reason=row["refused_reason"],
                           answer_sha256=row["refused_sha256"],
                           answer_bytes=row["refused_bytes"], tokens=row["refused_tokens"],
                           cost_usd=row["refused_cost_usd"])
        if row is not None and row["covered_until"] is not None:
            return None
        if row is not None and row["cancelling"]:
            raise CancelRequested(f"run {run_id} is being cancelled: {command_id} is not called")
        raise EvidenceFenced(f"run {run_id}: the lease of epoch {epoch} is no longer live; "
                             f"{command_id} is not called")

    def _check_refusal(self, run_id: UUID, command_id: str, row: dict[str, Any]) -> None:
        """Raise IntegrityViolation unless the standing refusal ``find_or_cover`` returned
        (its ``refused_*`` columns) is as the debit that recorded it signed it: an edited or
        inserted refusal would fail the step without the call ever being refused."""
        fields = {name: row[f"refused_{name}"] for name in signed.REFUSED_FIELDS
                  if name not in ("command_id", "answer_sha256", "answer_bytes")}
        fields.update(command_id=command_id, answer_sha256=row["refused_sha256"],
                      answer_bytes=row["refused_bytes"], cost_usd=row["refused_cost_usd"])
        self.keys.check(signed.refused_answer(run_id, fields), row["refused_mac"],
                        f"the refusal of the answer to {command_id} (run {run_id})")

    def _evidence(self, row: dict[str, Any]) -> Evidence:
        response = open_value(self.keys.crypt, checked_response(self.keys, row),
                              tenant=row.get("tenant_id") or "", run_id=row["run_id"],
                              seq=row["seq"], field=evidence_field(row["command_id"]))
        return Evidence(
            run_id=row["run_id"], command_id=row["command_id"], kind=row["kind"],
            seq=row["seq"], step=row["step"], source=row["source"],
            source_version=row["source_version"], request_hash=row["request_hash"],
            response=response, artifact_sha256=row["artifact_sha256"],
            input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
            cost_usd=row["cost_usd"], created_at=row["created_at"],
        )

    def record(self, record: EvidenceRecord) -> Evidence:
        """Record evidence and debit its spend from the run, under the lease; if another
        attempt recorded this command first, return theirs. Raises EvidenceFenced when the
        lease of ``record.lease_epoch`` is no longer held, InvalidInput (before writing
        anything) for an answer the ledger cannot keep: not plain JSON, a NUL character,
        nested too deeply or too large."""
        body = canonical_json(record.response, max_depth=self.max_json_depth)
        if len(body) > self.max_artifact_bytes:
            raise InvalidInput(f"{record.kind} response of {len(body)} bytes exceeds the artifact "
                               f"limit of {self.max_artifact_bytes} bytes "
                               "(ONWARD_MAX_ARTIFACT_BYTES)")
        stored = record.response
        if self.keys.crypt is not None:  # sealed, kept inline (never a shared artifact)
            stored = seal_value(self.keys.crypt, record.response, Place(
                record.tenant_id or "", record.run_id, record.seq,
                evidence_field(record.command_id)))
            big, digest = False, sha256_hex(covered_json(stored))
        else:
            big, digest = len(body) > INLINE_LIMIT, sha256_hex(body)
        cost = signed.money(record.cost_usd)
        request = self._kept_request(record)
        sealing = self.keys.crypt is not None and request is not None
        row = self.conn.one(_RECORD, {
            "run_id": record.run_id, "command_id": record.command_id, "kind": record.kind,
            "seq": record.seq, "step": record.step, "source": record.source,
            "source_version": record.source_version, "request_hash": record.request_hash,
            "response": None if big else Jsonb(stored),
            "sha": digest if big else None,
            "size": len(body), "body": body if big else None,
            "input_tokens": record.input_tokens, "output_tokens": record.output_tokens,
            "cost_usd": cost, "epoch": record.lease_epoch,
            "mac": self.keys.sign(signed.evidence(record.run_id, vars(record), digest)),
            "request_body": None if sealing else request,
            "request": Jsonb(seal_value(self.keys.crypt, record.request, Place(
                record.tenant_id or "", record.run_id, record.seq,
                request_field(record.command_id)))) if sealing else None,
            "artifact_lock": ARTIFACT_LOCK,
        })
        if row is None or not row["held"]:
            raise EvidenceFenced(f"run {record.run_id}: the lease of epoch {record.lease_epoch} "
                                 f"at seq {record.seq} is no longer held; {record.kind} "
                                 f"{record.command_id} not recorded")
        if row["created_at"] is None:  # recorded by an earlier holder: theirs stands
            found = self.find(record.run_id, record.command_id)
            if found is None:
                raise OnwardError(f"evidence {record.command_id} could not be recorded")
            return found
        return Evidence(
            run_id=record.run_id, command_id=record.command_id, kind=record.kind,
            seq=record.seq, step=record.step, source=record.source,
            source_version=record.source_version, request_hash=record.request_hash,
            response=json.loads(body) if big else record.response,
            artifact_sha256=digest if big else None,
            input_tokens=record.input_tokens, output_tokens=record.output_tokens,
            cost_usd=row["cost_usd"], created_at=row["created_at"],
        )

    def _kept_request(self, record: EvidenceRecord) -> bytes | None:
        """The request's canonical bytes when it is kept: within the artifact limit, and
        hashing to the request hash it will be found by. Without encryption keys they are
        the shared artifact that hash names; with keys the request is sealed in the row
        instead (never a shared, plain artifact)."""
        if record.request is None:
            return None
        try:
            body = canonical_json(record.request, max_depth=self.max_json_depth)
        except InvalidInput:
            return None
        if len(body) > self.max_artifact_bytes or sha256_hex(body) != record.request_hash:
            return None
        return body

    def debit_late(self, record: EvidenceRecord) -> None:
        """Debit the spend of an answer that arrived after the lease of its call was lost
        (``record`` raised EvidenceFenced): paid for, never used, counted all the same."""
        self.conn.one(_DEBIT_LATE, {
            "run_id": record.run_id, "tokens": record.input_tokens + record.output_tokens,
            "cost_usd": signed.money(record.cost_usd)})

    def refuse(self, record: EvidenceRecord, reason: str) -> bool:
        """Debit the spend of an answer that was paid for but could not be recorded
        (``record`` raised InvalidInput) and record the refusal, in one statement under the
        same lease: the call, the answer's sha256 and size when they can be taken (never its
        bytes) and ``reason``. A retried attempt finds it (``find_or_cover``) and does not
        call again. False when the lease is no longer held (nothing written)."""
        digest, size = fingerprint(record.response)
        refused = {"seq": record.seq, "command_id": record.command_id, "kind": record.kind,
                   "source": _storable(record.source), "request_hash": record.request_hash,
                   "answer_sha256": digest, "answer_bytes": size,
                   "reason": _storable(reason)[:2000], "input_tokens": record.input_tokens,
                   "output_tokens": record.output_tokens, "lease_epoch": record.lease_epoch,
                   "cost_usd": signed.money(record.cost_usd)}
        row = self.conn.one(_DEBIT, {
            **refused, "run_id": record.run_id, "epoch": record.lease_epoch,
            "tokens": record.input_tokens + record.output_tokens,
            "mac": self.keys.sign(signed.refused_answer(record.run_id, refused)),
        })
        return row is not None


def fingerprint(response: Any) -> tuple[str | None, int | None]:
    """The sha256 and size of an answer the ledger refused, as JSON with sorted keys and
    every character kept (a NUL too); (None, None) when it is not even that."""
    try:
        body = json.dumps(response, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError):
        return None, None
    return sha256_hex(body), len(body)


def _storable(text: str) -> str:
    """Text PostgreSQL can keep: a NUL shown as ``\\0``."""
    return text.replace("\x00", "\\0")
