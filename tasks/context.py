"""``ctx``: what a step sees of the engine. Outcomes are built here, committed by the executor."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from tasks import aio, deadline, observe
from tasks.exceptions import LeaseLost
from tasks.llm import LLMResponse
from tasks.outcomes import AskApproval, Fail, Finish, Goto, Sleep, WaitSignal
from tasks.services import StepServices
from tasks.tools import Tool
from tasks.waiting import aware
from tasks.workflow import Step, Workflow

__all__ = ["AsyncStepContext", "BaseContext", "StepContext"]


@dataclass
class BaseContext:
    """Identity of the running step and the outcome builders, shared by ``StepContext`` (a
    plain step) and ``AsyncStepContext`` (an ``async def`` step).

    A step body may run more than once (at-least-once); only its commit happens once.
    """

    run_id: UUID
    seq: int
    attempt: int
    step: str
    workflow: Workflow[Any]
    worker: str
    tenant_id: str
    services: StepServices = field(repr=False)
    _heartbeat: Callable[[], bool] = field(repr=False, default=lambda: True)

    def goto(self, step: Step | str, /, **update: Any) -> Goto:
        """Continue with ``step`` after merging ``update`` into the state."""
        name = step.name if isinstance(step, Step) else step
        return Goto(name, update)

    def finish(self, **result: Any) -> Finish:
        """Complete the run with ``result``."""
        return Finish(result)

    def fail(self, reason: str, **details: Any) -> Fail:
        """Fail the run on purpose (not retried)."""
        return Fail(reason, details)

    def ask_approval(
        self,
        action: str,
        /,
        *,
        artifact: Any,
        then: Step | str,
        approvers: Sequence[str] = (),
        expires_in: timedelta = timedelta(hours=24),
        on_reject: Step | str | None = None,
        on_expire: Step | str | None = None,
        **update: Any,
    ) -> AskApproval:
        """Wait for a person to approve ``artifact`` (bound by its sha256). ``approvers`` are
        names or ``role:<name>``; empty means any operator. Then run ``then``; on rejection
        ``on_reject`` (or fail), on expiry ``on_expire`` (or fail with approval_expired)."""
        return AskApproval(action, artifact, _required(then), tuple(approvers), expires_in,
                           _name(on_reject), _name(on_expire), update)

    def wait_for_signal(self, name: str, /, *, then: Step | str,
                        timeout: timedelta | None = None,
                        on_timeout: Step | str | None = None, **update: Any) -> WaitSignal:
        """Wait for ``Ledger.signal(run_id, name, payload)``; a signal sent earlier counts."""
        return WaitSignal(name, _required(then), timeout, _name(on_timeout), update)

    def sleep(self, delay: timedelta, /, *, then: Step | str, **update: Any) -> Sleep:
        """Continue with ``then`` after ``delay`` (by the database's clock), holding no
        worker."""
        return Sleep(self.now() + delay, _required(then), update)

    def sleep_until(self, when: datetime, /, *, then: Step | str, **update: Any) -> Sleep:
        """Continue with ``then`` at ``when``, an aware datetime (a naive one names no
        instant and is refused with OutcomeError), compared with the database's clock."""
        return Sleep(aware(when, "ctx.sleep_until"), _required(then), update)

    def now(self) -> datetime:
        """The database's time (the claim's, advanced by this host's monotonic clock): the
        clock every wait, expiry and deadline is compared with, whatever this host's wall
        clock says."""
        return self.services.clock.now()

    @property
    def decision(self) -> Any:
        """The approval decision this step resumes after (None if it did not wait for one)."""
        with deadline.shielded():
            return self.services.decision()

    def signal(self, name: str) -> Any:
        """The payload of the signal that ended this step's wait."""
        with deadline.shielded():
            return self.services.signal_payload(name)

    def time_left(self) -> float | None:
        """Seconds left before the step's ``timeout`` (None: the step has none)."""
        running = deadline.current()
        return running.remaining() if running is not None else None

    def _beat(self) -> None:
        deadline.check()
        if not self._heartbeat():
            raise LeaseLost(f"run {self.run_id} seq {self.seq}: the lease was taken over")


class StepContext(BaseContext):
    """What a plain (``def``) step is given: the calls below block until answered."""

    def effect(self, tool: Tool, /, key: str | None = None, **payload: Any) -> dict[str, Any]:
        """Change the outside world once: intent recorded before the call, keyed for the
        action (not the attempt), reconciled when an earlier outcome is unknown.

        ``key`` names the call's intent explicitly; by default it is the call's ordinal
        within the step.
        """
        return _effect(self.services, tool, key, payload)

    def llm(self, *, model: str, messages: list[dict[str, Any]], key: str | None = None,
            **params: Any) -> LLMResponse:
        """Call the workflow's model client; a re-executed step gets the recorded answer."""
        return _llm(self.services, model, messages, key, params)

    def read(self, tool: Tool, /, key: str | None = None, **params: Any) -> dict[str, Any]:
        """Read from a ``read`` tool; recorded with its source version and time."""
        return _read(self.services, tool, key, params)

    def heartbeat(self) -> None:
        """Extend the lease during a long step; raises LeaseLost if another worker took over.
        (A step with a ``timeout`` is leased for it already.)"""
        with deadline.shielded():
            self._beat()


class AsyncStepContext(BaseContext):
    """What an ``async def`` step is given: the same calls, awaited (tasks/aio.py). They run
    one at a time in the order they are made. A call without ``key`` is named by that order,
    so it may be made only where the order is fixed by the body's code: awaited by the body
    itself, or handed straight to ``asyncio.gather``/``create_task`` by the body; in a task
    the body started around a helper coroutine it is refused (``OutcomeError``): pass a key.

    ``effect``, ``llm`` and ``read`` are plain methods returning the awaitable, so that
    where the call is written is known, and a call without a key takes its number there,
    when the body makes it, whether or not it is carried out (``aio.ordered``)."""

    def effect(self, tool: Tool, /, key: str | None = None,
               **payload: Any) -> Coroutine[Any, Any, dict[str, Any]]:
        """``StepContext.effect``, awaited."""
        def call(position: int | None = None) -> dict[str, Any]:
            return _effect(self.services, tool, key, payload, position)
        return aio.offload(call) if key is not None else aio.ordered(call, "ctx.effect")

    def llm(self, *, model: str, messages: list[dict[str, Any]], key: str | None = None,
            **params: Any) -> Coroutine[Any, Any, LLMResponse]:
        """``StepContext.llm``, awaited (the model client may be sync or async)."""
        def call(position: int | None = None) -> LLMResponse:
            return _llm(self.services, model, messages, key, params, position)
        return aio.offload(call) if key is not None else aio.ordered(call, "ctx.llm")

    def read(self, tool: Tool, /, key: str | None = None,
             **params: Any) -> Coroutine[Any, Any, dict[str, Any]]:
        """``StepContext.read``, awaited."""
        def call(position: int | None = None) -> dict[str, Any]:
            return _read(self.services, tool, key, params, position)
        return aio.offload(call) if key is not None else aio.ordered(call, "ctx.read")

    async def heartbeat(self) -> None:
        """``StepContext.heartbeat``, awaited."""
        await aio.offload(self._beat)

    @classmethod
    def of(cls, ctx: BaseContext) -> AsyncStepContext:
        """The async context of the same step."""
        return cls(**{f.name: getattr(ctx, f.name) for f in fields(ctx)})


# Each call is refused past the step's deadline, and its bookkeeping is shielded from the
# deadline's interruption (only the provider or model call itself may be interrupted).

def _effect(services: StepServices, tool: Tool, key: str | None,
            payload: dict[str, Any], position: int | None = None) -> dict[str, Any]:
    deadline.check()
    with deadline.shielded(), observe.effect(services, tool):
        return services.effect(tool, key, payload, position)


def _llm(services: StepServices, model: str, messages: list[dict[str, Any]], key: str | None,
         params: dict[str, Any], position: int | None = None) -> LLMResponse:
    deadline.check()
    with deadline.shielded(), observe.model_call(model):
        return services.llm(model=model, messages=messages, key=key, params=params,
                            position=position)


def _read(services: StepServices, tool: Tool, key: str | None,
          params: dict[str, Any], position: int | None = None) -> dict[str, Any]:
    deadline.check()
    with deadline.shielded(), observe.read(tool):
        return services.read(tool, key, params, position)


def _name(step: Step | str | None) -> str | None:
    if step is None or isinstance(step, str):
        return step
    return step.name


def _required(step: Step | str) -> str:
    return step if isinstance(step, str) else step.name
