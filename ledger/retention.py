"""Retention that keeps history verifiable (issue 15 item 5; docs/operating.md#retention).

A policy says how many days a terminal run (completed, failed, cancelled) keeps its
checkpoint states after it finished, per tenant and workflow
(``ONWARD_RETENTION_POLICIES``). Compaction drops a checkpoint's state (or delta) and keeps
its hash (the MAC of the body it had), the sha256 of the state that body signed, and a seal
(``signed.compacted``) over the three, written only after the whole run verified. Verify
then accepts the checkpoint as compacted on its seal, still checks the chain of hashes, and
reports an edit of the digest or the hash. Runs on legal hold (``runs.legal_hold``) or
pinned in a corpus are never compacted.

Compaction runs one run per transaction, so ``apply`` can stop anywhere and be run again
(what is left is found by the next plan); each compacted run gets an audit row.
Not done here (docs/operating.md#retention says so): evidence, effect payloads and approval
artifacts are kept; artifacts a compacted snapshot referenced are kept
(content-addressed, possibly shared). Attempts expire by month, a partition at a time
(ledger/partitions.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ledger import signed, sql
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointBody, CheckpointKeys, canonical_json, sha256_hex
from ledger.db import wrap_driver_errors
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.schema import checkpoints, corpus_runs, runs
from ledger.states import checkpoint_rows_txn
from ledger.vocabulary import AuditAction, AuditOutcome, Role, RunStatus

__all__ = [
    "REAPER_ACTOR",
    "TERMINAL",
    "Applied",
    "Candidate",
    "Plan",
    "Policy",
    "apply",
    "candidates_txn",
    "compact_run_txn",
    "compacted_problem",
    "days_for",
    "parse_policies",
    "plan_txn",
]


TERMINAL = (RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value)
REAPER_ACTOR = "onward-reaper"


@dataclass(frozen=True)
class Policy:
    tenant: str  # "*": any
    workflow: str  # "*": any
    days: float

    @property
    def specificity(self) -> int:
        return (self.tenant != "*") * 2 + (self.workflow != "*")


def parse_policies(text: str) -> list[Policy]:
    """``tenant/workflow=days,...`` (``*`` for any); InvalidInput saying what is wrong."""
    policies = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        scope, sep, days = entry.partition("=")
        tenant, slash, workflow = scope.strip().partition("/")
        try:
            value = float(days)
        except ValueError:
            value = -1.0
        if not sep or not slash or not tenant or not workflow or value < 0:
            raise InvalidInput(f"retention policy {entry!r} must look like "
                               "'tenant/workflow=days' ('*' for any tenant or workflow)")
        policies.append(Policy(tenant, workflow.strip(), value))
    return policies


def days_for(policies: list[Policy], tenant: str, workflow: str) -> float | None:
    """How many days a terminal run of ``tenant`` and ``workflow`` keeps its states: the
    most specific policy naming it (tenant over workflow over neither); None: forever."""
    matching = [p for p in policies if p.tenant in ("*", tenant)
                and p.workflow in ("*", workflow)]
    return max(matching, key=lambda p: p.specificity).days if matching else None


_CANDIDATES = sql.text("retention_candidates")


@dataclass(frozen=True)
class Candidate:
    run_id: UUID
    tenant_id: str
    workflow: str
    held: bool
    pinned: bool
    checkpoints: int
    bytes: int


@dataclass
class Plan:
    """What a policy would compact now, and what it keeps although it is due."""

    runs: int = 0
    checkpoints: int = 0
    bytes: int = 0  # the states' stored sizes (after TOAST compression)
    held: int = 0  # due, kept: legal hold
    pinned: int = 0  # due, kept: in a regression corpus
    run_ids: list[UUID] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "checkpoints": self.checkpoints, "bytes": self.bytes,
                "held": self.held, "pinned": self.pinned}


def candidates_txn(conn: Connection, policies: list[Policy], *, after: UUID | None = None,
                   limit: int = 1000) -> list[Candidate]:
    """Terminal runs past their policy's days with checkpoints not yet compacted, by id,
    held and pinned ones included (flagged)."""
    found: dict[UUID, Candidate] = {}
    for policy in policies:
        rows = conn.execute(_CANDIDATES, {
            "terminal": list(TERMINAL), "days": policy.days, "tenant": policy.tenant,
            "workflow": policy.workflow, "after": after, "limit": limit}).mappings()
        for row in rows:
            if days_for(policies, row["tenant_id"], row["workflow"]) != policy.days:
                continue  # a more specific policy governs this run
            found[row["id"]] = Candidate(row["id"], row["tenant_id"], row["workflow"],
                                         row["held"], row["pinned"], row["checkpoints"],
                                         int(row["bytes"]))
    return [found[k] for k in sorted(found)][:limit]


def plan_txn(conn: Connection, policies: list[Policy]) -> Plan:
    """A dry run: what ``apply`` would compact now."""
    plan, after = Plan(), None
    while batch := candidates_txn(conn, policies, after=after):
        for found in batch:
            if found.held:
                plan.held += 1
            elif found.pinned:
                plan.pinned += 1
            else:
                plan.runs += 1
                plan.checkpoints += found.checkpoints
                plan.bytes += found.bytes
                plan.run_ids.append(found.run_id)
        after = batch[-1].run_id
    return plan


def compact_run_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> int:
    """Compact every checkpoint of ``run_id`` in the caller's transaction, after checking
    that its history verifies (IntegrityViolation if not: nothing is dropped from a history
    under suspicion); the number of checkpoints compacted. Refused for a held or pinned run."""
    from ledger.verify import verify_run_txn  # verify reads compacted rows through this module

    run = conn.execute(sa.select(runs.c.legal_hold, runs.c.status).where(runs.c.id == run_id)
                       .with_for_update()).one()
    pinned = conn.execute(sa.select(sa.func.count()).select_from(corpus_runs)
                          .where(corpus_runs.c.run_id == run_id)).scalar_one()
    if run.legal_hold is not None or pinned or run.status not in TERMINAL:
        raise InvalidInput(f"run {run_id} is on legal hold, in a corpus or not finished: "
                           "retention keeps it")
    problems = verify_run_txn(conn, keys, run_id)
    if problems:
        raise IntegrityViolation(f"run {run_id} does not verify ({problems[0]}): its states "
                                 "are kept for investigation (`onward verify`)")
    count = 0
    for row in checkpoint_rows_txn(conn, run_id):
        if row["compacted_mac"] is not None:
            continue
        digest = sha256_hex(canonical_json(CheckpointBody.from_row(row).state))
        conn.execute(checkpoints.update().where(
            checkpoints.c.run_id == run_id, checkpoints.c.seq == row["seq"]).values(
            state=None, state_delta=None, snapshot_seq=None, chain_bytes=None,
            state_sha256=digest,
            compacted_mac=keys.sign(signed.compacted(run_id, row["seq"], row["hash"], digest))))
        count += 1
    return count


def compacted_problem(keys: CheckpointKeys, row: Mapping[str, Any]) -> str | None:
    """Why a compacted checkpoint's seal does not hold (its digest or hash was edited), or
    None: verify accepts it as compacted."""
    try:
        keys.check(signed.compacted(row["run_id"], row["seq"], row["hash"],
                                    row["state_sha256"] or ""), row["compacted_mac"],
                   f"compacted checkpoint {row['seq']}")
    except IntegrityViolation as exc:
        return str(exc)
    return None


@dataclass
class Applied:
    runs: int = 0
    checkpoints: int = 0
    refused: list[str] = field(default_factory=list)  # runs that did not verify


def apply(engine: Engine, keys: CheckpointKeys, policies: list[Policy], *,
          actor: Actor | None = None, batch: int = 100,
          max_runs: int | None = None) -> Applied:
    """Compact what the policies make due, ``batch`` runs per query, one run per
    transaction with its audit row (by ``actor``, else the reaper in the run's tenant).
    Resumable: a run is compacted whole or not at all, and the next call finds the rest."""
    done, after = Applied(), None
    while max_runs is None or done.runs < max_runs:
        with wrap_driver_errors("planning retention"), engine.connect() as conn:
            found = candidates_txn(conn, policies, after=after, limit=batch)
        if not found:
            return done
        for candidate in _due(found):
            _compact_one(engine, keys, candidate, actor, done)
        after = found[-1].run_id
    return done


def _due(found: list[Candidate]) -> Iterator[Candidate]:
    return (c for c in found if not c.held and not c.pinned)


def _compact_one(engine: Engine, keys: CheckpointKeys, candidate: Candidate,
                 actor: Actor | None, done: Applied) -> None:
    who = actor or Actor(REAPER_ACTOR, Role.ADMIN, candidate.tenant_id)
    try:
        with wrap_driver_errors("compacting a run"), engine.begin() as conn:
            count = compact_run_txn(conn, keys, candidate.run_id)
            record_txn(conn, keys, who, AuditRecord(
                AuditAction.RETENTION, AuditOutcome.DONE, "retention policy",
                run_id=candidate.run_id,
                details={"checkpoints": count, "bytes": candidate.bytes,
                         "workflow": candidate.workflow}))
    except (IntegrityViolation, InvalidInput) as exc:
        done.refused.append(str(exc))
        return
    done.runs += 1
    done.checkpoints += count
