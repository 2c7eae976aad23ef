"""Retention that keeps history verifiable (issue 15 item 5; docs/operating.md#retention).

A policy says how many days a terminal run (completed, failed, cancelled) keeps its
payloads after it finished, per tenant and workflow and, optionally, per kind of payload
(``ONWARD_RETENTION_POLICIES``, ``tenant/workflow[:kind]=days``; ``Kind``): its states
(checkpoints, signals' payloads, its result and errors), its evidence (recorded answers), its
artifacts (effects' payloads and results, approvals' artifacts) and its attempts (the
per-delivery log). Compaction of the kinds that are due, written only after the whole run
verified, in one transaction per run:

* checkpoints: the state (or delta) is dropped; the hash (the MAC of the body it had), the
  sha256 of the state that body signed and a seal (``signed.compacted``) over the three
  are kept. Verify accepts the checkpoint as compacted on its seal, still checks the
  chain of hashes, and reports an edit of the digest or the hash;
* evidence: the response (inline or the artifact reference) becomes its digest
  (ledger/compacted.py), which the evidence MAC signs: verify still checks the MAC whole;
  the sealed request kept beside it is dropped (the MAC signs the request hash);
* effects: the payload is dropped (bound by the request hash the intent MAC signs), the
  recipient and the provider's error too; the result becomes its digest under a seal over
  the outcome MAC (verify accepts the outcome on the seal);
* approvals: the artifact is dropped (bound by the artifact hash the terms MAC signs), the
  comment becomes its digest (``$dropped sha256:…``, which the decision MAC signs; the
  decision's audit row keeps the text, signed);
* signals' payloads and the run's result: their digest under a seal; the run's last error,
  effect attempts' errors: dropped; step attempts (the per-delivery log): deleted.

Runs on legal hold (``runs.legal_hold``), pinned in a corpus, or with a child run (a
replay or branch) still going are never compacted. Each compacted run gets an audit row;
``apply`` can stop anywhere and be run again (what is left is found by the next plan).
Step attempts also expire by month, a partition at a time (ledger/partitions.py).
Artifacts (content-addressed, shared between runs) that a compaction took the last
reference to are deleted in its transaction, and counted in its audit row; ``apply`` then
sweeps any other unreferenced artifact (ledger/artifact_sweep.py, which says how a new
reference in flight keeps its artifact).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ledger import artifact_sweep, compacted, signed, sql
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.bundle import DROPPED
from ledger.checkpoints import CheckpointBody, CheckpointKeys, covered_json, sha256_hex
from ledger.db import wrap_driver_errors
from ledger.effects import list_effects_txn
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.schema import (
    approvals,
    checkpoints,
    corpus_runs,
    effect_attempts,
    effects,
    evidence,
    runs,
    signals,
    step_attempts,
)
from ledger.states import checkpoint_rows_txn
from ledger.vocabulary import AuditAction, AuditOutcome, Role, RunStatus

__all__ = [
    "KEEP_LOCK",
    "REAPER_ACTOR",
    "TERMINAL",
    "Applied",
    "Candidate",
    "Kind",
    "Page",
    "Plan",
    "Policy",
    "apply",
    "candidates_txn",
    "compact_run_txn",
    "compacted_problem",
    "days_for",
    "keep_exclusive_txn",
    "keep_shared_txn",
    "parse_policies",
    "plan_txn",
]


TERMINAL = (RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value)
REAPER_ACTOR = "onward-reaper"

KEEP_LOCK = 0x0A_0D_4E_1D
"""The advisory lock that orders a partition drop against a legal hold or a corpus pin: the
drop holds it exclusively from its check to its commit, a hold or pin shares it. Without it
a hold committed after the drop's check and before its commit was not seen, and the held
run's attempts went with the month."""

_KEEP_SHARED = sql.text("keep_lock_shared")
_KEEP_EXCLUSIVE = sql.text("keep_lock")


def keep_shared_txn(conn: Connection) -> None:
    """Before a legal hold or a corpus pin writes: wait for a partition drop in progress
    (it then reads the hold or pin, committed, if it comes after)."""
    conn.execute(_KEEP_SHARED, {"k": KEEP_LOCK})


def keep_exclusive_txn(conn: Connection) -> None:
    """Before a partition drop checks its month: wait for the holds and pins in progress,
    and keep new ones out until the drop commits."""
    conn.execute(_KEEP_EXCLUSIVE, {"k": KEEP_LOCK})


class Kind(StrEnum):
    """What a policy may keep for a different number of days."""

    STATES = "states"  # checkpoints' states, signals' payloads, the run's result and errors
    EVIDENCE = "evidence"  # recorded answers (model calls, reads)
    ARTIFACTS = "artifacts"  # effects' payloads, recipients, results; approvals' artifacts
    ATTEMPTS = "attempts"  # the step attempts (one row per delivery; partitioned by month)


@dataclass(frozen=True)
class Policy:
    tenant: str  # "*": any
    workflow: str  # "*": any
    days: float
    kind: str = "*"  # a Kind, or "*": every kind

    @property
    def specificity(self) -> tuple[bool, bool, bool]:
        """Tenant over workflow over kind: ``acme/*=365`` keeps acme's attempts a year even
        beside ``*/*:attempts=7``."""
        return (self.tenant != "*", self.workflow != "*", self.kind != "*")


def parse_policies(text: str) -> list[Policy]:
    """``tenant/workflow[:kind]=days,...`` (``*`` for any tenant or workflow; no kind: every
    kind); InvalidInput saying what is wrong."""
    policies = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        scope, sep, days = entry.partition("=")
        tenant, slash, rest = scope.strip().partition("/")
        workflow, colon, kind = rest.strip().partition(":")
        try:
            value = float(days)
        except ValueError:
            value = -1.0
        if not sep or not slash or not tenant or not workflow or value < 0:
            raise InvalidInput(f"retention policy {entry!r} must look like "
                               "'tenant/workflow=days' or 'tenant/workflow:kind=days' ('*' "
                               f"for any tenant or workflow; kinds: {_KIND_NAMES})")
        if colon and kind.strip() not in {k.value for k in Kind}:
            raise InvalidInput(f"retention policy {entry!r} names kind {kind.strip()!r}: the "
                               f"kinds are {_KIND_NAMES}")
        policies.append(Policy(tenant.strip(), workflow.strip(), value,
                               kind.strip() if colon else "*"))
    return policies


_KIND_NAMES = ", ".join(k.value for k in Kind)


def days_for(policies: list[Policy], tenant: str, workflow: str,
             kind: Kind = Kind.STATES) -> float | None:
    """How many days a terminal run of ``tenant`` and ``workflow`` keeps ``kind``: the most
    specific policy naming it (``Policy.specificity``); None: forever."""
    matching = [p for p in policies if p.tenant in ("*", tenant)
                and p.workflow in ("*", workflow) and p.kind in ("*", kind)]
    return max(matching, key=lambda p: p.specificity).days if matching else None


_CANDIDATES = sql.text("retention_candidates")


@dataclass(frozen=True)
class Candidate:
    run_id: UUID
    tenant_id: str
    workflow: str
    held: bool
    pinned: bool
    checkpoints: int  # uncompacted, when its states are due (else 0)
    bytes: int  # the stored size of what is due
    kinds: frozenset[Kind] = frozenset(Kind)  # what is due


@dataclass(frozen=True)
class Page:
    """One page of candidates, and the run id the next page starts after (None: the end)."""

    found: list[Candidate]
    next_after: UUID | None


@dataclass
class Plan:
    """What a policy would compact now, and what it keeps although it is due."""

    runs: int = 0
    checkpoints: int = 0
    bytes: int = 0  # the due payloads' stored sizes (after TOAST compression)
    held: int = 0  # due, kept: legal hold
    pinned: int = 0  # due, kept: in a regression corpus
    kinds: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in Kind})
    run_ids: list[UUID] = field(default_factory=list)
    artifacts: int = 0  # artifacts nothing would reference afterwards (deleted by apply)
    artifact_bytes: int = 0  # their sizes (not in ``bytes``)
    states_runs: list[UUID] = field(default_factory=list)
    evidence_runs: list[UUID] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "checkpoints": self.checkpoints, "bytes": self.bytes,
                "held": self.held, "pinned": self.pinned, "kinds": self.kinds,
                "artifacts": self.artifacts, "artifact_bytes": self.artifact_bytes}

    def count(self, found: Candidate) -> None:
        """Add a due run that is neither held nor pinned."""
        self.runs += 1
        self.checkpoints += found.checkpoints
        self.bytes += found.bytes
        self.run_ids.append(found.run_id)
        for kind in found.kinds:
            self.kinds[kind.value] += 1
        if Kind.STATES in found.kinds:
            self.states_runs.append(found.run_id)
        if Kind.EVIDENCE in found.kinds:
            self.evidence_runs.append(found.run_id)


_LEFT = {Kind.STATES: "checkpoints", Kind.EVIDENCE: "evidence_left",
         Kind.ARTIFACTS: "artifacts_left", Kind.ATTEMPTS: "attempts"}
_BYTES: dict[Kind, str | None] = {Kind.STATES: "states_bytes", Kind.EVIDENCE: "evidence_bytes",
          Kind.ARTIFACTS: "artifacts_bytes", Kind.ATTEMPTS: None}


def _candidate(policies: list[Policy], row: sa.RowMapping) -> Candidate | None:
    """The run of ``row`` with the kinds it still has and its policies make due (None: no
    kind is due)."""
    kinds = frozenset(k for k in Kind if row[_LEFT[k]] and _past(policies, row, k))
    if not kinds:
        return None
    size = sum(int(row[column] or 0) for k in kinds if (column := _BYTES[k]) is not None)
    return Candidate(row["id"], row["tenant_id"], row["workflow"], row["held"], row["pinned"],
                     row["checkpoints"] if Kind.STATES in kinds else 0, size, kinds)


def _past(policies: list[Policy], row: sa.RowMapping, kind: Kind) -> bool:
    days = days_for(policies, row["tenant_id"], row["workflow"], kind)
    return days is not None and row["age_s"] >= days * 86400


def candidates_txn(conn: Connection, policies: list[Policy], *, after: UUID | None = None,
                   limit: int = 1000) -> Page:
    """Terminal runs after ``after`` with a kind of payload left that their policies make
    due, by id, held and pinned ones included (flagged). Each policy's query reads at most
    ``limit`` runs; the page ends where the first full one ended, so no run is skipped."""
    rows: dict[UUID, sa.RowMapping] = {}
    end: UUID | None = None
    for policy in policies:
        found = conn.execute(_CANDIDATES, {
            "terminal": list(TERMINAL), "days": policy.days, "tenant": policy.tenant,
            "workflow": policy.workflow, "after": after, "limit": limit}).mappings().all()
        for row in found:
            rows[row["id"]] = row
        if len(found) == limit and (end is None or found[-1]["id"] < end):
            end = found[-1]["id"]
    due = (_candidate(policies, rows[run_id]) for run_id in sorted(rows)
           if end is None or run_id <= end)
    return Page([c for c in due if c is not None], end)


def plan_txn(conn: Connection, policies: list[Policy]) -> Plan:
    """A dry run: what ``apply`` would compact now, and the artifacts it would delete."""
    plan, after = Plan(), None
    while True:
        page = candidates_txn(conn, policies, after=after)
        for found in page.found:
            if found.held:
                plan.held += 1
            elif found.pinned:
                plan.pinned += 1
            else:
                plan.count(found)
        if page.next_after is None:
            break
        after = page.next_after
    freed = artifact_sweep.freed_by_txn(conn, plan.states_runs, plan.evidence_runs)
    plan.artifacts, plan.artifact_bytes = freed.artifacts, freed.bytes
    return plan


def compact_run_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID,
                    kinds: frozenset[Kind] = frozenset(Kind)) -> int:
    """Compact ``kinds`` of ``run_id``'s payloads in the caller's transaction, after checking
    that its history verifies (IntegrityViolation if not: nothing is dropped from a history
    under suspicion); the number of checkpoints compacted. Refused for a held or pinned run."""
    from ledger.verify import verify_run_txn  # verify reads compacted rows through this module

    run = conn.execute(sa.select(runs.c.legal_hold, runs.c.status).where(runs.c.id == run_id)
                       .with_for_update()).one()
    pinned = conn.execute(sa.select(sa.func.count()).select_from(corpus_runs)
                          .where(corpus_runs.c.run_id == run_id)).scalar_one()
    going = conn.execute(sa.select(sa.func.count()).select_from(runs).where(
        runs.c.parent_run_id == run_id, runs.c.status.not_in(TERMINAL))).scalar_one()
    if run.legal_hold is not None or pinned or run.status not in TERMINAL or going:
        raise InvalidInput(f"run {run_id} is on legal hold, in a corpus, not finished or has "
                           "a replay or branch still going: retention keeps it")
    problems = verify_run_txn(conn, keys, run_id)
    if problems:
        raise IntegrityViolation(f"run {run_id} does not verify ({problems[0]}): its states "
                                 "are kept for investigation (`onward verify`)")
    count = _compact_states_txn(conn, keys, run_id) if Kind.STATES in kinds else 0
    if Kind.EVIDENCE in kinds:
        _compact_evidence_txn(conn, run_id)
    if Kind.ARTIFACTS in kinds:
        _compact_artifacts_txn(conn, keys, run_id)
    if Kind.ATTEMPTS in kinds:
        conn.execute(step_attempts.delete().where(step_attempts.c.run_id == run_id))
    return count


def _compact_states_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> int:
    """Checkpoints' states become their digest and seal; signals' payloads and the run's
    result a sealed digest; the run's last error goes. The checkpoints compacted."""
    count = 0
    for row in checkpoint_rows_txn(conn, run_id):
        if row["compacted_mac"] is not None:
            continue
        digest = sha256_hex(covered_json(CheckpointBody.from_row(row).state))
        conn.execute(checkpoints.update().where(
            checkpoints.c.run_id == run_id, checkpoints.c.seq == row["seq"]).values(
            state=None, state_delta=None, snapshot_seq=None, chain_bytes=None,
            state_sha256=digest,
            compacted_mac=keys.sign(signed.compacted(run_id, row["seq"], row["hash"], digest))))
        count += 1
    for signal in conn.execute(sa.select(signals).where(signals.c.run_id == run_id)).mappings():
        identity = compacted.signal_identity(signal)
        if signal["mac"] is None or compacted.is_sealed(keys, "signal_payload", identity,
                                                        signal["payload"]):
            continue
        conn.execute(signals.update().where(signals.c.id == signal["id"]).values(
            payload=compacted.sealed(keys, "signal_payload", identity, signal["payload"])))
    run = conn.execute(sa.select(runs.c.id, runs.c.seq, runs.c.result, runs.c.result_mac)
                       .where(runs.c.id == run_id)).mappings().one()
    values: dict[str, Any] = {"last_error": None}
    if run["result_mac"] is not None and run["result"] is not None and not \
            compacted.is_sealed(keys, "run_result", compacted.result_identity(run),
                                run["result"]):
        values["result"] = compacted.sealed(keys, "run_result", compacted.result_identity(run),
                                            run["result"])
    conn.execute(runs.update().where(runs.c.id == run_id).values(**values))
    return count


def _compact_evidence_txn(conn: Connection, run_id: UUID) -> None:
    """Each recorded answer becomes its digest, which the evidence MAC signs; its sealed
    request goes with it (the MAC signs the request hash)."""
    for row in conn.execute(sa.select(evidence.c.command_id, evidence.c.response,
                                      evidence.c.artifact_sha256, evidence.c.request)
                            .where(evidence.c.run_id == run_id)).mappings():
        kept = compacted.digest_of(row["response"]) if row["artifact_sha256"] is None else None
        if kept is not None and row["request"] is None:
            continue  # compacted already (a genuine marker-shaped response is kept as is)
        digest = row["artifact_sha256"] or kept or sha256_hex(covered_json(row["response"]))
        conn.execute(evidence.update().where(evidence.c.run_id == run_id,
                                             evidence.c.command_id == row["command_id"])
                     .values(response=compacted.marker(digest), artifact_sha256=None,
                             request=None))


def _compact_artifacts_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> None:
    """Effects' payloads, recipients and errors go (the intent MAC signs the request hash),
    their results become a sealed digest; approvals' artifacts go (the terms MAC signs the
    artifact hash), their comments become their digest (the decision MAC signs it; the
    decision's audit row keeps the text, signed)."""
    for effect in list_effects_txn(conn, run_id):
        values: dict[str, Any] = {"recipient": None, "recipient_mac": None, "error": None}
        if effect.payload is not None:
            values["payload"] = DROPPED
        if effect.outcome_mac is not None and effect.result is not None and not \
                compacted.is_sealed(keys, "effect_result", compacted.effect_identity(effect),
                                    effect.result):
            values["result"] = compacted.sealed(keys, "effect_result",
                                                compacted.effect_identity(effect), effect.result)
        conn.execute(effects.update().where(effects.c.effect_type == effect.effect_type,
                                            effects.c.effect_id == effect.effect_id)
                     .values(**values))
        conn.execute(effect_attempts.update().where(
            effect_attempts.c.effect_type == effect.effect_type,
            effect_attempts.c.effect_id == effect.effect_id).values(error=None))
    for approval in conn.execute(sa.select(approvals.c.id, approvals.c.comment)
                                 .where(approvals.c.run_id == run_id)).mappings().all():
        conn.execute(approvals.update().where(approvals.c.id == approval["id"]).values(
            artifact=DROPPED, comment=signed.dropped_comment(approval["comment"])))


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
    artifacts: int = 0  # artifacts deleted (no reference left)
    artifact_bytes: int = 0


def apply(engine: Engine, keys: CheckpointKeys, policies: list[Policy], *,
          actor: Actor | None = None, batch: int = 100, max_runs: int | None = None,
          tenant: str = "default") -> Applied:
    """Compact what the policies make due, ``batch`` runs per query, one run per
    transaction with its audit row (by ``actor``, else the reaper in the run's tenant),
    deleting the artifacts it took the last reference to; then sweep every other
    unreferenced artifact (audited by ``actor``, else the reaper in ``tenant``) once no
    compaction is left: a call stopped by ``max_runs`` does not read every artifact.
    Resumable: a run is compacted whole or not at all, and the next call finds the rest."""
    done, after = Applied(), None
    with wrap_driver_errors("planning retention"), engine.connect() as conn:
        # as onward_app nothing is deleted: no artifact is read or try-locked for a run
        # (each lock held to the compaction's commit made a writer of it wait for nothing)
        deletes = artifact_sweep.may_delete_txn(conn)
    while max_runs is None or done.runs < max_runs:
        with wrap_driver_errors("planning retention"), engine.connect() as conn:
            page = candidates_txn(conn, policies, after=after, limit=batch)
        for candidate in _due(page.found):
            _compact_one(engine, keys, candidate, actor, done, deletes=deletes)
        if page.next_after is None:
            break
        after = page.next_after
    else:  # stopped at max_runs: the reaper calls again at once, and sweeps at the last call
        return done
    swept = artifact_sweep.sweep(engine, keys, actor or Actor(REAPER_ACTOR, Role.ADMIN, tenant))
    done.artifacts += swept.artifacts
    done.artifact_bytes += swept.bytes
    return done


def _due(found: list[Candidate]) -> Iterator[Candidate]:
    return (c for c in found if not c.held and not c.pinned)


def _compact_one(engine: Engine, keys: CheckpointKeys, candidate: Candidate,
                 actor: Actor | None, done: Applied, *, deletes: bool) -> None:
    who = actor or Actor(REAPER_ACTOR, Role.ADMIN, candidate.tenant_id)
    try:
        with wrap_driver_errors("compacting a run"), engine.begin() as conn:
            held = artifact_sweep.referenced_txn(conn, candidate.run_id) \
                if deletes and candidate.kinds & {Kind.STATES, Kind.EVIDENCE} else []
            count = compact_run_txn(conn, keys, candidate.run_id, candidate.kinds)
            freed = artifact_sweep.release_txn(conn, held)
            record_txn(conn, keys, who, AuditRecord(
                AuditAction.RETENTION, AuditOutcome.DONE, "retention policy",
                run_id=candidate.run_id,
                details={"checkpoints": count, "bytes": candidate.bytes,
                         "workflow": candidate.workflow,
                         "kinds": sorted(k.value for k in candidate.kinds),
                         "artifacts": freed.artifacts, "artifact_bytes": freed.bytes}))
    except (IntegrityViolation, InvalidInput) as exc:
        done.refused.append(str(exc))
        return
    done.runs += 1
    done.checkpoints += count
    done.artifacts += freed.artifacts
    done.artifact_bytes += freed.bytes
