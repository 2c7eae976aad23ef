"""The web page: server-rendered HTML (Jinja2, autoescaped) with htmx for partial updates.

Sign-in puts the token in an HttpOnly, SameSite=Strict cookie; every form carries a CSRF
value derived from the token, checked on every POST. Each page and action goes through the
same ``Ledger`` calls as the API and the CLI: the role is checked first, refusals are
audited, reads are scoped to the token's tenant.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from console.common import approval_of
from console.http.errors import status_of
from ledger import Ledger, RunStatus
from ledger.checkpoints import canonical_json, sha256_hex
from ledger.effects import Effect
from ledger.exceptions import InvalidInput, OnwardError, PermissionDenied, Unauthenticated
from ledger.inspection import RunFilter
from ledger.json_input import read_json
from ledger.operations import Finding, resolve_plan
from ledger.vocabulary import ApprovalStatus, AuditAction, LaunchMode

__all__ = [
    "COOKIE",
    "TEMPLATES",
    "Text",
    "approvals_page",
    "audit_page",
    "branch_preview",
    "check_csrf",
    "csrf_of",
    "decide_page",
    "diff_fragment",
    "failed",
    "login",
    "login_page",
    "logout",
    "pretty",
    "render",
    "repeat_page",
    "resolve_page",
    "router",
    "run_command",
    "run_context",
    "run_events",
    "run_page",
    "runs_page",
    "signed_in",
    "summary_fragment",
    "timeline_fragment",
    "verify_fragment",
    "why_waiting",
]


COOKIE = "onward_token"
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parents[1] / "templates"))
router = APIRouter(include_in_schema=False)
Text = Annotated[str, Form()]


def csrf_of(token: str) -> str:
    return hmac.new(token.encode(), b"onward-console-csrf", hashlib.sha256).hexdigest()[:32]


def signed_in(request: Request) -> Ledger:
    token = request.cookies.get(COOKIE)
    if not token:
        raise Unauthenticated("sign in with a token")
    base: Ledger = request.app.state.ledger
    return base.authenticate(token)


def check_csrf(request: Request, csrf: str | None) -> None:
    token = request.cookies.get(COOKIE, "")
    sent = csrf or request.headers.get("x-csrf-token", "")
    if not token or not hmac.compare_digest(sent, csrf_of(token)):
        raise PermissionDenied("this form is stale or was not sent by the console (CSRF "
                               "check): reload the page; nothing was done")


def render(request: Request, name: str, ledger: Ledger | None, code: int = 200,
           **context: Any) -> HTMLResponse:
    actor = ledger.actor if ledger else None
    token = request.cookies.get(COOKIE, "")
    return TEMPLATES.TemplateResponse(request, name, {
        "actor": actor, "may": (lambda action: actor is not None and actor.may(
            AuditAction(action))), "csrf": csrf_of(token) if token else "",
        "pretty": pretty, **context}, status_code=code)


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def failed(request: Request, exc: Exception, ledger: Ledger | None) -> Response:
    """A refusal as a page (or, for htmx, a fragment) with the matching status."""
    status, title = status_of(exc)
    if status == 401 and not request.headers.get("hx-request"):
        return RedirectResponse("/login", status_code=303)
    return render(request, "error.html", ledger, code=status, title=title, detail=str(exc))


# -- sign in ------------------------------------------------------------------------------
@router.get("/login")
def login_page(request: Request, token: str | None = None) -> Response:
    """With ``?token=`` (the link ``onward console`` prints): sign in and drop the token
    from the address; otherwise a form to paste one."""
    if token:
        return _sign_in(request, token)
    return render(request, "login.html", None)


@router.post("/login")
def login(request: Request, token: Text) -> Response:
    return _sign_in(request, token.strip())


def _sign_in(request: Request, token: str) -> Response:
    try:
        ledger = request.app.state.ledger.authenticate(token)
    except Unauthenticated as exc:
        return render(request, "login.html", None, code=401, error=str(exc))
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https", max_age=12 * 3600)
    del ledger
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# -- runs ---------------------------------------------------------------------------------
_AGO = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(days=1),
        "7d": timedelta(days=7)}


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, status: str = "", workflow: str = "", version: str = "",
              since: str = "", q: str = "", before: str = "") -> Response:
    """Runs: counts that need a person at the top, filters, find by id or prefix."""
    try:
        ledger = signed_in(request)
        if q.strip():
            return RedirectResponse(f"/runs/{ledger.resolve_run(q.strip())}", status_code=303)
        where = RunFilter(
            status=RunStatus(status) if status else None, workflow=workflow or None,
            workflow_version=int(version) if version.isdigit() else None,
            since=_AGO.get(since),  # counted back from the database's clock
            before=UUID(before) if before else None)
        runs = ledger.find_runs(where, limit=50)
        return render(request, "runs.html", ledger, runs=runs, counts=ledger.run_counts(),
                      statuses=[s.value for s in RunStatus], ages=list(_AGO),
                      filters={"status": status, "workflow": workflow, "version": version,
                               "since": since})
    except (OnwardError, ValueError) as exc:
        return failed(request, exc if isinstance(exc, OnwardError) else InvalidInput(str(exc)),
                      None)


def run_context(ledger: Ledger, run_id: UUID, before_epoch: int | None = None) -> dict[str, Any]:
    run = ledger.get_run(run_id)
    if run is None:
        raise InvalidInput(f"no run {run_id}")
    timeline = ledger.timeline_page(run_id, before_epoch=before_epoch)
    effects = ledger.effects(run_id)
    return {
        "run": run, "timeline": timeline, "why": why_waiting(ledger, run),
        "result_problem": ledger.result_problem(run_id),
        "checkpoints": ledger.checkpoint_summaries(run_id),
        "effects": effects, "unknown": [e for e in effects if e.outcome_unknown],
        "model_calls": ledger.model_calls(run_id),
        "approvals": ledger.approvals(run_id=run_id, status=None),
        "parent": ledger.get_run(run.parent_run_id) if run.parent_run_id else None,
        "children": ledger.children(run_id), "audit": ledger.audit(run_id=run_id, limit=20),
        "modes": [m.value for m in (LaunchMode.EVIDENCE, LaunchMode.SIMULATION,
                                    LaunchMode.LIVE)],
    }


def why_waiting(ledger: Ledger, run: Any) -> str | None:
    """Why the run is not moving right now, in words (by the database's clock)."""
    now = ledger.now()
    waiting = str(run.waiting_on or "")
    if run.status.terminal:
        return None
    if run.status is RunStatus.NEEDS_REVIEW:
        return f"parked for a person: {run.parked_reason or 'see the last error'}"
    if waiting.startswith("approval:"):
        return f"waits for approval {waiting.split(':', 1)[1]} (see approvals below)"
    if waiting.startswith("signal:"):
        until = f" until {run.wait_until:%Y-%m-%d %H:%M:%S}" if run.wait_until else ""
        return f"waits for the signal {waiting.split(':', 1)[1]!r}{until}"
    if waiting.startswith("timer:"):
        return f"sleeps on a durable timer ({waiting})"
    if waiting.startswith("effect:"):
        return f"waits for an accepted effect's outcome ({waiting})"
    if waiting.startswith("limit:"):
        return (f"waits for a slot of the fleet-wide limit {waiting.split(':', 1)[1]!r}, "
                "holding no worker and no lease; it is woken when a slot frees "
                "(onward limits shows each limit's use)")
    if run.lease_expires_at and run.lease_expires_at > now:
        return (f"running: worker {run.lease_owner} holds step {run.step or '(start)'} until "
                f"{run.lease_expires_at:%H:%M:%S}")
    if run.status is RunStatus.RUNNING:
        return "queued: waiting for a worker to claim the next step (or a retry's delay)"
    return waiting or None


@router.get("/runs/{run}", response_class=HTMLResponse)
def run_page(request: Request, run: str, done: str = "") -> Response:
    """One run: why it waits, timeline, checkpoints and diffs, effects, model calls,
    approvals, lineage, audit, actions. Audited as an inspection."""
    ledger = None
    try:
        ledger = signed_in(request)
        ledger.require(AuditAction.INSPECT)
        run_id = ledger.resolve_run(run)
        ledger.inspected(run_id=run_id)
        return render(request, "run.html", ledger, done=done, **run_context(ledger, run_id))
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.get("/runs/{run}/timeline", response_class=HTMLResponse)
def timeline_fragment(request: Request, run: str, before: int) -> Response:
    ledger = None
    try:
        ledger = signed_in(request)
        page = ledger.timeline_page(ledger.resolve_run(run), before_epoch=before)
        return render(request, "_timeline.html", ledger, timeline=page, run_id=run)
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.get("/runs/{run}/summary", response_class=HTMLResponse)
def summary_fragment(request: Request, run: str) -> Response:
    """The live part of the run page (status, why, newest steps): what SSE refreshes."""
    ledger = None
    try:
        ledger = signed_in(request)
        context = run_context(ledger, ledger.resolve_run(run))
        return render(request, "_summary.html", ledger, **context)
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.get("/runs/{run}/events")
async def run_events(request: Request, run: str) -> Response:
    """Server-sent events: ``change`` whenever the run's status, seq or step changes."""
    try:
        ledger = await asyncio.to_thread(signed_in, request)
        run_id = await asyncio.to_thread(ledger.resolve_run, run)
    except OnwardError as exc:
        return failed(request, exc, None)

    async def stream() -> AsyncIterator[str]:
        seen = None
        for _ in range(3600):  # an hour at most; the browser reconnects
            if await request.is_disconnected():
                return
            found = await asyncio.to_thread(ledger.get_run, run_id)
            now = (found.status.value, found.seq, found.attempt, found.updated_at.isoformat()
                   ) if found else None
            if now != seen:
                if seen is not None:
                    yield f"event: change\ndata: {json.dumps(now)}\n\n"
                seen = now
            if found is None or found.status.terminal:
                yield "event: done\ndata: {}\n\n"
                return
            yield ": keep-alive\n\n"
            await asyncio.sleep(1)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


@router.get("/runs/{run}/diff", response_class=HTMLResponse)
def diff_fragment(request: Request, run: str, a: int, b: int) -> Response:
    ledger = None
    try:
        ledger = signed_in(request)
        changes = ledger.state_diff(ledger.resolve_run(run), a, b)
        return render(request, "_diff.html", ledger, changes=changes,
                      title=f"state from checkpoint {a} to {b}")
    except OnwardError as exc:
        return failed(request, exc, ledger)


def _patch(text: str) -> list[dict[str, Any]]:
    try:
        patch = read_json(text)
    except ValueError as exc:
        raise InvalidInput(f"the patch must be a JSON list of RFC 6902 operations: {exc}") \
            from None
    if not isinstance(patch, list) or not patch:
        raise InvalidInput("the patch must be a non-empty JSON list of operations")
    return patch


@router.post("/runs/{run}/branch/preview", response_class=HTMLResponse)
def branch_preview(request: Request, run: str, patch: Text, from_seq: Annotated[int, Form()],
                   csrf: Annotated[str | None, Form()] = None) -> Response:
    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        ledger.require(AuditAction.BRANCH)
        changes = ledger.preview_branch(ledger.resolve_run(run), from_seq, _patch(patch))
        return render(request, "_diff.html", ledger, changes=changes,
                      title=f"the branch starts from checkpoint {from_seq} with")
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.post("/runs/{run}/{command}", response_class=HTMLResponse)
def run_command(request: Request, run: str, command: str, reason: Text,
                csrf: Annotated[str | None, Form()] = None,
                confirm: Annotated[str | None, Form()] = None,
                mode: Annotated[str, Form()] = "evidence",
                from_seq: Annotated[int, Form()] = 0,
                patch: Annotated[str, Form()] = "",
                allow_irreversible: Annotated[str | None, Form()] = None,
                allow_unresolved: Annotated[str | None, Form()] = None) -> Response:
    """continue, cancel, replay, branch: a reason and a ticked confirmation are required;
    a live replay or a branch's boxes allow irreversible effects and start despite the
    parent's effects of unknown outcome (as ``--allow-unresolved``)."""
    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        action = {"continue": AuditAction.CONTINUE, "cancel": AuditAction.CANCEL,
                  "replay": AuditAction.REPLAY, "branch": AuditAction.BRANCH}.get(command)
        if action is None:
            raise InvalidInput(f"no command {command!r}")
        ledger.require(action)
        run_id = ledger.resolve_run(run)
        if confirm != "yes":
            raise ledger.refuse(action, InvalidInput("tick the confirmation box: nothing was "
                                                     "done"), run_id=run_id)
        target = _perform(ledger, command, run_id, reason, mode, from_seq, patch,
                          _Allowed(allow_irreversible == "yes", allow_unresolved == "yes"))
        return RedirectResponse(f"/runs/{target}?done={command}", status_code=303)
    except OnwardError as exc:
        return failed(request, exc, ledger)


@dataclass(frozen=True)
class _Allowed:
    """What a replay or branch form's boxes allow the new run."""

    irreversible: bool = False
    unresolved: bool = False


def _perform(ledger: Ledger, command: str, run_id: UUID, reason: str, mode: str,
             from_seq: int, patch: str, allowed: _Allowed) -> UUID:
    if command == "continue":
        return ledger.continue_run(run_id, reason).run_id
    if command == "cancel":
        return ledger.cancel(run_id, reason).run_id
    if command == "replay":
        if mode not in ("evidence", "simulation", "live"):
            raise ledger.refuse(AuditAction.REPLAY, InvalidInput(f"no replay mode {mode!r}"),
                                run_id=run_id)
        return ledger.replay(run_id, from_seq, mode, reason,
                             allow_irreversible=allowed.irreversible,
                             allow_unresolved=allowed.unresolved).run_id
    from tasks.operator import state_check

    try:
        operations = _patch(patch)
    except InvalidInput as exc:
        raise ledger.refuse(AuditAction.BRANCH, exc, run_id=run_id) from None
    return ledger.branch(run_id, from_seq, operations, reason,
                         allow_irreversible=allowed.irreversible,
                         check_state=state_check(ledger.settings.workflows),
                         allow_unresolved=allowed.unresolved).run_id


@router.post("/runs/{run}/verify", response_class=HTMLResponse, name="verify")
def verify_fragment(request: Request, run: str,
                    csrf: Annotated[str | None, Form()] = None) -> Response:
    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        ledger.require(AuditAction.VERIFY)
        run_id = ledger.resolve_run(run)
        problems = ledger.verify_run(run_id)
        ledger.verified(run_id, 1, len(problems), mode="run")
        return render(request, "_verify.html", ledger, problems=problems)
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.post("/effects/{effect_type}/{effect_id}/repeat", response_class=HTMLResponse)
def repeat_page(request: Request, effect_type: str, effect_id: str, reason: Text,
                csrf: Annotated[str | None, Form()] = None,
                confirm: Annotated[str | None, Form()] = None,
                attempts: Annotated[int | None, Form()] = None) -> Response:
    """PRIVILEGED (admin): a new call with a new recorded key."""
    from tasks.operator import plan_repeat, repeat_effect

    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        ledger.require(AuditAction.REPEAT_EFFECT)
        effect = ledger.find_effect(effect_id, effect_type)
        if confirm != "yes":
            raise ledger.refuse(AuditAction.REPEAT_EFFECT, InvalidInput(
                "tick the confirmation box: nothing was sent"), effect_id=effect_id)
        repeat_effect(ledger, plan_repeat(ledger, effect), reason, shown_attempts=attempts)
        return RedirectResponse(f"/runs/{effect.run_id}?done=repeat", status_code=303)
    except OnwardError as exc:
        return failed(request, exc, ledger)


@router.post("/effects/{effect_type}/{effect_id}/resolve", response_class=HTMLResponse)
def resolve_page(request: Request, effect_type: str, effect_id: str, reason: Text,
                 finding: Text, csrf: Annotated[str | None, Form()] = None,
                 confirm: Annotated[str | None, Form()] = None,
                 provider_ref: Annotated[str | None, Form()] = None,
                 result: Annotated[str | None, Form()] = None,
                 attempts: Annotated[int | None, Form()] = None,
                 allow_in_flight: Annotated[str | None, Form()] = None) -> Response:
    """PRIVILEGED (admin): record what a person found at the provider (nothing is sent)."""
    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        ledger.require(AuditAction.RESOLVE_EFFECT)
        effect = ledger.find_effect(effect_id, effect_type)
        found, answer = _resolution(ledger, effect, confirm, finding, result, reason)
        plan = {**resolve_plan(effect, found, provider_ref or None, answer),
                "attempts": attempts}
        ledger.resolve_effect(effect.effect_type, effect.effect_id, reason, plan,
                              finding=found, provider_ref=provider_ref or None, result=answer,
                              allow_in_flight=allow_in_flight == "yes")
        return RedirectResponse(f"/runs/{effect.run_id}?done=resolve", status_code=303)
    except OnwardError as exc:
        return failed(request, exc, ledger)


def _resolution(ledger: Ledger, effect: Effect, confirm: str | None, finding: str,
                result: str | None, reason: str) -> tuple[Finding, Any]:
    """The finding and result a resolve form names, or an audited refusal."""
    problem, answer = None, None
    if confirm != "yes":
        problem = "tick the confirmation box: nothing was recorded"
    elif finding not in {f.value for f in Finding}:
        problem = "say what you found: completed or not_sent"
    elif (result or "").strip():
        try:
            answer = read_json(result or "")
        except ValueError as exc:
            problem = f"the result is not JSON: {exc}"
    if problem is None and finding == Finding.NOT_SENT.value and answer is not None:
        problem = "a result goes with completed: a write that did not happen has none"
    if problem is not None:
        raise ledger.refuse(AuditAction.RESOLVE_EFFECT, InvalidInput(problem), reason=reason,
                            run_id=effect.run_id, effect_id=effect.effect_id)
    return Finding(finding), answer


# -- approvals ----------------------------------------------------------------------------
@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(request: Request, mine: str = "", status: str = "pending",
                   before: str = "", done: str = "") -> Response:
    """The inbox: each artifact exactly as hashed, who may decide, expiry, the decision."""
    ledger = None
    try:
        ledger = signed_in(request)
        cursor = None
        if before:
            at, _, ident = before.partition("|")
            cursor = (datetime.fromisoformat(at), UUID(ident))
        found = ledger.approvals(status=ApprovalStatus(status) if status else None,
                                 limit=50, before=cursor, approver=mine == "1")
        exact = {a.id: canonical_json(a.artifact).decode() for a in found}
        # the decision names the hash of what this page shows, never the stored hash: an
        # artifact edited in the database is shown as it is and its approval is refused
        shown = {a.id: sha256_hex(text.encode()) for a, text in
                 ((a, exact[a.id]) for a in found)}
        from ledger.waits import may_decide

        decidable = {a.id: ledger.actor.may(AuditAction.APPROVE) and may_decide(
            a, ledger.actor.name, ledger.actor.approver_roles) for a in found}
        return render(request, "approvals.html", ledger, approvals=found, exact=exact,
                      shown=shown, decidable=decidable, mine=mine == "1", status=status, done=done,
                      now=ledger.now())
    except (OnwardError, ValueError) as exc:
        return failed(request, exc if isinstance(exc, OnwardError) else InvalidInput(str(exc)),
                      ledger)


@router.post("/approvals/{approval}/{decision}", response_class=HTMLResponse)
def decide_page(request: Request, approval: str, decision: str, shown_hash: Text,
                comment: Text, csrf: Annotated[str | None, Form()] = None) -> Response:
    """Decide on the artifact the page showed (``shown_hash``, the sha256 of the canonical
    JSON it rendered); the ledger refuses unless it is the hash the run bound."""
    ledger = None
    try:
        check_csrf(request, csrf)
        ledger = signed_in(request)
        if decision not in ("approve", "reject"):
            raise InvalidInput(f"no decision {decision!r}")
        approve = decision == "approve"
        action = AuditAction.APPROVE if approve else AuditAction.REJECT
        approval_id = approval_of(ledger, approval, action)
        if not comment.strip():
            raise ledger.refuse(action, InvalidInput("say why (the reason is audited)"),
                                approval_id=approval_id)
        decide = ledger.approve if approve else ledger.reject
        decide(approval_id, artifact_hash=shown_hash, comment=comment.strip())
        return RedirectResponse(f"/approvals?done={decision}d", status_code=303)
    except OnwardError as exc:
        return failed(request, exc, ledger)


# -- audit --------------------------------------------------------------------------------
@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, run: str = "", actor: str = "", action: str = "",
               outcome: str = "", before: str = "") -> Response:
    ledger = None
    try:
        ledger = signed_in(request)
        rows = ledger.audit(run_id=ledger.resolve_run(run) if run else None,
                            actor=actor or None, action=action or None,
                            outcome=outcome or None, limit=100,
                            before=int(before) if before.isdigit() else None)
        return render(request, "audit.html", ledger, rows=rows,
                      filters={"run": run, "actor": actor, "action": action,
                               "outcome": outcome})
    except OnwardError as exc:
        return failed(request, exc, ledger)
