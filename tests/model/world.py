"""The outside world of the model-based test, in process: a provider and a model client.

Fakes are allowed for the outside world only. Both count what they saw, so the invariants
can be checked against what really happened out there, not against what the ledger says:

* ``FakeProvider`` keeps every object it created, with the idempotency key it was sent and
  the run whose step sent it (the run the calling worker was executing). It dedupes by key
  when the collection says it does, answers lookups by key, and follows a script for its
  next answers: answer, act but lose the response, refuse, be unavailable, or hang (the
  calling worker stops there until the test resumes it: a call slower than the lease).
* ``CountingModel`` bills every call (tokens and cost) to the run that made it, and can be
  told to lose its next response after billing it.

``Crash`` is what a SIGKILL leaves in process: a ``BaseException`` that nothing in onward
catches, so the lease stays held and whatever was committed stays committed.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from tasks.exceptions import ToolError
from tasks.llm import LLMResponse


class Crash(BaseException):
    """The worker process died here (in process: nothing in onward catches it)."""


# -- which worker (and run) is executing: set by the worker thread ---------------------------
_local = threading.local()


def current_runner() -> Any:
    """The worker thread executing now (``None`` on the test's own thread)."""
    return getattr(_local, "runner", None)


def set_current_runner(runner: Any) -> None:
    _local.runner = runner


def crash(where: str) -> Crash:
    """The crash of the worker thread calling: from now on it makes no further call or
    statement (``still_alive``). A SIGKILL ends the whole process; in process, an async
    step's body gathered two calls, and the second is still queued for the step's thread
    when the first one's crash reaches the body (tasks/aio.py)."""
    runner = current_runner()
    if runner is not None:
        runner.killed = True
    return Crash(where)


def still_alive() -> None:
    """Raise ``Crash`` in a worker thread that crashed already (``crash``)."""
    runner = current_runner()
    if runner is not None and runner.killed:
        raise Crash("the worker was killed already")


def current_run() -> UUID | None:
    runner = current_runner()
    return runner.run_id if runner is not None else None


# -- the provider ----------------------------------------------------------------------------
PROVIDER_MODES = ("answer", "lose", "refuse", "unavailable", "hang")
"""What the provider does with its next create call (``answer`` when nothing is scripted)."""

RESUME_ACTIONS = ("act_answer", "act_lose", "no_act_lose", "act_crash", "no_act_crash")
"""How a hung call ends: whether the provider acted, and whether the caller heard (or died)."""


@dataclass(frozen=True)
class ProviderObject:
    id: str
    collection: str
    key: str
    body: dict[str, Any]
    run_id: UUID | None  # the run whose step sent it (None: an operator's repeat)
    by_person: bool


@dataclass
class HungCall:
    collection: str
    payload: dict[str, Any]
    key: str
    dedupes: bool
    run_id: UUID | None
    deadline: float | None  # the caller's time limit, on the database clock (offset seconds)
    timed_out: bool = False
    obj: ProviderObject | None = None


@dataclass
class FakeProvider:
    objects: list[ProviderObject] = field(default_factory=list)
    script: deque[str] = field(default_factory=deque)
    hung: dict[int, HungCall] = field(default_factory=dict)  # by calling worker
    sandbox_calls: int = 0
    calls: int = 0
    lookups: int = 0
    person: bool = False
    # as each call starts (collection, key, time limit)
    on_call: Callable[[str, str, float | None], None] = lambda collection, key, timeout: None
    clock_s: Callable[[], float] = lambda: 0.0  # the database clock's offset, in seconds
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def create(self, collection: str, payload: dict[str, Any], key: str, *,
               dedupes: bool, slow: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """A create call, given up by its caller after ``timeout`` seconds (of the database's
        clock); ``slow``: the endpoint hangs unless the script says otherwise."""
        still_alive()
        self.calls += 1
        self.on_call(collection, key, timeout)
        mode = self.script.popleft() if self.script else ("hang" if slow else "answer")
        existing = self._existing(collection, key) if dedupes else None
        if mode == "refuse" and existing is None:
            raise ToolError(f"{collection}: refused (422), nothing created", retryable=False,
                            status_code=422)
        if mode == "unavailable":
            raise ToolError(f"{collection}: unavailable (503), nothing created", retryable=True,
                            status_code=503)
        run_id = current_run()
        if mode == "hang":
            return self._hang(collection, payload, key, dedupes, run_id, timeout)
        obj = self._act(collection, payload, key, dedupes, run_id)
        if mode == "lose":
            raise ConnectionError(f"{collection}: connection reset after the request was sent")
        return self._answer(obj)

    def _hang(self, collection: str, payload: dict[str, Any], key: str, dedupes: bool,
              run_id: UUID | None, timeout: float | None) -> dict[str, Any]:
        """Stop the calling worker until the test ends the call. The provider keeps to the
        caller's time limit (docs/effects.md: one that acts after its client gave up must
        dedupe by key): if time passes the limit first, it acts then (``expire``) and the
        caller hears a timeout whenever it is resumed."""
        runner = current_runner()
        if runner is None:
            return self._answer(self._act(collection, payload, key, dedupes, run_id))
        deadline = self.clock_s() + timeout if timeout is not None else None
        call = HungCall(collection, payload, key, dedupes, run_id, deadline)
        self.hung[id(runner)] = call
        try:
            action = runner.suspend(f"provider call {collection} key {key[:12]}")
        finally:
            del self.hung[id(runner)]
        if not call.timed_out and action.startswith("act"):
            call.obj = self._act(collection, payload, key, dedupes, run_id)
        if action.endswith("crash"):
            raise crash(f"worker killed during the {collection} call")
        if call.timed_out:
            raise TimeoutError(f"{collection}: no answer within {timeout}s")
        if call.obj is None or action.endswith("lose"):
            raise ConnectionError(f"{collection}: no response (connection lost)")
        return self._answer(call.obj)

    def expire(self, now_s: float) -> None:
        """Time moved: a hung call past its caller's time limit ends there, the provider
        having acted (the worst case: an object the caller never heard of)."""
        for call in self.hung.values():
            if not call.timed_out and call.deadline is not None and now_s > call.deadline:
                call.timed_out = True
                call.obj = self._act(call.collection, call.payload, call.key, call.dedupes,
                                     call.run_id)

    def _existing(self, collection: str, key: str) -> ProviderObject | None:
        return next((o for o in self.objects if o.collection == collection and o.key == key),
                    None)

    def _act(self, collection: str, payload: dict[str, Any], key: str, dedupes: bool,
             run_id: UUID | None) -> ProviderObject:
        if dedupes:
            for obj in self.objects:
                if obj.collection == collection and obj.key == key:
                    if obj.body != payload:
                        raise ToolError(f"{collection}: key reused with another body (409)",
                                        retryable=False, status_code=409)
                    return obj
        obj = ProviderObject(f"{collection[:3]}_{next(self._ids)}", collection, key,
                             dict(payload), run_id, self.person)
        self.objects.append(obj)
        return obj

    @staticmethod
    def _answer(obj: ProviderObject) -> dict[str, Any]:
        return {"id": obj.id, "intent": obj.body.get("intent")}

    def lookup(self, collection: str, key: str) -> dict[str, Any] | None:
        still_alive()
        self.lookups += 1
        for obj in self.objects:
            if obj.collection == collection and obj.key == key:
                return self._answer(obj)
        return None

    def simulate(self, collection: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        self.sandbox_calls += 1
        return {"id": f"sim_{collection[:3]}_{self.sandbox_calls}", "intent": payload.get("intent")}

    def objects_for_key(self, key: str) -> list[ProviderObject]:
        return [o for o in self.objects if o.key == key]

    def duplicate_intents(self) -> list[tuple[Any, ...]]:
        """(collection, run, intent, count) sent more than once by the same run's steps,
        objects an operator's repeat created excepted."""
        counts = Counter((o.collection, o.run_id, o.body.get("ref"), o.body.get("intent"))
                         for o in self.objects if not o.by_person)
        return [(*k, n) for k, n in counts.items() if n > 1]

    @contextmanager
    def as_person(self) -> Iterator[None]:
        self.person = True
        try:
            yield
        finally:
            self.person = False


# -- the model ---------------------------------------------------------------------------------
CALL_INPUT_TOKENS = 30
CALL_OUTPUT_TOKENS = 10
CALL_TOKENS = CALL_INPUT_TOKENS + CALL_OUTPUT_TOKENS
USD_PER_TOKEN = 0.0001
CALL_COST_USD = CALL_TOKENS * USD_PER_TOKEN


MODEL_MODES = ("answer", "lose", "nul")
"""What the model does with its next call: answer; bill and lose the answer; answer with a
NUL character in the text (bad input the ledger must refuse without paying again)."""


@dataclass
class CountingModel:
    """A model client that bills each call to the run its worker executes."""

    script: deque[str] = field(default_factory=deque)
    calls: Counter[UUID | None] = field(default_factory=Counter)
    tokens: Counter[UUID | None] = field(default_factory=Counter)  # billed
    heard_tokens: Counter[UUID | None] = field(default_factory=Counter)  # answers returned
    answered: Counter[tuple[UUID | None, str]] = field(default_factory=Counter)
    # a person continued the run after an answer it could not use (invalid_answer): asking
    # again is then that person's decision, once per continue
    reasked: Counter[UUID | None] = field(default_factory=Counter)
    on_call: Callable[[str], None] = lambda prompt: None  # as each call starts

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        still_alive()
        run_id = current_run()
        prompt = " ".join(str(m.get("content", "")) for m in messages)
        self.on_call(prompt)
        self.calls[run_id] += 1
        self.tokens[run_id] += CALL_TOKENS
        mode = self.script.popleft() if self.script else "answer"
        if mode == "lose":
            raise ConnectionError("model: billed, but the response was lost")
        self.answered[(run_id, prompt)] += 1
        self.heard_tokens[run_id] += CALL_TOKENS
        text = f"answer to {prompt[:40]}" + ("\u0000" if mode == "nul" else "")
        return LLMResponse(text=text, model=f"{model}-counting",
                           input_tokens=CALL_INPUT_TOKENS, output_tokens=CALL_OUTPUT_TOKENS,
                           cost_usd=CALL_COST_USD)

    def paid_twice(self) -> list[tuple[UUID | None, str, int]]:
        """Requests a run was answered (and billed) for more than once: a re-executed step
        gets its recorded answer, so only a lost answer is ever paid for again, or one a
        person asked for again by continuing a run failed ``invalid_answer``."""
        return [(run, prompt, n) for (run, prompt), n in self.answered.items()
                if n > 1 + self.reasked[run]]


@dataclass
class World:
    provider: FakeProvider = field(default_factory=FakeProvider)
    model: CountingModel = field(default_factory=CountingModel)
    # seen from inside step bodies, by kind ("reran", "wait_meaning")
    violations: dict[str, list[str]] = field(default_factory=dict)
    on_body: Callable[[Any], None] = lambda ctx: None  # called as each step body starts

    def note(self, kind: str, violation: str) -> None:
        self.violations.setdefault(kind, []).append(violation)


class _WorldProxy:
    """The world of the current example (the workflows' tools and model reach it here)."""

    current: World = World()

    def __getattr__(self, name: str) -> Any:
        return getattr(type(self).current, name)


WORLD: Any = _WorldProxy()


def install(world: World) -> None:
    _WorldProxy.current = world
