"""The workflow the model-based test drives, in two deployable versions.

A run's input is a plan: a short list of operations, one per step execution of ``act``
(model calls, effects through three kinds of tool, an approval, a signal, a timer, a
deliberate failure). Version 2 stores its state under schema 2 and migrates schema-1 runs
it picks up; both versions send the same payloads for the same intent, so a renumbered
step would show as a second object for one intent at the provider.

Each step body first reports itself to the test (``WORLD.on_body``), which checks that the
step it is about to run has not committed already. Steps that resume from a wait check
that the wait's meaning survived (the decision, the signal payload) and note a violation
when it did not.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ledger.vocabulary import ToolClass
from tasks import AsyncStepContext, Sensitive, StepContext, Workflow
from tasks.llm import LLMResponse
from tasks.tools import Tool
from tests.model.world import WORLD

APPROVAL_LIFETIME = timedelta(seconds=60)
SIGNAL_TIMEOUT = timedelta(seconds=120)
SLEEP = timedelta(seconds=30)
SLOW_CALL_TIMEOUT_S = 45.0  # longer than the lease TTL (30 s): the lease is extended over it

OPS = ("llm", "llm2", "crm", "crm_slow", "mail", "blind", "flaky", "talk_then_crm", "approve",
       "approve_strict", "signal", "sleep", "fail", "fickle", "fickle_blind", "pair")
"""One step each: model calls, an effect through each kind of tool (a slow one followed by
a model call), an effect then a raise (on the first attempt), three model calls then an
effect (a token budget of 100 runs out in between), waits, a deliberate failure, an effect
made by the first attempt only (``fickle``: a retry takes another path and never makes that
call, through a tool with a lookup or, ``fickle_blind``, without one), and an ``async def``
step making two effect calls at once (``pair``: ``asyncio.gather`` of a crm and a mail call,
carried out by the worker thread one at a time, in the order made: tasks/aio.py)."""

TAMPERED = "TAMPERED"
"""What the tamper rule writes into a signed value in the database (a state's tag, a
recorded answer's text, an effect's result): no step body may ever be handed it."""


def _crm_call(payload: dict[str, Any], key: str, *, timeout: float) -> dict[str, Any]:
    return WORLD.provider.create("crm", payload, key,  # type: ignore[no-any-return]
                                 dedupes=False, timeout=timeout)


def _crm_lookup(key: str) -> dict[str, Any] | None:
    return WORLD.provider.lookup("crm", key)  # type: ignore[no-any-return]


def _crm_simulate(payload: dict[str, Any], key: str) -> dict[str, Any]:
    return WORLD.provider.simulate("crm", payload, key)  # type: ignore[no-any-return]


def _crm_slow_call(payload: dict[str, Any], key: str, *, timeout: float) -> dict[str, Any]:
    return WORLD.provider.create("crm_slow", payload, key,  # type: ignore[no-any-return]
                                 dedupes=False, slow=True, timeout=timeout)


def _crm_slow_lookup(key: str) -> dict[str, Any] | None:
    return WORLD.provider.lookup("crm_slow", key)  # type: ignore[no-any-return]


def _mail_call(payload: dict[str, Any], key: str, *, timeout: float) -> dict[str, Any]:
    return WORLD.provider.create("mail", payload, key,  # type: ignore[no-any-return]
                                 dedupes=True, timeout=timeout)


def _mail_simulate(payload: dict[str, Any], key: str) -> dict[str, Any]:
    return WORLD.provider.simulate("mail", payload, key)  # type: ignore[no-any-return]


def _blind_call(payload: dict[str, Any], key: str, *, timeout: float) -> dict[str, Any]:
    return WORLD.provider.create("blind", payload, key,  # type: ignore[no-any-return]
                                 dedupes=False, timeout=timeout)


# irreversible, no provider-side dedupe, but a lookup by key: reconcile before resending
crm = Tool("model.crm", ToolClass.IRREVERSIBLE, call=_crm_call, lookup=_crm_lookup,
           simulate=_crm_simulate)
# the same, slower than the lease: every call hangs until the test ends it
crm_slow = Tool("model.crm_slow", ToolClass.IRREVERSIBLE, call=_crm_slow_call,
                lookup=_crm_slow_lookup, simulate=_crm_simulate, timeout_s=SLOW_CALL_TIMEOUT_S)
# the provider dedupes by Idempotency-Key: resending with the same key is safe
mail = Tool("model.mail", ToolClass.IDEMPOTENT_WRITE, call=_mail_call, simulate=_mail_simulate)
# neither a lookup nor dedupe: an unknown outcome must park the run for a person
blind = Tool("model.blind", ToolClass.IRREVERSIBLE, call=_blind_call)

TOOLS = {"crm": crm, "crm_slow": crm_slow, "mail": mail, "blind": blind}


class _Model:
    """The workflows' model client: the current example's counting model."""

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        return WORLD.model.complete(model=model, messages=messages,  # type: ignore[no-any-return]
                                    **params)


class Plan(BaseModel):
    ref: str
    ops: list[str]
    pc: int = 0
    tag: str = ""
    # a value the ledger must never hold in plain text once encryption keys are configured
    # (tests/model/invariants.py ``no_plaintext_at_rest``): in every state, the finish result,
    # the effects' payloads, the step error of ``flaky`` (and the test's signal payloads)
    note: Annotated[str, Sensitive] = ""


class PlanV2(Plan):
    schema_note: str = Field(min_length=1)


flow_v1 = Workflow("model_flow", version=1, state=Plan, llm=_Model(), max_attempts=3)
flow_v2 = Workflow("model_flow", version=2, state=PlanV2, llm=_Model(), max_attempts=3,
                   state_schema_version=2)


@flow_v2.migration(from_schema=1)
def _add_schema_note(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "schema_note": "migrated from schema 1"}


def _define(workflow: Workflow[Any]) -> None:
    @workflow.step(start=True)
    def act(ctx: StepContext, state: Plan) -> Any:
        WORLD.on_body(ctx)
        _seen(ctx, "state", state.tag)
        if state.pc >= len(state.ops):
            return ctx.finish(ref=state.ref, pc=state.pc, version=workflow.version,
                              note=state.note)
        op, nxt = state.ops[state.pc], state.pc + 1
        wait = _wait(ctx, state, op, nxt)
        if wait is not None:
            return wait
        if op == "pair":
            return ctx.goto(pair)
        _work(ctx, state, op)
        return ctx.goto(act, pc=nxt)

    def _wait(ctx: StepContext, state: Plan, op: str, nxt: int) -> Any:
        artifact = {"ref": state.ref, "pc": state.pc}
        if op == "approve":
            return ctx.ask_approval("ship", artifact=artifact, then=approved, on_reject=act,
                                    on_expire=act, expires_in=APPROVAL_LIFETIME, pc=nxt)
        if op == "approve_strict":
            return ctx.ask_approval("ship", artifact=artifact, then=approved,
                                    expires_in=APPROVAL_LIFETIME, pc=nxt)
        if op == "signal":
            return ctx.wait_for_signal("go", then=signalled, timeout=SIGNAL_TIMEOUT,
                                       on_timeout=act, pc=nxt)
        if op == "sleep":
            return ctx.sleep(SLEEP, then=act, pc=nxt)
        if op == "fail":
            return ctx.fail("planned failure", pc=state.pc)
        return None

    def _work(ctx: StepContext, state: Plan, op: str) -> None:
        if op in ("llm", "llm2", "talk_then_crm"):
            for call in range({"llm": 1, "llm2": 2}.get(op, 3)):
                _seen(ctx, "model answer", ctx.llm(model="counting", messages=[
                    {"role": "user", "content": f"{state.ref} op {state.pc} call {call}"}]).text)
        if op == "talk_then_crm":
            ctx.effect(crm, ref=state.ref, intent=state.pc, note=state.note)
        elif op == "crm_slow":  # then a model call: a cancelled step must not make it
            ctx.effect(crm_slow, ref=state.ref, intent=state.pc, note=state.note)
            ctx.llm(model="counting", messages=[
                {"role": "user", "content": f"{state.ref} op {state.pc} after the call"}])
        elif op in TOOLS:
            _seen(ctx, "effect result", ctx.effect(TOOLS[op], ref=state.ref, intent=state.pc,
                                                   note=state.note))
        elif op in ("fickle", "fickle_blind") and ctx.attempt == 1:  # a retry does not call
            ctx.effect(crm if op == "fickle" else blind, ref=state.ref, intent=state.pc,
                       note=state.note)
        elif op == "flaky":
            ctx.effect(crm, ref=state.ref, intent=state.pc, note=state.note)
            if ctx.attempt == 1:  # quoting a sensitive value, as a step's error may
                raise RuntimeError(f"flaky: the step raises after its effect, on attempt 1 "
                                   f"(note {state.note})")

    @workflow.step
    async def pair(ctx: AsyncStepContext, state: Plan) -> Any:
        WORLD.on_body(ctx)
        _seen(ctx, "state", state.tag)
        # both calls are over before the body goes on (return_exceptions): with a plain
        # gather, the first call's error ends the body while the second may or may not be
        # carried out yet, as the threads' timing falls, and hypothesis cannot replay that
        results = await asyncio.gather(
            ctx.effect(crm, ref=state.ref, intent=state.pc, note=state.note),
            ctx.effect(mail, ref=state.ref, intent=state.pc, note=state.note),
            return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
            _seen(ctx, "effect result", result)
        return ctx.goto(act, pc=state.pc + 1)

    @workflow.step
    def approved(ctx: StepContext, state: Plan) -> Any:
        WORLD.on_body(ctx)
        _seen(ctx, "state", state.tag)
        decision = ctx.decision
        if decision is None or decision.get("status") != "approved":
            WORLD.note("wait_meaning", f"run {ctx.run_id} seq {ctx.seq}: step 'approved' "
                       f"ran with decision {decision!r} (v{workflow.version})")
        return ctx.goto(act)

    @workflow.step
    def signalled(ctx: StepContext, state: Plan) -> Any:
        WORLD.on_body(ctx)
        _seen(ctx, "state", state.tag)
        payload = ctx.signal("go")
        if payload is None:
            WORLD.note("wait_meaning", f"run {ctx.run_id} seq {ctx.seq}: step 'signalled' "
                       f"ran without the payload of signal 'go' (v{workflow.version})")
        return ctx.goto(act)


def _seen(ctx: StepContext, what: str, value: Any) -> None:
    """A step body was handed ``value``: it must not be one the tamper rule wrote."""
    if TAMPERED in str(value):
        WORLD.note("tampered_read", f"run {ctx.run_id} seq {ctx.seq} step {ctx.step} "
                   f"(attempt {ctx.attempt}) was handed a {what} edited in the database: "
                   f"{str(value)[:80]!r}")


_define(flow_v1)
_define(flow_v2)
