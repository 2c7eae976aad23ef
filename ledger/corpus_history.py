"""What a run did, as an offline replay compares it (docs/corpus.md#the-report): its
checkpoints (with states stored apart resolved), the calls each step made, and how it
ended. Read from the scratch ledger, for the recorded run and for its replay alike."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.checkpoints import artifact_ref, canonical_json, sha256_hex
from ledger.crypto import Keyring, is_sealed
from ledger.effects import effect_field
from ledger.evidence import request_field
from ledger.exceptions import IntegrityViolation
from ledger.schema import artifacts, effects, evidence, runs
from ledger.states import checkpoint_rows_txn, state_of

__all__ = ["Call", "Checkpoint", "History", "read_history_txn", "recorded_request_txn"]


@dataclass(frozen=True)
class Call:
    """One model call, read or effect of a step, in the order the step made it."""

    kind: str  # llm, read, effect
    command_id: str
    request_hash: str | None
    name: str | None = None  # the effect type (tool) or evidence source (model, tool)
    effect_id: str | None = None


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    step: str | None
    next_step: str | None
    outcome: str
    state: dict[str, Any]
    control: dict[str, Any] | None
    workflow_version: int | None
    calls: tuple[Call, ...] | None  # None: the checkpoint names no calls (older envelope)
    migrated_from: dict[str, Any] | None = None
    sealed: frozenset[str] = frozenset()  # state fields stored sealed, opened for comparing


@dataclass(frozen=True)
class History:
    run_id: UUID
    tenant_id: str
    workflow: str
    workflow_version: int | None
    status: str
    seq: int
    step: str | None
    result: Any
    last_error: dict[str, Any] | None
    parked_reason: str | None
    checkpoints: dict[int, Checkpoint]
    table_calls: dict[int, list[Call]] = field(default_factory=dict)  # by the seq they ran at
    sealed_result: bool = False  # the result was stored sealed, opened for comparing

    @property
    def first_seq(self) -> int:
        return min(self.checkpoints)

    def calls_at(self, seq: int) -> tuple[Call, ...] | None:
        """The calls of the step that ran from checkpoint ``seq`` (and produced ``seq + 1``):
        what that checkpoint names, else what the ledger recorded at ``seq``."""
        produced = self.checkpoints.get(seq + 1)
        if produced is not None and produced.calls is not None:
            return produced.calls
        recorded = self.table_calls.get(seq)
        return tuple(recorded) if recorded is not None else None


def read_history_txn(conn: Connection, run_id: UUID, *, with_tables: bool = True) -> History:
    """The run and its checkpoints; with ``with_tables``, also its evidence and effects by
    seq when a checkpoint does not name the calls of its step itself (older envelopes)."""
    run = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().one()
    rows = checkpoint_rows_txn(conn, run_id)
    states = _artifact_states(conn, rows)
    history = History(
        run_id=run_id, tenant_id=run["tenant_id"], workflow=run["workflow"],
        workflow_version=run["workflow_version"], status=run["status"], seq=run["seq"],
        step=run["step"], result=run["result"], last_error=run["last_error"],
        parked_reason=run["parked_reason"],
        checkpoints={row["seq"]: _checkpoint(row, states) for row in rows})
    if with_tables and any(cp.calls is None for cp in history.checkpoints.values()
                           if cp.seq > history.first_seq):
        history.table_calls.update(_table_calls(conn, run_id))
    return history


def _checkpoint(row: Mapping[str, Any], states: dict[str, dict[str, Any]]) -> Checkpoint:
    ref = artifact_ref(row["state"])
    refs = row["refs"]
    return Checkpoint(
        seq=row["seq"], step=row["step"], next_step=row["next_step"], outcome=row["outcome"],
        state=states[ref["sha256"]] if ref else state_of(row), control=row["control"],
        workflow_version=row["workflow_version"], calls=_ref_calls(refs),
        migrated_from=(refs or {}).get("migrated_from"))


def _ref_calls(refs: dict[str, Any] | None) -> tuple[Call, ...] | None:
    if refs is None or ("evidence" not in refs and "effects" not in refs):
        return None
    used = [Call(e["kind"], e["command_id"], e.get("request_hash"))
            for e in refs.get("evidence") or []]
    used += [Call("effect", e["command_id"], None, e.get("effect_type"), e.get("effect_id"))
             for e in refs.get("effects") or []]
    return tuple(used)


def _artifact_states(conn: Connection,
                     rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    wanted = [ref["sha256"] for ref in (artifact_ref(r["state"]) for r in rows) if ref]
    if not wanted:
        return {}
    found = conn.execute(sa.select(artifacts.c.sha256, artifacts.c.body)
                         .where(artifacts.c.sha256.in_(wanted))).all()
    return {sha: json.loads(bytes(body)) for sha, body in found}


def _table_calls(conn: Connection, run_id: UUID) -> dict[int, list[Call]]:
    calls: dict[int, list[Call]] = {}
    for row in conn.execute(
            sa.select(evidence.c.seq, evidence.c.kind, evidence.c.command_id,
                      evidence.c.request_hash, evidence.c.source)
            .where(evidence.c.run_id == run_id)
            .order_by(evidence.c.seq, evidence.c.created_at)):
        calls.setdefault(row.seq, []).append(
            Call(row.kind, row.command_id, row.request_hash, row.source))
    for row in conn.execute(
            sa.select(effects.c.seq, effects.c.command_id, effects.c.request_hash,
                      effects.c.effect_type, effects.c.effect_id)
            .where(effects.c.run_id == run_id)
            .order_by(effects.c.seq, effects.c.created_at)):
        calls.setdefault(row.seq, []).append(
            Call("effect", row.command_id, row.request_hash, row.effect_type, row.effect_id))
    return calls


def recorded_request_txn(conn: Connection, run_id: UUID, kind: str, command_id: str, *,
                         crypt: Keyring | None = None, tenant: str = "") -> tuple[bool, Any]:
    """What the recorded call ``command_id`` of ``run_id`` asked: (kept, request). A model
    call or read is kept as the artifact its request hash names, or (encryption keys) sealed
    in its evidence row; an effect as its payload (unless the tool's policy or the bundle
    left it out). A sealed request is returned sealed, or, given ``crypt`` (a reader allowed
    to see sealed values: ``onward corpus replay --show-sealed``), opened at its place in
    ``tenant`` and checked against the request hash the call's MAC signs; raises
    SealedValueUnreadable for one that does not open there (moved, edited, erased) and
    IntegrityViolation for one that is not what its hash names."""
    if kind == "effect":
        found = conn.execute(sa.select(
            effects.c.payload, effects.c.seq, effects.c.request_hash, effects.c.effect_type,
            effects.c.effect_id).where(effects.c.run_id == run_id,
                                       effects.c.command_id == command_id)).mappings().first()
        if found is None or found["payload"] in (None, {"$dropped": True}):
            return False, None
        field = effect_field(found["effect_type"], found["effect_id"], "payload")
    else:
        found = conn.execute(
            sa.select(evidence.c.request.label("payload"), evidence.c.seq,
                      evidence.c.request_hash, artifacts.c.body)
            .outerjoin(artifacts, evidence.c.request_hash == artifacts.c.sha256)
            .where(evidence.c.run_id == run_id, evidence.c.command_id == command_id)
        ).mappings().first()
        if found is not None and found["body"] is not None:
            return True, json.loads(bytes(found["body"]))
        if found is None or found["payload"] is None:
            return False, None
        field = request_field(command_id)
    if crypt is None or not is_sealed(found["payload"]):
        return True, found["payload"]
    request = crypt.open(found["payload"], tenant=tenant, run_id=run_id, field=field,
                         seq=found["seq"])
    if sha256_hex(canonical_json(request)) != found["request_hash"]:
        raise IntegrityViolation(f"the sealed request of {kind} call {command_id} (run "
                                 f"{run_id}) is not what its signed request hash names")
    return True, request
