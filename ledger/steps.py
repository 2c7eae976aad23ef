"""The step hot path: claim, commit, fail, park, release. One statement per transaction.

Each operation is a single prepared SQL statement built from data-modifying CTEs on an
autocommit connection: one round trip, one transaction. The statements are in
``ledger/sql/steps.sql``. docs/design.md section 4 budgets two
transactions per step (claim and commit); this module is where that budget is kept.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from ledger import signed, sql, states, tracing
from ledger.artifact_sweep import ARTIFACT_LOCK
from ledger.checkpoints import (
    ARTIFACT_KEY,
    ENVELOPE_VERSION,
    CheckpointBody,
    CheckpointKeys,
    artifact_ref,
    canonical_json,
    sha256_hex,
)
from ledger.crypto import MASK, RESULT_FIELD, Place, approval_field, is_sealed, seal_value
from ledger.db import HEAD_REVISION
from ledger.exceptions import CancelRequested, IntegrityViolation
from ledger.hot import HotConnection
from ledger.lineage import Launch, LineageStore
from ledger.vocabulary import (
    SYSTEM_ROLE,
    WORKER_ACTOR,
    AttemptOutcome,
    AuditAction,
    AuditOutcome,
    OutcomeKind,
    ParkReason,
    Priority,
    RunStatus,
)
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl


class StaleReason(StrEnum):
    """Why a delivery did not get the lease."""

    UNKNOWN_RUN = "unknown_run"
    SEQ_MOVED = "seq_moved"  # duplicate or stale message: the run is past this seq
    LEASED = "leased"  # another worker holds a live lease
    NOT_RUNNABLE = "not_runnable"  # finished, failed, parked or cancelled
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # the reaper will park it
    NOT_DUE = "not_due"  # a retry backoff, timer or hand-back delay runs until later
    RACED = "raced"  # the run was claimable again by the time the refusal was looked at
    SCHEMA_CHANGED = "schema_changed"  # the ledger is at another revision than this code
    NOT_CLAIMED = "not_claimed"  # an uncounted claim (eager continuation) found it elsewhere


class Ended(StrEnum):
    """What a statement that ends a run did."""

    ENDED = "ended"  # the run ended; its never-sent effects were closed in the same statement
    UNRESOLVED = "unresolved"  # refused: an effect's outcome is unknown (park instead)
    LOST = "lost"  # the lease was no longer held: nothing was written


@dataclass(frozen=True)
class Stale:
    run_id: UUID
    seq: int
    reason: StaleReason
    current_seq: int | None = None
    status: str | None = None
    workflow: str | None = None  # for metrics, when the run was found
    workflow_version: int | None = None


@dataclass(frozen=True)
class Budget:
    """What a run may spend and what it has spent (NULL limits: the workflow's defaults)."""

    attempts_total: int
    attempts: int | None
    tokens: int | None
    cost_usd: Decimal | None
    deadline_at: datetime | None
    used_tokens: int
    used_cost_usd: Decimal
    run_created_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Budget:
        """The budget columns the claim and a chained commit read back from the run's row."""
        return cls(
            attempts_total=row["attempts_total"],
            attempts=row["budget_attempts"],
            tokens=row["budget_tokens"],
            cost_usd=row["budget_cost_usd"],
            deadline_at=row["deadline_at"],
            used_tokens=row["used_tokens"],
            used_cost_usd=row["used_cost_usd"],
            run_created_at=row["created_at"],
        )

    def spent(self) -> dict[str, Any]:
        return {"attempts": self.attempts_total, "tokens": self.used_tokens,
                "cost_usd": float(self.used_cost_usd)}


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """This host's clock for counting down a lease the ledger granted (``Claim.lease_until``):
    seconds since boot including any time suspended (``CLOCK_BOOTTIME``, Linux), so a host
    that slept does not think a lease still runs that the database's clock saw expire;
    ``time.monotonic()`` where there is no such clock (it stops while suspended on Linux)."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


@dataclass(frozen=True)
class Claim:
    """A held lease on one step of one run, with the checkpoint it starts from."""

    run_id: UUID
    tenant_id: str
    workflow: str
    workflow_version: int | None
    seq: int
    step: str | None
    epoch: int
    attempt: int
    max_attempts: int
    head_hash: str
    checkpoint: CheckpointBody | None
    checkpoint_hash: str | None
    checkpoint_key_id: str | None
    budget: Budget
    claimed_at: datetime
    launch: Launch = field(default_factory=Launch)  # replay / branch mode, parent, permission
    state_schema_version: int | None = None
    handbacks: int = 0  # hand-backs by workers lacking the run's version, since its last commit
    parent_found_hash: str | None = None  # the stored hash of checkpoint seq-1, if any
    state: dict[str, Any] | None = None  # the checkpoint's state, resolved if stored apart
    head_mac: str | None = None  # signs (run, seq, head hash): ledger/signed.py head
    cancel_requested: dict[str, Any] | None = None  # an operator asked to cancel the run
    snapshot_seq: int | None = None  # where the head's chain of deltas starts (ledger/states.py)
    chain_bytes: int = 0  # the bytes of the deltas since that snapshot
    state_problem: str | None = None  # why the head's state could not be read
    priority: Priority = Priority.NORMAL  # who goes first for a limit's slots
    # Until when (this host's ``lease_clock()``) the lease surely lasts: what it had left
    # when the claim (or chained commit) statement took it, counted from before that
    # statement was sent; and whether the run has an answer recorded or refused at this seq.
    # With both known and no answer, the step's first model call or read needs no statement
    # before it while the lease covers it (tasks/evidence_calls.py). None: not known.
    lease_until: float | None = None
    answered: bool | None = None
    # Whether an effect at this seq was left pending or accepted by an earlier execution of
    # the step that did not spend an attempt (a deferral, a continue after a park): the step
    # then resolves the run's unknown effects before it commits, as a retry does.
    effects_open: bool = False

    def __post_init__(self) -> None:
        inline = self.checkpoint is not None and artifact_ref(self.checkpoint.state) is None
        if self.state is None and inline and self.state_problem is None:
            assert self.checkpoint is not None
            object.__setattr__(self, "state", self.checkpoint.state)

    @classmethod
    def from_row(cls, row: dict[str, Any], *, sent: float | None = None) -> Claim:
        """The claim a claim statement's row describes; ``sent``: this host's
        ``lease_clock()`` just before that statement was sent (its lease is counted from
        then)."""
        checkpoint = None
        signed_state, state, problem, chain = _head_state(row)
        if row["cp_hash"] is not None:
            checkpoint = CheckpointBody(
                run_id=row["id"],
                seq=row["seq"],
                parent_hash=row["cp_parent_hash"],
                step=row["cp_step"],
                next_step=row["cp_next_step"],
                outcome=row["cp_outcome"],
                state=signed_state,
                workflow_version=row["cp_workflow_version"],
                control=row["cp_control"],
                state_schema_version=row["cp_state_schema_version"],
                refs=row["cp_refs"],
                workflow=row["cp_workflow"],
                envelope_version=row["cp_envelope_version"],
                state_chain=chain,
            )
        return cls(
            run_id=row["id"],
            tenant_id=row["tenant_id"],
            workflow=row["workflow"],
            workflow_version=row["workflow_version"],
            seq=row["seq"],
            step=row["step"],
            epoch=row["lease_epoch"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            head_hash=row["head_hash"],
            checkpoint=checkpoint,
            checkpoint_hash=row["cp_hash"],
            checkpoint_key_id=row["cp_key_id"],
            budget=Budget.from_row(row),
            claimed_at=row["claimed_at"],
            launch=Launch.from_row(row),
            state_schema_version=row["state_schema_version"],
            handbacks=row["handbacks"],
            parent_found_hash=row["parent_found_hash"],
            head_mac=row["head_mac"],
            cancel_requested=row["cancel_requested"],
            state=state,
            snapshot_seq=(row["cp_snapshot_seq"] if row["cp_snapshot_seq"] is not None
                          else row["seq"]),
            chain_bytes=row["cp_chain_bytes"] or 0,
            state_problem=problem,
            priority=Priority(row["priority"]),
            lease_until=(sent + row["lease_s"] if sent is not None
                         and row.get("lease_s") is not None else None),
            answered=row.get("answered"),
            effects_open=bool(row.get("effects_open")),
        )


def _head_state(row: Mapping[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    """The claimed head's state as its MAC signs it, the state itself, why it cannot be
    read (None when it can), and its chain digest when it is a delta: a snapshot's stored
    state (an artifact reference resolved), or a delta's chain reconstructed
    (ledger/states.py)."""
    if row["cp_hash"] is None:
        return None, None, None, None
    snapshot_seq = row["cp_snapshot_seq"]
    artifact = bytes(row["state_artifact"]) if row["state_artifact"] is not None else None
    try:
        if snapshot_seq is None:
            if row["cp_state"] is None:
                raise IntegrityViolation(f"checkpoint {row['seq']}'s state was compacted or "
                                         "removed: it cannot be restored")
            return row["cp_state"], states.reconstruct(row["cp_state"], (),
                                                       artifact_body=artifact), None, None
        if row["chain_seqs"] != list(range(snapshot_seq + 1, row["seq"] + 1)) \
                or row["chain_base"] is None:
            raise IntegrityViolation(f"the chain of checkpoint {row['seq']} (from snapshot "
                                     f"{snapshot_seq}) is incomplete: a row was removed")
        state, digest = states.rebuild(row["chain_base"], row["chain_deltas"],
                                       artifact_body=artifact)
        return state, state, None, digest
    except IntegrityViolation as exc:
        signed_state = row["cp_state"] if snapshot_seq is None else None
        return signed_state, None, f"run {row['id']}: {exc}", None


@dataclass(frozen=True)
class Advance:
    """What a step produced: the next checkpoint's content."""

    step: str  # the step that ran
    outcome: OutcomeKind
    next_step: str | None
    state: dict[str, Any]
    workflow_version: int
    next_max_attempts: int
    result: dict[str, Any] | None = None
    wait: Wait | None = None
    defaults: BudgetDefaults = field(default_factory=lambda: BudgetDefaults())
    state_schema_version: int = 1
    refs: dict[str, Any] | None = None  # see tasks/scope.py StepScope.refs()

    @property
    def status(self) -> RunStatus:
        if self.outcome is OutcomeKind.FINISH:
            return RunStatus.COMPLETED
        if self.outcome is OutcomeKind.FAIL:
            return RunStatus.FAILED
        if self.wait is not None and self.wait.due_at is None:
            return RunStatus.WAITING
        return RunStatus.RUNNING


@dataclass(frozen=True)
class Successor:
    """Who the commit leases the run's next step to, in the same statement (eager
    continuation: docs/design.md section 4): the worker that goes on running it, and the
    leases of its workflows' steps (``Registry.step_leases``, as ``claim`` takes them)."""

    owner: str
    leases: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ApprovalRequest:
    """The approval a waiting checkpoint is bound to (inserted in the same transaction)."""

    approval_id: UUID
    action: str
    artifact: Any
    artifact_hash: str
    approvers: list[str]
    expires_at: datetime
    created_at: datetime  # the step's clock when it asked: the expiry is counted from it


@dataclass(frozen=True)
class Wait:
    """A durable wait: for a person (approval), a signal, or a time (``due_at``)."""

    waiting_on: str
    control: TimerControl | ApprovalControl | SignalControl  # ledger/wait_control.py
    due_at: datetime | None = None  # a timer: the next step runs then, through the outbox
    wait_until: datetime | None = None  # a signal's timeout
    approval: ApprovalRequest | None = None


@dataclass(frozen=True)
class BudgetDefaults:
    """The workflow's budgets, written on the run the first time it commits."""

    attempts: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    deadline_at: datetime | None = None


_CLAIM = sql.statement("claim")
_COUNT_STALE = sql.statement("count_stale")
_COMMIT = sql.statement("commit")
_FAIL = sql.statement("fail")
_CANCEL = sql.statement("cancel")
_PARK = sql.statement("park")
_RELEASE = sql.statement("release")
_HAND_BACK = sql.statement("hand_back")
_DEFER = sql.statement("defer")
_LEASE_LOST = sql.statement("lease_lost")
_HEARTBEAT = sql.statement("heartbeat")
_POSITION = sql.statement("run_position")


def _signal_waited_for(wait: Wait | None) -> str | None:
    """The signal a wait ends on, if it is a signal wait (its commit consumes an early one)."""
    if wait is None or not isinstance(wait.control, SignalControl) or wait.due_at is not None:
        return None
    return wait.control.name


def _wait_params(wait: Wait | None) -> dict[str, Any]:
    """What the run waits on after the commit, and the control its checkpoint records."""
    if wait is None:
        return {"waiting_on": None, "signal": None, "wait_until": None, "due_at": None,
                "control": None}
    return {"waiting_on": wait.waiting_on, "signal": _signal_waited_for(wait),
            "wait_until": wait.wait_until, "due_at": wait.due_at,
            "control": Jsonb(wait.control.stored())}


_APPROVAL_PARAMS = ("approval_id", "action", "artifact_hash", "artifact", "approvers",
                    "expires_at", "approval_created_at", "terms_mac")


def _stored_state_params(stored: states.Stored,
                         artifact: tuple[str, bytes] | None) -> dict[str, Any]:
    """How the checkpoint stores its state: in full or as a delta, with the snapshot its
    chain starts from, and a large state's artifact (sha256 and body)."""
    return {
        "state": Jsonb(stored.state) if stored.state is not None else None,
        "state_delta": Jsonb(stored.delta) if stored.delta is not None else None,
        "snapshot_seq": stored.snapshot_seq,
        "chain_bytes": stored.chain_bytes,
        "artifact_sha": artifact[0] if artifact else None,
        "artifact_body": artifact[1] if artifact else None,
        "artifact_lock": ARTIFACT_LOCK,
    }


def _default_budget_params(defaults: BudgetDefaults) -> dict[str, Any]:
    """The workflow's budgets, which the commit writes where the run has none yet."""
    return {"default_attempts": defaults.attempts, "default_tokens": defaults.tokens,
            "default_cost": defaults.cost_usd, "default_deadline": defaults.deadline_at}


def error_record(error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    """An error as the ledger keeps it (a NUL character, which PostgreSQL cannot store,
    is written as ``\\0``)."""
    return {"type": error_type, "message": message[:4000].replace("\x00", "\\0"), **extra}


def _message_text(error: dict[str, Any]) -> str | None:
    """What a step attempt's ``error_message`` (text) keeps of ``error``: its message, or
    ``***`` when it is sealed (the run's ``last_error`` keeps the sealed message)."""
    message = error.get("message")
    return MASK if is_sealed(message) else message


class StepStore:
    """The ledger operations a worker runs for each step. Statements run on connections of
    a bounded pool of ``pool_size`` (one per process by default; a threads or gevent
    worker sizes it to its concurrency): safe to share between the threads of a process."""

    def __init__(self, url: str, keys: CheckpointKeys, *, lease_ttl_s: float,
                 state_inline_bytes: int = 64 * 1024, pool_size: int = 1,
                 snapshot_every: int = states.SNAPSHOT_EVERY) -> None:
        self.conn = HotConnection(url, max_size=pool_size)
        self._keys = keys
        self._ttl = lease_ttl_s
        self._state_inline_bytes = state_inline_bytes
        self._snapshot_every = snapshot_every

    def close(self) -> None:
        self.conn.close()

    def _state_for_checkpoint(
            self, claim: Claim, state: dict[str, Any]
    ) -> tuple[states.Stored, dict[str, Any], tuple[str, bytes] | None]:
        """How the next checkpoint stores ``state`` (a delta from the claimed head's, or in
        full: ledger/states.py), the state its MAC signs, and the artifact a large snapshot
        goes to (content-addressed; the checkpoint keeps its sha256)."""
        body = canonical_json(state)
        parent = claim.state if claim.state_problem is None else None
        stored = states.store_as(parent, state, len(body), snapshot_seq=claim.snapshot_seq,
                                 chain_bytes=claim.chain_bytes, seq=claim.seq + 1,
                                 snapshot_every=self._snapshot_every)
        if stored.is_delta or len(body) <= self._state_inline_bytes:
            return stored, state, None
        digest = sha256_hex(body)
        ref = {ARTIFACT_KEY: {"sha256": digest, "size": len(body)}}
        return states.Stored(ref), ref, (digest, body)

    @staticmethod
    def _chain_digest(claim: Claim, stored: states.Stored) -> str | None:
        """The chain digest a checkpoint stored as a delta signs (envelope 3): of the
        claimed head's (its own, or its snapshot's state) and the new delta."""
        if not stored.is_delta:
            return None
        assert claim.checkpoint is not None
        parent = claim.checkpoint.state_chain or states.snapshot_digest(claim.checkpoint.state)
        return states.chain_digest(parent, stored.delta)

    def _one(self, sql: str, params: dict[str, Any], *,
             binary: bool = False) -> dict[str, Any] | None:
        return self.conn.one(sql, params, binary=binary)

    # -- the hot path -------------------------------------------------------------------
    def claim(self, run_id: UUID, seq: int, owner: str, *, count_stale: bool = True,
              bind: Mapping[str, list[int]] | None = None,
              leases: Mapping[str, Mapping[str, float]] | None = None) -> Claim | Stale:
        """Take the lease of ``run_id`` at ``seq`` (docs/design.md section 4.1) or say why not.

        The lease lasts ``lease_ttl_s``, or what ``leases`` gives the run's workflow and next
        step (``""``: the start step) when that is longer: a step's timeout and a margin
        (``Registry.step_leases``), so a step inside its timeout needs no heartbeat.

        A run bound to no version yet is bound, by the same statement, to ``bind``'s
        ``[version, state_schema_version]`` for its workflow (the claiming code's: see
        ``Registry.first_claim_versions``); a workflow ``bind`` lacks leaves it unbound.
        No step is claimed while the ledger is at another schema revision than this code's
        (an upgrade ran under a running worker): the delivery is stale ``schema_changed``.
        A refused claim counts a stale delivery on the run unless ``count_stale`` is False."""
        # binary results: a large state's artifact (bytea) comes as it is stored, where text
        # would send it as hex twice its size (2 MB: 61 ms against 22, bench/storage.py)
        sent = lease_clock()
        row = self._one(_CLAIM, {"run_id": run_id, "seq": seq, "owner": owner, "ttl": self._ttl,
                                 "bind": Jsonb(dict(bind or {})), "revision": HEAD_REVISION,
                                 "leases": Jsonb({k: dict(v) for k, v in (leases or {}).items()})},
                        binary=True)
        if row is not None:
            return Claim.from_row(row, sent=sent)
        if not count_stale:
            return Stale(run_id, seq, StaleReason.NOT_CLAIMED)
        return self._count_stale(run_id, seq)

    def _count_stale(self, run_id: UUID, seq: int) -> Stale:
        row = self._one(_COUNT_STALE, {"run_id": run_id})
        if row is None:
            return Stale(run_id, seq, StaleReason.UNKNOWN_RUN)
        if row["revision"] != HEAD_REVISION:
            reason = StaleReason.SCHEMA_CHANGED
        elif row["seq"] != seq:
            reason = StaleReason.SEQ_MOVED
        elif row["status"] != RunStatus.RUNNING:
            reason = StaleReason.NOT_RUNNABLE
        elif row["leased"]:
            reason = StaleReason.LEASED
        elif row["attempt"] >= row["max_attempts"]:
            reason = StaleReason.ATTEMPTS_EXHAUSTED
        elif row["not_due"]:
            reason = StaleReason.NOT_DUE
        else:
            reason = StaleReason.RACED
        return Stale(run_id, seq, reason, current_seq=row["seq"], status=row["status"],
                     workflow=row["workflow"], workflow_version=row["workflow_version"])

    def commit(self, claim: Claim, advance: Advance, *,
               successor: Successor | None = None) -> bool | Claim:
        """Advance the run to ``seq + 1`` in one transaction; False means the lease was lost.

        With ``successor``, a commit that leaves the run running with its next step due now
        also claims that step for ``successor.owner`` in the same statement, and returns
        that ``Claim`` (its checkpoint is the one just committed) instead of True; no outbox
        row is written for it. A wait, a timer, an end or a ledger at another schema
        revision commits as without it (True)."""
        stored, state, artifact = self._state_for_checkpoint(claim, advance.state)
        body = self._next_checkpoint(claim, advance, state, stored)
        digest = self._keys.mac(body.as_dict())
        sent = lease_clock()  # a chained claim's lease is counted from here
        row = self._one(_COMMIT, {
            **self._lease_params(claim, AttemptOutcome.COMMITTED),
            **self._checkpoint_params(claim, advance, digest),
            **_stored_state_params(stored, artifact),
            **self._result_params(claim, advance),
            **_wait_params(advance.wait),
            **self._approval_params(claim, advance),
            **self._successor_params(claim, advance, successor),
            **_default_budget_params(advance.defaults),
        })
        return self._committed(claim, advance, row, body, digest, stored, sent)

    def _next_checkpoint(self, claim: Claim, advance: Advance, state: dict[str, Any],
                         stored: states.Stored) -> CheckpointBody:
        """The checkpoint the commit writes at ``seq + 1`` (what its MAC signs): ``state``
        as it is stored (an artifact's reference for a large one)."""
        wait = advance.wait
        return CheckpointBody(
            run_id=claim.run_id,
            seq=claim.seq + 1,
            parent_hash=claim.head_hash,
            step=advance.step,
            next_step=advance.next_step,
            outcome=advance.outcome.value,
            state=state,
            workflow_version=advance.workflow_version,
            control=wait.control.stored() if wait else None,
            state_schema_version=advance.state_schema_version,
            refs=advance.refs,
            workflow=claim.workflow,
            state_chain=self._chain_digest(claim, stored),
        )

    @staticmethod
    def _lease_params(claim: Claim, outcome: AttemptOutcome) -> dict[str, Any]:
        """The lease the statement is fenced by, and how it closes the lease's attempt
        (``claimed_at``: the attempt's partition key; no error)."""
        return {"run_id": claim.run_id, "seq": claim.seq, "epoch": claim.epoch,
                "claimed_at": claim.claimed_at, "attempt_outcome": outcome,
                "error_type": None, "error_message": None}

    def _checkpoint_params(self, claim: Claim, advance: Advance,
                           digest: str) -> dict[str, Any]:
        """Where the run goes next and the checkpoint's signed fields, with its hash and
        the run's new head MAC."""
        return {
            "next_step": advance.next_step,
            "status": advance.status.value,
            "next_max_attempts": advance.next_max_attempts,
            "workflow_version": advance.workflow_version,
            "state_schema_version": advance.state_schema_version,
            "refs": Jsonb(advance.refs) if advance.refs is not None else None,
            "hash": digest,
            "head_mac": self._keys.sign(signed.head(claim.run_id, claim.seq + 1, digest)),
            "parent_hash": claim.head_hash,
            "key_id": self._keys.current,
            "envelope_version": ENVELOPE_VERSION,
            "workflow": claim.workflow,
            "step": advance.step,
            "outcome": advance.outcome.value,
        }

    def _result_params(self, claim: Claim, advance: Advance) -> dict[str, Any]:
        """The run's result (a step that finishes it), sealed when keys are configured, and
        its MAC (which covers the sealed value's digest)."""
        result = seal_value(self._keys.crypt, advance.result, Place(
            claim.tenant_id, claim.run_id, claim.seq + 1, RESULT_FIELD))
        if result is None:
            return {"result": None, "result_mac": None}
        return {"result": Jsonb(result),
                "result_mac": self._keys.sign(signed.result(claim.run_id, claim.seq + 1,
                                                            result))}

    def _approval_params(self, claim: Claim, advance: Advance) -> dict[str, Any]:
        """The approval a waiting checkpoint asks (its artifact sealed for the new seq), and
        the MAC of its terms; all None without one."""
        approval = advance.wait.approval if advance.wait else None
        if approval is None:
            return dict.fromkeys(_APPROVAL_PARAMS)
        return {
            "approval_id": approval.approval_id,
            "action": approval.action,
            "artifact_hash": approval.artifact_hash,
            "artifact": Jsonb(seal_value(self._keys.crypt, approval.artifact, Place(
                claim.tenant_id, claim.run_id, claim.seq + 1,
                approval_field(approval.approval_id)))),
            "approvers": Jsonb(approval.approvers),
            "expires_at": approval.expires_at,
            "approval_created_at": approval.created_at,
            "terms_mac": self._approval_terms_mac(claim, advance, approval),
        }

    def _successor_params(self, claim: Claim, advance: Advance,
                          successor: Successor | None) -> dict[str, Any]:
        """Who the next step is chained to (eager continuation) and its lease, the schema
        revision a chained claim requires, and the trace the next outbox row carries."""
        return {
            "chain_owner": successor.owner if successor else None,
            "chain_ttl": self._lease_for(claim.workflow, advance.next_step,
                                         successor.leases if successor else {}),
            "revision": HEAD_REVISION,
            "trace_context": tracing.current_context(),
        }

    def _committed(self, claim: Claim, advance: Advance, row: dict[str, Any] | None,
                   body: CheckpointBody, digest: str, stored: states.Stored,
                   sent: float) -> bool | Claim:
        """What the commit statement's row says: advanced (and the successor's claim when
        it chained), refused because the run is being cancelled, or the lease lost."""
        if row is not None and row["advanced"] == 1:
            if not row["chained"]:
                return True
            return self._successor_claim(claim, advance, row, body, digest, stored, sent)
        if row is not None and row["cancelling"]:
            raise CancelRequested(f"run {claim.run_id} is being cancelled: step "
                                  f"{advance.step} at seq {claim.seq} is not committed")
        return self._lost(claim)

    def _lease_for(self, workflow: str, step: str | None,
                   leases: Mapping[str, Mapping[str, float]]) -> float:
        """The lease a claim of ``step`` takes: the TTL, or the step's own when longer."""
        return max(self._ttl, float(leases.get(workflow, {}).get(step or "", 0.0)))

    def _successor_claim(self, claim: Claim, advance: Advance, row: dict[str, Any],
                         body: CheckpointBody, digest: str, stored: states.Stored,
                         sent: float) -> Claim:
        """The claim a chained commit took (see ``commit``): what the claim statement would
        have read back, from the checkpoint this worker just wrote and the run's row (its
        lease counted from ``sent``, before the commit statement was sent).

        Nothing is answered at seq + 1, by construction, so the statement does not look
        (``answered`` False: the step's first call sends no look-up). An answer or a refusal
        is written only under the lease of the seq the run is at (record_evidence and
        debit_unrecorded_answer fence on ``runs.seq``), and the run reaches seq + 1 only by
        this commit: ``runs.seq`` never goes back (a continue, restore or migration keeps
        it; a branch or replay is a new run with no evidence of its own, an evidence replay
        reads its source's records and never this look-up; a corpus import inserts only
        stopped runs, not present, with the evidence their ledger held, so none past their
        seq). Were one there all the same, the call would be made again and its record
        would find the first answer, which stands (``EvidenceCalls._kept``)."""
        return Claim(
            run_id=claim.run_id,
            tenant_id=claim.tenant_id,
            workflow=claim.workflow,
            workflow_version=row["workflow_version"],
            seq=claim.seq + 1,
            step=advance.next_step,
            epoch=row["lease_epoch"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            head_hash=digest,
            checkpoint=body,
            checkpoint_hash=digest,
            checkpoint_key_id=self._keys.current,
            budget=Budget.from_row(row),
            claimed_at=row["claimed_at"],
            launch=claim.launch,
            state_schema_version=row["state_schema_version"],
            handbacks=0,
            parent_found_hash=claim.head_hash,
            state=advance.state,  # the state itself (``body`` may hold its artifact's ref)
            head_mac=row["head_mac"],
            snapshot_seq=(stored.snapshot_seq if stored.snapshot_seq is not None
                          else claim.seq + 1),
            chain_bytes=stored.chain_bytes or 0,
            priority=Priority(row["priority"]),
            lease_until=sent + row["lease_s"],
            answered=False,
        )

    def _approval_terms_mac(self, claim: Claim, advance: Advance,
                            approval: ApprovalRequest | None) -> str | None:
        """The MAC of what the approval asks and of whom (ledger/signed.py approval_terms)."""
        if approval is None:
            return None
        return self._keys.sign(signed.approval_terms({
            "id": approval.approval_id, "run_id": claim.run_id, "tenant_id": claim.tenant_id,
            "seq": claim.seq + 1, "workflow_version": advance.workflow_version,
            "step": advance.step, "action": approval.action,
            "artifact_hash": approval.artifact_hash, "approvers": approval.approvers,
            "created_at": approval.created_at, "expires_at": approval.expires_at}))

    def commit_refused(self, claim: Claim) -> None:
        """The step learnt mid-way that its lease was taken over: record its attempt lost."""
        self._lost(claim)

    def _lost(self, claim: Claim) -> bool:
        self._one(_LEASE_LOST, {"run_id": claim.run_id, "epoch": claim.epoch,
                                "claimed_at": claim.claimed_at})
        return False

    def fail(self, claim: Claim, step: str, error: dict[str, Any], *,
             retry_in_s: float | None) -> bool:
        """Record a step error; retry after ``retry_in_s`` through a delayed outbox row, or
        fail the run when ``retry_in_s`` is None. False means nothing was written (the lease
        was lost, or an effect's outcome is unknown: see ``fail_run``)."""
        return self._fail(claim, step, error, retry_in_s) is Ended.ENDED

    def fail_run(self, claim: Claim, step: str, error: dict[str, Any]) -> Ended:
        """Fail the run for good and close its never-sent effects ``unsent``, in one
        statement; refused (``UNRESOLVED``) while an effect's outcome is unknown."""
        return self._fail(claim, step, error, None)

    def _fail(self, claim: Claim, step: str, error: dict[str, Any],
              retry_in_s: float | None) -> Ended:
        row = self._one(
            _FAIL,
            {
                "run_id": claim.run_id,
                "seq": claim.seq,
                "epoch": claim.epoch,
                "claimed_at": claim.claimed_at,
                "step": step,
                "error": Jsonb(error),
                "retry": retry_in_s is not None,
                "delay": retry_in_s or 0.0,
                "trace_context": tracing.current_context(),
                "attempt_outcome": AttemptOutcome.FAILED,
                "error_type": error.get("type"),
                "error_message": _message_text(error),
            },
        )
        if row is not None and row["failed"] == 1:
            return Ended.ENDED
        if row is not None and row["blocked_by"] is not None:
            return Ended.UNRESOLVED
        self._lost(claim)
        return Ended.LOST

    def end_cancelled(self, claim: Claim, step: str | None) -> Ended:
        """Honour the run's cancel request: end it ``cancelled`` with its never-sent effects
        closed, its outbox rows deleted and its pending approvals invalidated, in one
        statement; refused (``UNRESOLVED``) while an effect's outcome is unknown."""
        row = self._one(_CANCEL, {"run_id": claim.run_id, "epoch": claim.epoch,
                                  "claimed_at": claim.claimed_at, "step": step,
                                  "attempt_outcome": AttemptOutcome.CANCELLED,
                                  "error_type": None, "error_message": None})
        if row is not None and row["cancelled"] == 1:
            return Ended.ENDED
        if row is not None and row["blocked_by"] is not None:
            return Ended.UNRESOLVED
        self._lost(claim)
        return Ended.LOST

    def park(self, claim: Claim, step: str | None, reason: ParkReason,
             error: dict[str, Any]) -> bool:
        """Stop the run as ``needs_review``: a person must look before anything runs."""
        row = self._one(
            _PARK,
            {
                "run_id": claim.run_id,
                "epoch": claim.epoch,
                "claimed_at": claim.claimed_at,
                "step": step,
                "reason": reason,
                "error": Jsonb(error),
                "attempt_outcome": AttemptOutcome.PARKED,
                "error_type": error.get("type"),
                "error_message": _message_text(error),
                "audit_mac": self._park_audit_mac(claim, reason, error),
            },
        )
        return (row is not None and row["parked"] == 1) or self._lost(claim)

    def _park_audit_mac(self, claim: Claim, reason: ParkReason, error: dict[str, Any]) -> str:
        """The MAC of the audit row the park statement writes (its values, known here)."""
        return self._keys.sign(signed.audit_row({
            "tenant_id": claim.tenant_id, "actor": WORKER_ACTOR, "role": SYSTEM_ROLE,
            "action": AuditAction.PARK.value, "outcome": AuditOutcome.DONE.value,
            "reason": str(reason), "run_id": claim.run_id,
            "new_run_id": None, "effect_id": None, "approval_id": None,
            "before_seq": claim.seq, "after_seq": claim.seq, "details": error,
            "token_id": None}))

    def release(self, claim: Claim, error: dict[str, Any], *,
                resend_in_s: float | None = None, spend_attempt: bool = False) -> bool:
        """Give the lease back without running; with ``resend_in_s``, also queue the step
        again for the dispatcher to route. ``spend_attempt`` keeps the claim counted, so
        a message no worker can run ends parked instead of circulating forever. (A run
        whose workflow or version this worker lacks is handed back with ``hand_back``.)"""
        row = self._one(
            _RELEASE,
            {
                "run_id": claim.run_id,
                "epoch": claim.epoch,
                "claimed_at": claim.claimed_at,
                "resend_in": resend_in_s,
                "spend": spend_attempt,
                "error": Jsonb(error),
                "step": claim.step,  # the attempt keeps the step it was claimed for
                "attempt_outcome": AttemptOutcome.RELEASED,
                "error_type": error.get("type"),
                "error_message": _message_text(error),
            },
        )
        return (row is not None and row["released"] == 1) or self._lost(claim)

    def hand_back(self, claim: Claim, error: dict[str, Any], *, delay_s: float,
                  park: bool, unbind: bool = False,
                  bind_to: tuple[int, int] | None = None) -> bool:
        """Give the step back to the fleet for a worker with the run's workflow and version,
        without spending an attempt; ``park`` parks it ``no_worker_for_version`` instead.
        ``unbind`` (a new run whose input this code's model rejects) undoes the binding its
        claim made (binding it to ``bind_to``'s version and state schema instead, when
        given), unless a step at its seq recorded an effect or an answer. False means the
        lease was lost."""
        row = self._one(
            _HAND_BACK,
            {
                "run_id": claim.run_id,
                "epoch": claim.epoch,
                "claimed_at": claim.claimed_at,
                "delay": delay_s,
                "park": park,
                "unbind": unbind,
                "bind_version": bind_to[0] if bind_to else None,
                "bind_schema": bind_to[1] if bind_to else None,
                "error": Jsonb(error),
                "step": claim.step,  # the attempt keeps the step it was claimed for
                "attempt_outcome": AttemptOutcome.PARKED if park else AttemptOutcome.RELEASED,
                "error_type": error.get("type"),
                "error_message": _message_text(error),
                "audit_mac": (self._park_audit_mac(claim, ParkReason.NO_WORKER_FOR_VERSION, error)
                              if park else None),
            },
        )
        return (row is not None and row["handed"] == 1) or self._lost(claim)

    def defer(self, claim: Claim, step: str, *, delay_s: float, waiting_on: str,
              detail: str) -> bool:
        """Pause the run without a worker: give the lease back (neither the step's attempt
        nor the run's attempt budget is spent) and wake the same step after ``delay_s``
        through a delayed outbox row."""
        row = self._one(
            _DEFER,
            {
                "run_id": claim.run_id,
                "seq": claim.seq,
                "epoch": claim.epoch,
                "claimed_at": claim.claimed_at,
                "step": step,
                "delay": delay_s,
                "waiting_on": waiting_on,
                "attempt_outcome": AttemptOutcome.WAITING,
                "error_type": None,
                "error_message": detail,
            },
        )
        return (row is not None and row["deferred"] == 1) or self._lost(claim)

    def heartbeat(self, claim: Claim) -> bool:
        """Extend the lease; False means it was lost (stop and discard the work)."""
        row = self._one(_HEARTBEAT, {"run_id": claim.run_id, "epoch": claim.epoch,
                                     "ttl": self._ttl})
        if row is not None and row["lease_expires_at"] is not None:
            return True
        if row is not None and row["cancelling"]:
            raise CancelRequested(f"run {claim.run_id} is being cancelled")
        return self._lost(claim)

    def diverge(self, claim: Claim, step: str, report: dict[str, Any]) -> bool:
        """Stop an evidence replay as ``diverged`` with its report (ledger/lineage.py),
        fenced by the lease; False means the lease was lost."""
        return LineageStore(self.conn).diverge(claim.run_id, claim.epoch, claim.claimed_at, step,
                                               report)

    def position(self, run_id: UUID) -> dict[str, Any] | None:
        """The run's ``seq``, ``status`` and ``workflow_version`` (None: no such run)."""
        return self._one(_POSITION, {"run_id": run_id})


__all__ = [
    "Advance",
    "AttemptOutcome",
    "Claim",
    "Ended",
    "Stale",
    "StaleReason",
    "StepStore",
    "Successor",
    "error_record",
    "lease_clock",
]
