"""The HTTP API (``/api/v1``): one route per CLI command, the same semantics and refusals.

Every route authenticates the bearer token first (401), checks the role for its command
before anything else (403, audited), works in the token's tenant only, and answers errors
as ``application/problem+json``. Lists page with an opaque ``cursor`` (``next_cursor``).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from console.common import approval_of, plain, run_of
from console.render import run_detail
from ledger import Ledger, RunStatus, UnknownRun
from ledger.exceptions import InvalidInput, Unauthenticated
from ledger.forks import BudgetPolicy
from ledger.inspection import RunFilter
from ledger.json_input import NotPlainJson, read_json
from ledger.operations import Finding, resolve_plan
from ledger.vocabulary import ApprovalStatus, AuditAction, EffectStatus, LaunchMode, Priority

__all__ = [
    "Authed",
    "BranchBody",
    "DecisionBody",
    "Limit",
    "PatchBody",
    "Reason",
    "ReasonBody",
    "RepeatBody",
    "ReplayBody",
    "ResolveBody",
    "SignalBody",
    "StartBody",
    "Strict",
    "approve",
    "authenticated",
    "bearer",
    "branch_run",
    "cancel_run",
    "continue_run",
    "decode",
    "encode",
    "list_approvals",
    "list_audit",
    "list_effects",
    "list_runs",
    "page",
    "preview_branch",
    "reject",
    "repeat_effect",
    "replay_run",
    "resolve_effect",
    "router",
    "run_counts",
    "show_approval",
    "show_effect",
    "show_run",
    "signal_run",
    "start_run",
    "state_diff",
    "verify_run",
    "wait_run",
    "whoami",
    "without_nul",
]


bearer = HTTPBearer(auto_error=False, description="A token from `onward tokens create`.")
router = APIRouter(prefix="/api/v1")
Limit = Annotated[int, Query(ge=1, le=500)]
Reason = Annotated[str, Field(min_length=1, max_length=2000, description="Why (audited).")]


def authenticated(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Ledger:
    """The ledger acting as the bearer token's actor; 401 without a valid token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthenticated("send Authorization: Bearer <token> (onward tokens create)")
    base: Ledger = request.app.state.ledger
    return base.authenticate(credentials.credentials)


async def without_nul(request: Request, ledger: Annotated[Ledger, Depends(authenticated)]
                      ) -> Ledger:
    """Refuse (422) a NUL character anywhere in the request, after authentication (so an
    anonymous request is still 401): PostgreSQL stores no NUL in text or JSON, and a NUL
    that reached a statement, an audit row or an error message failed deep inside as a
    server error. Path, query and the JSON body are checked, keys included."""
    found = _nul_in(request.path_params, "path") or _nul_in(
        dict(request.query_params.multi_items()), "query")
    if found is not None:
        raise InvalidInput(f"{found} holds a NUL character (\\u0000), which onward cannot "
                           "store: remove or replace it")
    body = await request.body()
    if body:
        try:
            read_json(body)
        except NotPlainJson as exc:
            raise InvalidInput(f"the request body is not JSON onward can store: {exc}") \
                from None
        except ValueError:
            pass  # not JSON: the body's own validation answers 422
    return ledger


def _nul_in(value: Any, where: str) -> str | None:
    """Where in ``value`` (a JSON-like value, walked without recursion: a body may nest
    deeply) a NUL character is, or None."""
    pending: list[tuple[Any, str]] = [(value, where)]
    while pending:
        item, place = pending.pop()
        if isinstance(item, str) and "\x00" in item:
            return place
        if isinstance(item, dict):
            for key, inner in item.items():
                if "\x00" in str(key):
                    return f"{place}: a key"
                pending.append((inner, f"{place}.{key}"))
        elif isinstance(item, list):
            pending.extend((inner, f"{place}[{n}]") for n, inner in enumerate(item))
    return None


Authed = Annotated[Ledger, Depends(without_nul)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartBody(Strict):
    workflow: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, max_length=500)
    conversation_id: str | None = Field(default=None, max_length=500)
    priority: Priority = Priority.NORMAL  # who goes first (docs/limits.md)


class ReasonBody(Strict):
    reason: Reason


class ReplayBody(Strict):
    reason: Reason
    from_seq: int = Field(default=0, ge=0, le=2**31 - 1)
    mode: Literal["evidence", "simulation", "live"] = "evidence"
    budgets: BudgetPolicy = BudgetPolicy.INHERITED
    allow_irreversible: bool = False
    allow_unresolved: bool = Field(
        default=False, description="Start even though the parent has effects whose outcome "
        "is unknown that the new run would make again (live replays and branches)")


class PatchBody(Strict):
    from_seq: int = Field(default=0, ge=0, le=2**31 - 1)
    patch: list[dict[str, Any]] = Field(min_length=1, max_length=1000,
                                        description="RFC 6902 JSON Patch")


class BranchBody(PatchBody):
    reason: Reason
    budgets: BudgetPolicy = BudgetPolicy.INHERITED
    allow_irreversible: bool = False
    allow_unresolved: bool = Field(
        default=False, description="Start even though the parent has effects whose outcome "
        "is unknown that the new run would make again (live replays and branches)")


class SignalBody(Strict):
    name: str = Field(min_length=1, max_length=200)
    payload: Any = None


class DecisionBody(Strict):
    shown_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        validation_alias=AliasChoices("shown_hash", "artifact_hash"),
        description="sha256 of the canonical JSON (sorted keys, no spaces, UTF-8) of the "
                    "artifact as your client showed it to the approver: compute it from the "
                    "`artifact` you displayed, do not copy the approval's `artifact_hash`. "
                    "Refused unless it is the hash the run bound when it asked. "
                    "(`artifact_hash` is accepted as a deprecated name.)")
    comment: str | None = Field(default=None, max_length=2000)


class RepeatBody(Strict):
    reason: Reason
    effect_type: str | None = Field(default=None, max_length=200)
    # the effect's attempt count the client showed: refused if it changed since
    attempts: int | None = Field(default=None, ge=0)


class ResolveBody(Strict):
    reason: Reason
    finding: Literal["completed", "not_sent"] = Field(
        description="completed: the provider holds the object (give provider_ref); "
                    "not_sent: it holds nothing for the effect's key (sent again, same key)")
    provider_ref: str | None = Field(default=None, max_length=1000)
    result: dict[str, Any] | None = Field(
        default=None, description="what the provider holds (completed only)")
    effect_type: str | None = Field(default=None, max_length=200)
    # the effect's attempt count the client showed (GET /effects/{id}): refused if it changed
    attempts: int = Field(ge=0)
    allow_in_flight: bool = Field(
        default=False, description="not_sent although a call may still land (refused "
        "otherwise until ONWARD_CALL_LANDING_S past the cover of a call never seen to end, "
        "or past the end of one that ended without an answer); audited")


def encode(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


T = TypeVar("T")


def decode(cursor: str | None, parse: Callable[[Any], T]) -> T | None:
    """The position a ``next_cursor`` names, read by ``parse``; anything else a client sends
    is refused as bad input (422), never a server error."""
    if cursor is None:
        return None
    try:
        return parse(read_json(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))))
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise InvalidInput("cursor: pass back the next_cursor a list answered") from exc


def _uuid_cursor(value: Any) -> UUID:
    if not isinstance(value, str):
        raise TypeError("a run cursor is a run id")
    return UUID(value)


def _int_cursor(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise TypeError("this cursor is a non-negative integer")
    return value


def _approval_cursor(value: Any) -> tuple[datetime, UUID]:
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, str) for v in value)):
        raise TypeError("an approvals cursor is [created_at, id]")
    when = datetime.fromisoformat(value[0])
    if when.tzinfo is None:
        raise ValueError("an approvals cursor's time has a zone")
    return when, UUID(value[1])


def page(items: list[Any], limit: int, cursor: Any) -> dict[str, Any]:
    return {"items": plain(items), "next_cursor": encode(cursor) if len(items) == limit
            else None}


# -- runs ---------------------------------------------------------------------------------
@router.get("/whoami", tags=["auth"])
def whoami(ledger: Authed) -> dict[str, Any]:
    """Who the token names: actor, role, approver roles, tenant."""
    a = ledger.actor
    return {"actor": a.name, "role": a.role.value, "approver_roles": list(a.approver_roles),
            "tenant_id": a.tenant_id, "token_id": str(a.token_id) if a.token_id else None}


@router.get("/runs", tags=["runs"])
def list_runs(ledger: Authed, status: RunStatus | None = None,
              workflow: str | None = None, version: int | None = None,
              since: datetime | None = None, until: datetime | None = None,
              prefix: Annotated[str | None, Query(pattern=r"^[0-9a-fA-F-]{1,36}$")] = None,
              limit: Limit = 50, cursor: str | None = None) -> dict[str, Any]:
    """Runs of the token's tenant, newest first (``runs ls``)."""
    before = decode(cursor, _uuid_cursor)
    where = RunFilter(status=status, workflow=workflow, workflow_version=version, since=since,
                      until=until, id_prefix=prefix, before=before)
    found = ledger.find_runs(where, limit=limit)
    return page([_run_row(r) for r in found], limit, str(found[-1].id) if found else None)


def _run_row(run: Any) -> dict[str, Any]:
    from console.commands_runs import run_row

    return run_row(run)


@router.get("/runs/counts", tags=["runs"])
def run_counts(ledger: Authed) -> dict[str, int]:
    """How many runs are parked, waiting, running and failed."""
    return ledger.run_counts()


@router.post("/runs", tags=["runs"], status_code=201)
def start_run(ledger: Authed, body: StartBody) -> dict[str, Any]:
    """Start a run (operator; ``onward start``); an idempotency key returns the same run."""
    ledger.require(AuditAction.START)
    run_id = ledger.start_run_command(body.workflow, body.input,
                                      idempotency_key=body.idempotency_key,
                                      conversation_id=body.conversation_id,
                                      priority=body.priority)
    return {"run_id": str(run_id)}


@router.get("/runs/{run}", tags=["runs"])
def show_run(ledger: Authed, run: str) -> dict[str, Any]:
    """A run in full (``runs show``); audited as an inspection."""
    run_id = run_of(ledger, run, AuditAction.INSPECT)
    ledger.inspected(run_id=run_id)
    return run_detail(ledger, run_id)


@router.get("/runs/{run}/wait", tags=["runs"])
def wait_run(ledger: Authed, run: str,
             timeout: Annotated[float, Query(ge=0, le=60)] = 30) -> dict[str, Any]:
    """Wait until the run is no longer running (finished, waiting, parked) or ``timeout``
    seconds pass; answers its status either way (``runs wait``)."""
    run_id = run_of(ledger, run)
    deadline = time.monotonic() + timeout
    while True:
        found = ledger.get_run(run_id)
        if found is None:
            raise UnknownRun(f"no run {run_id}")
        if found.status is not RunStatus.RUNNING or time.monotonic() >= deadline:
            return {**_run_row(found), "stopped": found.status is not RunStatus.RUNNING}
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


@router.post("/runs/{run}/continue", tags=["runs"])
def continue_run(ledger: Authed, run: str, body: ReasonBody) -> dict[str, Any]:
    """Resume the original run at its current seq (``runs continue``)."""
    run_id = run_of(ledger, run, AuditAction.CONTINUE)
    return plain(ledger.continue_run(run_id, body.reason))


@router.post("/runs/{run}/replay", tags=["runs"], status_code=201)
def replay_run(ledger: Authed, run: str, body: ReplayBody) -> dict[str, Any]:
    """A new run from a copy of a checkpoint, in a mode (``runs replay``)."""
    run_id = run_of(ledger, run, AuditAction.REPLAY)
    return plain(ledger.replay(run_id, body.from_seq, LaunchMode(body.mode), body.reason,
                               budgets=body.budgets,
                               allow_irreversible=body.allow_irreversible,
                               allow_unresolved=body.allow_unresolved))


@router.post("/runs/{run}/branch/preview", tags=["runs"])
def preview_branch(ledger: Authed, run: str, body: PatchBody) -> dict[str, Any]:
    """The state diff a branch would start from (nothing is written)."""
    run_id = run_of(ledger, run, AuditAction.BRANCH)
    return {"changes": plain(ledger.preview_branch(run_id, body.from_seq, body.patch))}


@router.post("/runs/{run}/branch", tags=["runs"], status_code=201)
def branch_run(ledger: Authed, run: str, body: BranchBody) -> dict[str, Any]:
    """A new live run from an edited checkpoint state (``runs branch``)."""
    from tasks.operator import state_check

    run_id = run_of(ledger, run, AuditAction.BRANCH)
    return plain(ledger.branch(run_id, body.from_seq, body.patch, body.reason,
                               allow_irreversible=body.allow_irreversible,
                               allow_unresolved=body.allow_unresolved,
                               budgets=body.budgets,
                               check_state=state_check(ledger.settings.workflows)))


@router.post("/runs/{run}/cancel", tags=["runs"])
def cancel_run(ledger: Authed, run: str, body: ReasonBody) -> dict[str, Any]:
    """Stop a run that has not finished (``runs cancel``)."""
    run_id = run_of(ledger, run, AuditAction.CANCEL)
    return plain(ledger.cancel(run_id, body.reason))


@router.post("/runs/{run}/signals", tags=["runs"])
def signal_run(ledger: Authed, run: str, body: SignalBody) -> dict[str, Any]:
    """Send a named signal; kept if the run does not wait for it yet."""
    run_id = run_of(ledger, run, AuditAction.SIGNAL)
    return {"woke": ledger.signal(run_id, body.name, body.payload)}


@router.post("/runs/{run}/verify", tags=["runs"])
def verify_run(ledger: Authed, run: str) -> dict[str, Any]:
    """Check the run's stored history (MACs, chain, head, artifacts); audited."""
    run_id = run_of(ledger, run, AuditAction.VERIFY)
    problems = ledger.verify_run(run_id)
    ledger.verified(run_id, 1, len(problems), mode="run")
    return {"run_id": str(run_id), "verifies": not problems,
            "problems": [{"seq": p.seq, "kind": p.kind, "detail": p.detail}
                         for p in problems]}


@router.get("/runs/{run}/diff", tags=["runs"])
def state_diff(ledger: Authed, run: str,
               from_seq: Annotated[int, Query(alias="from", ge=0, le=2**31 - 1)],
               to_seq: Annotated[int, Query(alias="to", ge=0, le=2**31 - 1)]) -> dict[str, Any]:
    """What changed in the state between two checkpoints."""
    run_id = run_of(ledger, run)
    return {"changes": plain(ledger.state_diff(run_id, from_seq, to_seq))}


# -- effects ------------------------------------------------------------------------------
@router.get("/effects", tags=["effects"])
def list_effects(ledger: Authed, run: str | None = None, status: EffectStatus | None = None,
                 effect_type: str | None = None, limit: Limit = 50,
                 cursor: str | None = None) -> dict[str, Any]:
    """Effects, newest first (``effects ls``)."""
    offset = decode(cursor, _int_cursor) or 0
    found = ledger.find_effects(run_id=run_of(ledger, run) if run else None, status=status,
                                effect_type=effect_type, limit=limit, offset=offset)
    return page(found, limit, offset + limit)


@router.get("/effects/{effect_id}", tags=["effects"])
def show_effect(ledger: Authed, effect_id: str,
                effect_type: str | None = None) -> dict[str, Any]:
    """One effect and every attempt (``effects show``); audited as an inspection."""
    ledger.require(AuditAction.INSPECT)
    effect = ledger.find_effect(effect_id, effect_type)
    ledger.inspected(run_id=effect.run_id, effect_id=effect.effect_id)
    return {"effect": plain(effect), "attempts": plain(ledger.effect_attempts(effect))}


@router.post("/effects/{effect_id}/repeat", tags=["effects"])
def repeat_effect(ledger: Authed, effect_id: str, body: RepeatBody) -> dict[str, Any]:
    """PRIVILEGED (admin): call the tool again with a NEW recorded key (``effects repeat``)."""
    from tasks.operator import plan_repeat
    from tasks.operator import repeat_effect as repeat

    ledger.require(AuditAction.REPEAT_EFFECT)
    done = repeat(ledger, plan_repeat(ledger, ledger.find_effect(effect_id, body.effect_type)),
                  body.reason, shown_attempts=body.attempts)
    return {"outcome": done.outcome, "provider_ref": done.provider_ref,
            "attempt": done.started.attempt, "key": done.started.idempotency_key,
            "error": done.error, "effect": plain(done.effect)}


@router.post("/effects/{effect_id}/resolve", tags=["effects"])
def resolve_effect(ledger: Authed, effect_id: str, body: ResolveBody) -> dict[str, Any]:
    """PRIVILEGED (admin): record what a person found at the provider for an effect whose
    outcome is unknown (``effects resolve``); nothing is sent. Continue the run afterwards."""
    ledger.require(AuditAction.RESOLVE_EFFECT)
    effect = ledger.find_effect(effect_id, body.effect_type)
    finding = Finding(body.finding)
    if finding is Finding.NOT_SENT and body.result is not None:
        raise ledger.refuse(AuditAction.RESOLVE_EFFECT, InvalidInput(
            "result goes with completed: a write that did not happen has none"),
            reason=body.reason, run_id=effect.run_id, effect_id=effect.effect_id)
    plan = {**resolve_plan(effect, finding, body.provider_ref, body.result),
            "attempts": body.attempts}
    done = ledger.resolve_effect(effect.effect_type, effect.effect_id, body.reason, plan,
                                 finding=finding, provider_ref=body.provider_ref,
                                 result=body.result, allow_in_flight=body.allow_in_flight)
    return {"finding": finding.value, "effect": plain(done)}


# -- approvals ----------------------------------------------------------------------------
@router.get("/approvals", tags=["approvals"])
def list_approvals(ledger: Authed, status: ApprovalStatus | None = ApprovalStatus.PENDING,
                   run: str | None = None, mine: bool = False, limit: Limit = 50,
                   cursor: str | None = None) -> dict[str, Any]:
    """Approvals, newest first (``approvals ls``); ``mine``: those you may decide."""
    before = decode(cursor, _approval_cursor)
    found = ledger.approvals(status=status, run_id=run_of(ledger, run) if run else None,
                             limit=limit, before=before, approver=mine)
    last = [found[-1].created_at.isoformat(), str(found[-1].id)] if found else None
    return page(found, limit, last)


@router.get("/approvals/{approval}", tags=["approvals"])
def show_approval(ledger: Authed, approval: str) -> dict[str, Any]:
    """One approval (id or unique prefix) with its artifact exactly as hashed."""
    return plain(ledger.get_approval(approval_of(ledger, approval)))


def _decide(ledger: Ledger, approval: str, body: DecisionBody, approve: bool) -> Any:
    action = AuditAction.APPROVE if approve else AuditAction.REJECT
    approval_id = approval_of(ledger, approval, action)
    decide = ledger.approve if approve else ledger.reject
    return plain(decide(approval_id, artifact_hash=body.shown_hash, comment=body.comment))


@router.post("/approvals/{approval}/approve", tags=["approvals"])
def approve(ledger: Authed, approval: str, body: DecisionBody) -> dict[str, Any]:
    """Approve the artifact your client showed (``shown_hash``); the run resumes. The
    approval is named by its id or a unique prefix (6+ hex digits), as in the CLI."""
    return dict(_decide(ledger, approval, body, True))


@router.post("/approvals/{approval}/reject", tags=["approvals"])
def reject(ledger: Authed, approval: str, body: DecisionBody) -> dict[str, Any]:
    """Reject; the run goes to its rejection step or fails."""
    return dict(_decide(ledger, approval, body, False))


# -- audit --------------------------------------------------------------------------------
@router.get("/audit", tags=["audit"])
def list_audit(ledger: Authed, run: str | None = None, action: str | None = None,
               actor: str | None = None, outcome: Literal["done", "refused"] | None = None,
               since: datetime | None = None, limit: Limit = 50,
               cursor: str | None = None) -> dict[str, Any]:
    """The tenant's audit log, newest first (``audit ls``)."""
    before = decode(cursor, _int_cursor)
    rows = ledger.audit(run_id=run_of(ledger, run) if run else None, action=action,
                        actor=actor, outcome=outcome, since=since, limit=limit,
                        before=before)
    return page(rows, limit, rows[-1].id if rows else None)
