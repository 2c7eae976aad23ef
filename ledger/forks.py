"""Replay and branch: a new run that starts its own history from a copy of its parent's
checkpoint ``k`` (docs/design.md section 8).

The copy keeps the seq (so ``command_id``s line up with the parent's and an evidence replay
finds the parent's record for each call), gets outcome ``fork``, no parent hash, and a new
MAC over the new run's id. The parent is only read: its outbox, approvals and effects are
never touched, and the new run's effect ids differ because its run id does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

import jsonpatch
import jsonpointer
import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping
from uuid6 import uuid7

from ledger import signed, sql
from ledger.artifact_sweep import share_txn
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import (
    ENVELOPE_VERSION,
    CheckpointBody,
    CheckpointKeys,
    artifact_ref,
    canonical_json,
    sha256_hex,
)
from ledger.crypto import Place, approval_field, is_sealed
from ledger.exceptions import (
    IntegrityViolation,
    InvalidInput,
    OperationRefused,
    SealedValueUnreadable,
    UnknownRun,
)
from ledger.lineage import (
    APPROVAL_AT,
    SIGNAL_AT,
    SOURCE_CHAIN,
    STEP_AFTER,
    Divergence,
    evidence_source,
    resume_after_wait,
)
from ledger.operations import REPLAY_MODES, queue_step_txn, require_reason
from ledger.runs import validate_input
from ledger.schema import approvals, artifacts, checkpoints, runs
from ledger.states import checkpoint_row_txn, state_of
from ledger.verify import verify_source_txn
from ledger.vocabulary import (
    ApprovalStatus,
    AuditAction,
    AuditOutcome,
    LaunchMode,
    OutcomeKind,
    RunStatus,
)
from ledger.wait_control import (
    ApprovalControl,
    SignalControl,
    TimerControl,
    parse_control,
)
from ledger.waits import check_decision, check_terms

__all__ = [
    "BudgetPolicy",
    "ForkRequest",
    "Launched",
    "PatchChange",
    "StateCheck",
    "apply_patch",
    "describe_patch",
    "fork_txn",
    "preview_txn",
    "refuse_patch_at_approval",
    "resolve_state_txn",
]


StateCheck = Callable[[str, "int | None", dict[str, Any]], None]
"""Validates a branch's patched state against the workflow's model (raise InvalidInput)."""


class BudgetPolicy(StrEnum):
    INHERITED = "inherited"  # the parent's limits, and what it had spent before checkpoint k
    RESET = "reset"  # the workflow's defaults, nothing spent


@dataclass(frozen=True)
class ForkRequest:
    parent_run_id: UUID
    from_seq: int
    mode: LaunchMode
    reason: str | None
    budgets: BudgetPolicy = BudgetPolicy.INHERITED
    allow_irreversible: bool = False
    patch: list[dict[str, Any]] | None = None  # branches only
    allow_unresolved: bool = False  # live replays and branches: see _unresolved_txn


@dataclass(frozen=True)
class Launched:
    """The new run a replay or branch created."""

    run_id: UUID
    parent_run_id: UUID
    parent_seq: int
    mode: LaunchMode
    status: RunStatus
    step: str | None
    last_error: dict[str, Any] | None = None


@dataclass(frozen=True)
class PatchChange:
    """One operation of a branch's patch, with the values it replaces and writes."""

    op: str
    path: str
    before: Any
    after: Any
    from_path: str | None = None


_MISSING = object()


def apply_patch(state: dict[str, Any], patch: Any, max_bytes: int) -> dict[str, Any]:
    """Apply an RFC 6902 patch to a copy of ``state``; the result must stay a JSON object."""
    if not isinstance(patch, list) or not patch:
        raise InvalidInput("a branch needs its changes as a non-empty RFC 6902 JSON Patch, e.g. "
                           '[{"op": "replace", "path": "/amount", "value": 1500}]; with no '
                           "changes, replay it live instead")
    try:
        patched = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(state))
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError,
            KeyError, ValueError) as exc:
        raise InvalidInput(f"the patch does not apply to the checkpoint's state: {exc}") from exc
    if not isinstance(patched, dict):
        raise InvalidInput("the patched state must stay a JSON object")
    validate_input(patched, max_bytes)
    return patched


def describe_patch(state: dict[str, Any], patch: list[dict[str, Any]]) -> list[PatchChange]:
    """The diff a person reviews before a branch: each operation with before/after values."""
    changes = []
    current = copy.deepcopy(state)
    for op in patch:
        path = str(op.get("path", ""))
        before = jsonpointer.resolve_pointer(current, path, _MISSING)
        try:
            current = jsonpatch.JsonPatch([op]).apply(current)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise InvalidInput(f"the patch does not apply: {exc}") from exc
        after = jsonpointer.resolve_pointer(current, path, _MISSING)
        changes.append(PatchChange(
            str(op.get("op")), path, None if before is _MISSING else before,
            None if after is _MISSING else after, op.get("from")))
    return changes


def fork_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, request: ForkRequest, *,
             default_max_attempts: int, max_state_bytes: int,
             check_state: StateCheck | None = None) -> Launched:
    """Create the replay or branch run, its fork checkpoint, its first message (or wait),
    and the audit row, in the caller's transaction."""
    action, reason = _check_request(actor, request)
    source = _source_txn(conn, keys, actor, request, max_state_bytes, check_state)
    unresolved = _unresolved_txn(conn, request, source)
    run_id = uuid7()
    start = _start(conn, keys, source.parent, source.cp, request.mode, run_id)
    state = _sealed_for(conn, keys, source, run_id)
    body = CheckpointBody(
        run_id=run_id, seq=source.cp["seq"], parent_hash=None, step=source.cp["step"],
        next_step=source.cp["next_step"], outcome=OutcomeKind.FORK.value, state=state,
        workflow_version=source.cp["workflow_version"], control=start.control,
        state_schema_version=source.cp["state_schema_version"], workflow=source.workflow)
    digest = keys.mac(body.as_dict())
    _insert_run_txn(conn, keys, request, source, start, body.run_id, digest, reason,
                    default_max_attempts)
    _insert_checkpoint_txn(conn, keys, body, digest)
    if start.approval is not None:
        _ask_again_txn(conn, keys, start.approval, run_id, source)
    if start.status is RunStatus.RUNNING:
        queue_step_txn(conn, run_id, source.cp["seq"], start.due_at)
    record_txn(conn, keys, actor, AuditRecord(
        action, AuditOutcome.DONE, reason, run_id=source.parent["id"], new_run_id=run_id,
        before_seq=source.parent["seq"], after_seq=source.cp["seq"],
        details=_audit_details(conn, request, source, start, unresolved)))
    return Launched(run_id, source.parent["id"], source.cp["seq"], request.mode, start.status,
                    start.step, start.last_error)


def _check_request(actor: Actor, request: ForkRequest) -> tuple[AuditAction, str]:
    """The audited action the request is (replay or branch), which the actor must be
    allowed, and its reason; a request whose mode and options do not go together is
    refused."""
    branch = request.mode is LaunchMode.BRANCH
    action = AuditAction.BRANCH if branch else AuditAction.REPLAY
    actor.require(action)
    reason = require_reason(request.reason, action)
    if not branch and request.allow_irreversible and request.mode is not LaunchMode.LIVE:
        raise InvalidInput("allow_irreversible applies to live replays and branches only: an "
                           f"{request.mode.value} replay sends nothing real")
    if request.allow_unresolved and request.mode not in _CALLS_AGAIN:
        raise InvalidInput("allow_unresolved applies to live replays and branches only: an "
                           f"{request.mode.value} replay sends nothing real")
    if not branch and request.mode not in REPLAY_MODES:
        raise InvalidInput(f"replay mode must be one of {[m.value for m in REPLAY_MODES]}")
    return action, reason


@dataclass(frozen=True)
class _Source:
    """What the new run copies: the parent, its checkpoint k (verified), the workflow that
    checkpoint signs, and the state the copy starts from (a branch's, patched)."""

    parent: RowMapping
    cp: dict[str, Any]
    workflow: str
    state: dict[str, Any]


def _source_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, request: ForkRequest,
                max_state_bytes: int, check_state: StateCheck | None) -> _Source:
    """The parent's checkpoint ``request.from_seq``, verified, and the state the new run
    starts from: a replay copies it as stored (a state stored apart as its reference), a
    branch resolves it and applies its patch, which ``check_state`` validates."""
    parent = _parent(conn, actor, request.parent_run_id)
    cp = _checkpoint(conn, parent, request.from_seq)
    verify_source_txn(conn, keys, parent, cp["seq"])
    workflow = _signed_workflow(parent, cp)
    state = dict(state_of(cp))
    if request.mode is LaunchMode.BRANCH:
        refuse_patch_at_approval(cp, parent["id"])
        state = apply_patch(resolve_state_txn(conn, state), request.patch, max_state_bytes)
        if check_state is not None:
            check_state(workflow, cp["workflow_version"], state)
    return _Source(parent, cp, workflow, state)


def _sealed_for(conn: Connection, keys: CheckpointKeys, source: _Source,
                run_id: UUID) -> dict[str, Any]:
    """The state the new run starts from. A sealed field is bound to the run that sealed it;
    the new run's worker opens its own fields and its source's (tasks/sensitive.py
    ``open_state``). A field the source holds sealed for a run further back (the source is
    itself a replay or branch, copied from its fork checkpoint) is sealed again here for the
    new run, at the fork seq; without keys, or with nothing of the kind, as stored."""
    state, parent = source.state, source.parent
    if keys.crypt is None or parent["parent_run_id"] is None or artifact_ref(state):
        return state
    lineage = _lineage_txn(conn, parent["parent_run_id"])
    sealed = dict(state)
    for name, value in state.items():
        if not is_sealed(value):
            continue
        field = f"state.{name}"
        try:
            keys.crypt.open(value, tenant=parent["tenant_id"], run_id=parent["id"], field=field)
            continue  # the source's own: the new run's worker opens it as its source's
        except SealedValueUnreadable:
            pass
        for ancestor in lineage:
            try:
                plain = keys.crypt.open(value, tenant=parent["tenant_id"], run_id=ancestor,
                                        field=field)
            except SealedValueUnreadable:
                continue
            sealed[name] = keys.crypt.seal(plain, Place(parent["tenant_id"], run_id,
                                                        source.cp["seq"], field))
            break
    return sealed


def _lineage_txn(conn: Connection, run_id: UUID | None, depth: int = 64) -> list[UUID]:
    """``run_id`` and the runs it was copied from, nearest first."""
    found: list[UUID] = []
    while run_id is not None and len(found) < depth:
        found.append(run_id)
        run_id = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == run_id)
                              ).scalar()
    return found


def _insert_run_txn(conn: Connection, keys: CheckpointKeys, request: ForkRequest,
                    source: _Source, start: _Start, run_id: UUID, digest: str, reason: str,
                    default_max_attempts: int) -> None:
    """The new run's row: where it starts, its head (the fork checkpoint) and its MAC, its
    launch (mode, parent, irreversible effects allowed) and its MAC, and its budgets."""
    parent, cp = source.parent, source.cp
    conn.execute(runs.insert().values(
        id=run_id, tenant_id=parent["tenant_id"], workflow=source.workflow,
        workflow_version=cp["workflow_version"], conversation_id=parent["conversation_id"],
        status=start.status.value, seq=cp["seq"], step=start.step,
        max_attempts=default_max_attempts, head_hash=digest,
        head_mac=keys.sign(signed.head(run_id, cp["seq"], digest)), waiting_on=start.waiting_on,
        wait_until=start.wait_until, last_error=start.last_error,
        finished_at=sa.func.onward.now() if start.status.terminal else None,
        state_schema_version=cp["state_schema_version"], parent_run_id=parent["id"],
        parent_seq=cp["seq"], launch_reason=reason, mode=request.mode.value,
        allow_irreversible=request.allow_irreversible,
        launch_mac=keys.sign(signed.launch(run_id, {
            "tenant_id": parent["tenant_id"], "mode": request.mode.value,
            "parent_run_id": parent["id"], "parent_seq": cp["seq"],
            "allow_irreversible": request.allow_irreversible})),
        branch_patch=request.patch if request.mode is LaunchMode.BRANCH else None,
        **_budgets(conn, parent, cp["seq"], request.budgets),
    ))


def _insert_checkpoint_txn(conn: Connection, keys: CheckpointKeys, body: CheckpointBody,
                           digest: str) -> None:
    """The fork checkpoint: ``body`` (no parent hash, outcome ``fork``) under ``digest``. A
    state stored apart is copied as its reference: its artifact is kept from a sweep to our
    commit (ledger/artifact_sweep.py), and must still be there once that is so."""
    ref = artifact_ref(body.state)
    if ref is not None:
        share_txn(conn, [ref["sha256"]])
        resolve_state_txn(conn, body.state)  # IntegrityViolation: gone meanwhile
    conn.execute(checkpoints.insert().values(
        run_id=body.run_id, seq=body.seq, parent_hash=None, hash=digest, key_id=keys.current,
        envelope_version=ENVELOPE_VERSION, step=body.step, next_step=body.next_step,
        outcome=body.outcome, state=body.state, workflow_version=body.workflow_version,
        lease_epoch=0, control=body.control, state_schema_version=body.state_schema_version,
        workflow=body.workflow))


def _ask_again_txn(conn: Connection, keys: CheckpointKeys, approval: dict[str, Any],
                   run_id: UUID, source: _Source) -> None:
    """The approval the new run waits for: the parent's, asked again of the new run (its
    artifact sealed for it), with its terms' MAC."""
    asked = {"id": approval["id"], "run_id": run_id, "tenant_id": source.parent["tenant_id"],
             "seq": source.cp["seq"], **approval["values"]}
    asked["artifact"] = _artifact_for(keys, approval, asked)
    conn.execute(approvals.insert().values(
        **asked, terms_mac=keys.sign(signed.approval_terms(asked))))


def _audit_details(conn: Connection, request: ForkRequest, source: _Source,
                   start: _Start, unresolved: list[RowMapping]) -> dict[str, Any]:
    """What the audit row says of the new run: how it was launched and where it starts, a
    branch's patch and the diff it made, an evidence replay's divergence, and the parent's
    effects of unknown outcome it was allowed to start beside."""
    details: dict[str, Any] = {
        "mode": request.mode.value, "budgets": request.budgets.value,
        "allow_irreversible": request.allow_irreversible, "status": start.status.value,
        "step": start.step, "workflow": source.workflow}
    if request.mode in _CALLS_AGAIN:
        details["allow_unresolved"] = request.allow_unresolved
    if unresolved:
        details["unresolved_effects"] = [
            {"effect_type": e["effect_type"], "effect_id": e["effect_id"], "seq": e["seq"],
             "status": e["status"]} for e in unresolved]
    if request.mode is LaunchMode.BRANCH and request.patch is not None:
        details["patch"] = request.patch
        details["diff"] = [c.__dict__ for c in describe_patch(
            resolve_state_txn(conn, dict(state_of(source.cp))), request.patch)]
    if start.last_error is not None:
        details["divergence"] = start.last_error
    return details


_CALLS_AGAIN = (LaunchMode.LIVE, LaunchMode.BRANCH)
"""The launches whose steps call the world again (under the new run's keys): an evidence
replay answers from records, a simulation sends to the tools' sandboxes."""

_UNRESOLVED = sql.statement("unresolved_effects")


def _unresolved_txn(conn: Connection, request: ForkRequest,
                    source: _Source) -> list[RowMapping]:
    """The parent's effects of unknown outcome that a live replay or branch would make
    again: a step at or after the fork checkpoint's seq made them (the new run runs those
    steps again) and the provider may have acted on them (pending after a call whose
    answer was lost or is still in flight, or accepted). The new run's effect ids differ
    from the parent's (its run id does), so nothing deduplicates its call against the
    parent's: the same payment or message could be made twice. Refused unless the
    operator says so (``allow_unresolved``); what was allowed is audited. None for an
    evidence or simulation replay, which sends nothing real."""
    if request.mode not in _CALLS_AGAIN:
        return []
    rows = conn.exec_driver_sql(_UNRESOLVED, {"run_id": source.parent["id"]}).mappings()
    unresolved = [row for row in rows if row["seq"] >= source.cp["seq"]]
    if unresolved and not request.allow_unresolved:
        raise OperationRefused(_unresolved_message(request, source.parent["id"], unresolved))
    return unresolved


def _unresolved_message(request: ForkRequest, parent_id: UUID,
                        unresolved: list[RowMapping]) -> str:
    what = "branch" if request.mode is LaunchMode.BRANCH else "live replay"
    named = "; ".join(
        f"{e['effect_type']} {e['effect_id']} (seq {e['seq']}, step {e['step']}, "
        f"{e['status']})" for e in unresolved[:10])
    more = f"; and {len(unresolved) - 10} more" if len(unresolved) > 10 else ""
    return (f"run {parent_id} has {len(unresolved)} effect(s) whose outcome at the provider "
            f"is unknown: {named}{more}. A {what} from checkpoint {request.from_seq} runs "
            "those steps again under its own keys, so the provider may make the same write "
            "a second time. Find out first (onward effects resolve EFFECT_ID, or let the "
            f"parent's retry look it up: onward runs continue {parent_id}), or start it "
            "anyway with --allow-unresolved (allow_unresolved in the API, the form's "
            "box in the console)")


def _signed_workflow(parent: RowMapping, cp: Mapping[str, Any]) -> str:
    """The workflow the copy runs: the one the verified checkpoint's MAC names (envelope 2
    on), which the parent's row must agree with."""
    signed = cp["workflow"]
    if signed is not None and signed != parent["workflow"]:
        raise IntegrityViolation(
            f"run {parent['id']} names workflow {parent['workflow']!r} but its checkpoint "
            f"{cp['seq']} was signed for {signed!r}: the run's row was edited outside onward")
    return str(signed or parent["workflow"])


def resolve_state_txn(conn: Connection, state: dict[str, Any]) -> dict[str, Any]:
    """The state itself, when the checkpoint stores it apart as an artifact reference."""
    ref = artifact_ref(state)
    if ref is None:
        return state
    body = conn.execute(sa.select(artifacts.c.body)
                        .where(artifacts.c.sha256 == ref["sha256"])).scalar()
    if body is None or sha256_hex(bytes(body)) != ref["sha256"]:
        raise IntegrityViolation(f"the state artifact {ref['sha256'][:12]}… is missing or "
                                 "does not match its hash")
    resolved: dict[str, Any] = json.loads(bytes(body))
    return resolved


def refuse_patch_at_approval(cp: Mapping[str, Any], run_id: UUID) -> None:
    """A branch may not change the state of a checkpoint that waits for approval: the
    approval it would ask is for the artifact the parent built from the unpatched state, so
    the approver would authorise one thing while the branch acts on another. Refusing is
    simpler and safer than rebuilding the artifact (only the asking step knows how): the
    branch starts from the checkpoint before, whose next step asks again."""
    control = parse_control(cp["control"], f"checkpoint {cp['seq']} of run {run_id}")
    if not isinstance(control, ApprovalControl):
        return
    before = f"checkpoint {cp['seq'] - 1}" + (
        " of the run this one was copied from" if cp["outcome"] == OutcomeKind.FORK.value else "")
    raise OperationRefused(
        f"checkpoint {cp['seq']} of run {run_id} waits for approval {control.action!r} "
        f"of an artifact built from the state before your patch: the approver would approve "
        f"the old values while the branch acts on the new ones. To change the state, branch "
        f"from {before}, whose next step {cp['step']} asks for the approval again with the "
        "patched state")


def preview_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID, seq: int,
                patch: list[dict[str, Any]], max_state_bytes: int) -> list[PatchChange]:
    """The diff a branch from checkpoint ``seq`` of ``run_id`` would start from."""
    cp = checkpoint_row_txn(conn, run_id, seq)
    run = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().first()
    if cp is None or run is None:
        raise OperationRefused(f"run {run_id} has no checkpoint {seq}")
    refuse_patch_at_approval(cp, run_id)
    verify_source_txn(conn, keys, run, seq)
    state = resolve_state_txn(conn, dict(state_of(cp)))
    apply_patch(state, patch, max_state_bytes)
    return describe_patch(state, patch)


def _parent(conn: Connection, actor: Actor, run_id: UUID) -> RowMapping:
    """The parent's row, held KEY SHARE to our commit before anything of it is read: a
    retention compaction holds it FOR UPDATE to its commit and keeps a run with a replay or
    branch going, so it either sees ours, or finishes first and we read what it left (a
    compacted checkpoint is refused). The same lock the new run's foreign key takes anyway,
    only taken before the reads; a commit's update of the parent does not conflict."""
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id)
                       .with_for_update(key_share=True)).mappings().first()
    if row is None:
        raise UnknownRun(f"no run {run_id}")
    if row["tenant_id"] != actor.tenant_id:
        raise OperationRefused(f"run {run_id} belongs to tenant {row['tenant_id']!r}; "
                               f"{actor.name} operates tenant {actor.tenant_id!r}")
    return row


def _checkpoint(conn: Connection, parent: RowMapping, seq: int) -> dict[str, Any]:
    row = checkpoint_row_txn(conn, parent["id"], seq)
    if row is None:
        first = conn.execute(sa.select(sa.func.min(checkpoints.c.seq))
                             .where(checkpoints.c.run_id == parent["id"])).scalar()
        raise OperationRefused(f"run {parent['id']} has no checkpoint {seq} (its checkpoints "
                               f"are {first}..{parent['seq']})")
    if row["outcome"] in (OutcomeKind.FINISH.value, OutcomeKind.FAIL.value):
        raise OperationRefused(f"checkpoint {seq} of run {parent['id']} ends the run "
                               f"({row['outcome']}): nothing follows it; start from an earlier "
                               "checkpoint")
    return row


@dataclass(frozen=True)
class _Start:
    status: RunStatus
    step: str | None
    control: dict[str, Any] | None = None
    waiting_on: str | None = None
    wait_until: datetime | None = None  # a signal wait's timeout
    due_at: Any = None
    approval: dict[str, Any] | None = None
    last_error: dict[str, Any] | None = None


def _start(conn: Connection, keys: CheckpointKeys, parent: RowMapping, cp: Mapping[str, Any],
           mode: LaunchMode, run_id: UUID) -> _Start:
    """Where the new run begins: the step after checkpoint k, or the wait k recorded."""
    control = parse_control(cp["control"], f"checkpoint {cp['seq']} of run {parent['id']}")
    if control is None:
        return _Start(RunStatus.RUNNING, cp["next_step"], None)
    if mode is LaunchMode.EVIDENCE:
        return _evidence_start(conn, keys, parent, cp, control)
    if isinstance(control, TimerControl):
        return _Start(RunStatus.RUNNING, control.then, control.stored(),
                      due_at=datetime.fromisoformat(control.until))
    if isinstance(control, SignalControl):
        return _signal_start(conn, cp, control)
    asked = conn.execute(sa.select(approvals).where(
        approvals.c.id == UUID(control.approval_id))).mappings().first()
    if asked is None:
        raise OperationRefused(f"checkpoint {cp['seq']} waits for approval "
                               f"{control.approval_id}, which does not exist")
    _check_asked_artifact(asked, control)
    check_terms(keys, asked)  # approvers and lifetime are copied: only as they were signed
    approval_id = uuid7()
    lifetime: timedelta = asked["expires_at"] - asked["created_at"]
    now = conn.execute(sa.select(sa.func.onward.now())).scalar_one()
    values = {"workflow_version": asked["workflow_version"], "step": asked["step"],
              "action": asked["action"], "artifact_hash": asked["artifact_hash"],
              "artifact": asked["artifact"], "approvers": asked["approvers"],
              "created_at": now, "expires_at": now + lifetime,
              "status": ApprovalStatus.PENDING.value}
    return _Start(RunStatus.WAITING, control.then,
                  control.model_copy(update={"approval_id": str(approval_id)}).stored(),
                  waiting_on=f"approval:{approval_id}",
                  approval={"id": approval_id, "values": values,
                            "source": {k: asked[k] for k in ("id", "run_id", "seq")}})


def _artifact_for(keys: CheckpointKeys, approval: dict[str, Any],
                  asked: dict[str, Any]) -> Any:
    """The artifact the new approval stores: a sealed one opened where it was asked and
    sealed again for the new run and approval (ledger/crypto.py); as it is without keys
    (it then does not open in the new run)."""
    artifact, source = asked["artifact"], approval.get("source")
    if keys.crypt is None or source is None or not is_sealed(artifact):
        return artifact
    tenant = str(asked["tenant_id"])
    plain = keys.crypt.open(artifact, tenant=tenant, run_id=source["run_id"],
                            seq=source["seq"], field=approval_field(source["id"]))
    return keys.crypt.seal(plain, Place(tenant, asked["run_id"], asked["seq"],
                                        approval_field(asked["id"])))


def _check_asked_artifact(asked: RowMapping, control: ApprovalControl) -> None:
    """The new run asks its approver about the parent's artifact: it must be the one the
    MAC'd checkpoint names, or the approver would be shown something else."""
    shown = (asked["artifact_hash"] if is_sealed(asked["artifact"])  # bound where opened
             else sha256_hex(canonical_json(asked["artifact"])))
    if not shown == asked["artifact_hash"] == control.artifact_hash:
        raise IntegrityViolation(
            f"approval {asked['id']}'s artifact (sha256 {shown[:12]}…, recorded as "
            f"{str(asked['artifact_hash'])[:12]}…) is not the artifact checkpoint "
            f"{asked['seq']} asked about ({control.artifact_hash[:12]}…): it was "
            "edited outside onward, so it is not asked again")


def _signal_start(conn: Connection, cp: Mapping[str, Any], control: SignalControl) -> _Start:
    """The new run gets the signal wait the parent was given, counted from now by the
    database's clock (as an approval's lifetime is): the reaper times it out like the
    parent's. The timeout is the one the step asked for (``timeout_s``); checkpoints
    written before it was recorded give it as their timeout time minus their commit time."""
    wait_until = None
    if control.timeout_s is not None:
        timeout = timedelta(seconds=control.timeout_s)
    elif control.timeout_at:
        timeout = datetime.fromisoformat(control.timeout_at) - cp["created_at"]
    else:
        timeout = None
    if timeout is not None:
        wait_until = conn.execute(sa.select(sa.func.onward.now())).scalar_one() + timeout
        control = control.model_copy(update={"timeout_at": wait_until.isoformat()})
    return _Start(RunStatus.WAITING, control.then, control.stored(),
                  waiting_on=f"signal:{control.name}", wait_until=wait_until)


def _evidence_start(conn: Connection, keys: CheckpointKeys, parent: RowMapping,
                    cp: Mapping[str, Any],
                    control: TimerControl | ApprovalControl | SignalControl) -> _Start:
    """An evidence replay from a wait follows the decision its source recorded, or stops."""
    chain = conn.exec_driver_sql(SOURCE_CHAIN, {"run_id": parent["id"]}).mappings()
    source = evidence_source([dict(row) for row in chain], keys)
    seq = cp["seq"]
    approval = signal = None
    if source is not None and isinstance(control, ApprovalControl):
        approval = conn.exec_driver_sql(APPROVAL_AT, {"run_id": source, "seq": seq}) \
            .mappings().first()
        if approval is not None:  # followed only as the decision was signed
            check_decision(keys, approval)
    if source is not None and isinstance(control, SignalControl):
        signal = conn.exec_driver_sql(SIGNAL_AT, {"run_id": source, "seq": seq,
                                                  "name": control.name}).first()
    timed_out = None
    if (source is not None and signal is None and isinstance(control, SignalControl)
            and control.on_timeout):
        timed_out = conn.exec_driver_sql(STEP_AFTER, {"run_id": source, "seq": seq}).scalar()
    resumed = resume_after_wait(control, seq, dict(approval) if approval else None,
                                signal is not None, timed_out)
    if isinstance(resumed, Divergence):
        return _Start(RunStatus.DIVERGED, control.then, control.stored(),
                      last_error=resumed.report(parent["id"], source))
    if approval is not None:
        control = control.model_copy(update={"approval_id": str(approval["id"])})
    return _Start(RunStatus.RUNNING, resumed, control.stored())


_SPENT_BEFORE = sql.text("spent_before")


def _budgets(conn: Connection, parent: RowMapping, seq: int,
             policy: BudgetPolicy) -> dict[str, Any]:
    if policy is BudgetPolicy.RESET:
        return {}
    spent = conn.execute(_SPENT_BEFORE, {"run_id": parent["id"], "seq": seq}).mappings().one()
    deadline = None
    if parent["deadline_at"] is not None:
        deadline = sa.func.onward.now() + (parent["deadline_at"] - parent["created_at"])
    return {"budget_attempts": parent["budget_attempts"], "budget_tokens": parent["budget_tokens"],
            "budget_cost_usd": parent["budget_cost_usd"], "deadline_at": deadline,
            "used_tokens": spent["tokens"], "used_cost_usd": spent["cost_usd"],
            "attempts_total": spent["attempts"]}
