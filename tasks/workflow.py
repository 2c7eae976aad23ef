"""The authoring API: a workflow is an explicit state machine of named steps.

    research = Workflow("research_agent", version=1, state=ResearchState)

    @research.step(start=True)
    def collect(ctx, state):
        return ctx.goto(extract, sources=find_sources(state.topic))

Each step receives ``(ctx, state)`` and returns ``ctx.goto(...)``, ``ctx.finish(...)`` or
``ctx.fail(...)``; an ``async def`` step awaits ``ctx.llm``, ``ctx.read`` and ``ctx.effect``
(docs/steps.md). ``@wf.step(timeout=...)`` bounds a step's run time, and its lease covers it.
Definition mistakes raise ``WorkflowDefinitionError`` at import time.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import BaseModel

from tasks.exceptions import WorkflowDefinitionError

if TYPE_CHECKING:
    from ledger.runs import Budgets
    from tasks.context import AsyncStepContext, StepContext
    from tasks.llm import LLMClient
    from tasks.outcomes import Outcome
    from tasks.tools import Tool

__all__ = ["MigrationFn", "Registry", "Step", "StepFn", "Workflow"]


S = TypeVar("S", bound=BaseModel)
StepFn = (Callable[["StepContext", Any], "Outcome"]
          | Callable[["AsyncStepContext", Any], Awaitable["Outcome"]])
MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")


@dataclass(frozen=True)
class Step:
    """One named step of a workflow; calling it calls the function."""

    name: str
    fn: StepFn
    workflow: str
    max_attempts: int | None
    timeout_s: float | None = None  # the body's time limit; the lease covers it

    def __call__(self, ctx: Any, state: Any) -> Any:
        """The body: an outcome, or (``async def``) a coroutine that returns one."""
        return self.fn(ctx, state)

    @property
    def is_async(self) -> bool:
        """An ``async def`` step: it runs on the worker's event loop (tasks/aio.py)."""
        return inspect.iscoroutinefunction(self.fn)

    def lease_s(self, margin_s: float) -> float | None:
        """The lease a claim of this step takes at least: its timeout and ``margin_s``."""
        return None if self.timeout_s is None else self.timeout_s + margin_s


class Workflow(Generic[S]):
    """A named, versioned state machine over a pydantic state model."""

    def __init__(
        self,
        name: str,
        *,
        version: int = 1,
        state: type[S],
        max_attempts: int = 3,
        description: str = "",
        llm: LLMClient | None = None,
        budgets: Budgets | None = None,
        state_schema_version: int = 1,
        compatible_with: Iterable[int] = (),
    ) -> None:
        if not _NAME.match(name):
            raise WorkflowDefinitionError(
                f"workflow name {name!r} must be 1-128 letters, digits, '_', '.', ':' or '-'"
            )
        if not isinstance(version, int) or version < 1:
            raise WorkflowDefinitionError(f"workflow {name}: version must be an int >= 1")
        if not (isinstance(state, type) and issubclass(state, BaseModel)):
            raise WorkflowDefinitionError(f"workflow {name}: state must be a pydantic model class")
        if max_attempts < 1:
            raise WorkflowDefinitionError(f"workflow {name}: max_attempts must be >= 1")
        self.name = name
        self.version = version
        self.state = state
        self.max_attempts = max_attempts
        self.description = description
        self.llm = llm
        self.budgets = budgets
        if state_schema_version < 1:
            raise WorkflowDefinitionError(f"workflow {name}: state_schema_version must be >= 1")
        self.state_schema_version = state_schema_version
        self.compatible_with = frozenset(compatible_with)
        if version in self.compatible_with:
            raise WorkflowDefinitionError(f"workflow {name}: compatible_with lists its own version")
        self.migrations: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        self.steps: dict[str, Step] = {}
        self.start: Step | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version}, steps={list(self.steps)})"

    @overload
    def step(self, fn: StepFn, /) -> Step: ...

    @overload
    def step(
        self, *, start: bool = False, name: str | None = None, max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> Callable[[StepFn], Step]: ...

    def step(  # type: ignore[misc]  # one decorator, used bare or with options
        self,
        fn: StepFn | None = None,
        /,
        *,
        start: bool = False,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> Step | Callable[[StepFn], Step]:
        """Register a step; ``start=True`` marks the one a new run begins with.

        ``timeout`` (seconds or a timedelta) bounds one attempt of the step: the claim's lease
        covers it (no heartbeat needed inside it), the body is interrupted or refused past
        it, and the attempt is retried within ``max_attempts`` (docs/steps.md, "Timeouts").
        The step may be ``async def`` (docs/steps.md, "Async steps")."""

        def register(func: StepFn) -> Step:
            step_name = name or func.__name__
            where = f"{self.name}.{step_name}"
            if not _NAME.match(step_name):
                raise WorkflowDefinitionError(f"{self.name}: invalid step name {step_name!r}")
            if step_name in self.steps:
                raise WorkflowDefinitionError(f"{self.name}: step {step_name!r} defined twice")
            if max_attempts is not None and max_attempts < 1:
                raise WorkflowDefinitionError(f"{where}: max_attempts must be >= 1")
            _check_body(where, func)
            step = Step(step_name, func, self.name, max_attempts, _seconds(where, timeout))
            if start:
                if self.start is not None:
                    raise WorkflowDefinitionError(
                        f"{self.name}: both {self.start.name!r} and {step_name!r} say start=True"
                    )
                self.start = step
            self.steps[step_name] = step
            return step

        return register(fn) if fn is not None else register

    def migration(self, *, from_schema: int) -> Callable[[MigrationFn], MigrationFn]:
        """Register a state migration from schema ``from_schema`` to ``from_schema + 1``.

        It takes the stored state as plain JSON and returns the new state as plain JSON; the
        executor validates the result against the current state model before using it.
        """

        def register(fn: MigrationFn) -> MigrationFn:
            if from_schema >= self.state_schema_version or from_schema < 1:
                raise WorkflowDefinitionError(
                    f"{self.name}: migration from schema {from_schema} must lead towards "
                    f"{self.state_schema_version}")
            if from_schema in self.migrations:
                raise WorkflowDefinitionError(
                    f"{self.name}: two migrations from schema {from_schema}")
            self.migrations[from_schema] = fn
            return fn

        return register

    def migration_path(self, from_schema: int) -> list[MigrationFn] | None:
        """The chain of migrations from ``from_schema`` to this code's schema, if complete."""
        path = []
        for schema in range(from_schema, self.state_schema_version):
            step = self.migrations.get(schema)
            if step is None:
                return None
            path.append(step)
        return path

    def resolve(self, name: str | None) -> Step | None:
        """The step a checkpoint names (None = the start step), or None if unknown."""
        if name is None:
            return self.start
        return self.steps.get(name)

    def attempts_for(self, step: Step | None) -> int:
        if step is not None and step.max_attempts is not None:
            return step.max_attempts
        return self.max_attempts

    @property
    def async_steps(self) -> list[str]:
        """The names of its ``async def`` steps."""
        return [name for name, step in self.steps.items() if step.is_async]

    def check(self) -> None:
        """Validate the whole definition; the registry calls this on registration."""
        if self.start is None:
            raise WorkflowDefinitionError(
                f"workflow {self.name} has no start step: mark one with @workflow.step(start=True)"
            )


def _check_body(where: str, func: StepFn) -> None:
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        raise WorkflowDefinitionError(
            f"{where} is a generator: a step returns one outcome (ctx.goto, ctx.finish, "
            "ctx.fail, a wait); write it as def or async def that returns it")
    if not callable(func):
        raise WorkflowDefinitionError(f"{where}: a step must be a function, not "
                                      f"{type(func).__name__}")


def _seconds(where: str, timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise WorkflowDefinitionError(
            f"{where}: timeout must be a positive number of seconds or a timedelta, got "
            f"{timeout!r}")
    return float(seconds)


class Registry:
    """The workflows a worker can run, by name and version; versions live side by side."""

    def __init__(self) -> None:
        self._workflows: dict[tuple[str, int], Workflow[Any]] = {}
        self._leases: tuple[float, dict[str, dict[str, float]]] | None = None

    def register(self, workflow: Workflow[Any]) -> Workflow[Any]:
        workflow.check()
        key = (workflow.name, workflow.version)
        existing = self._workflows.get(key)
        if existing is not None and existing is not workflow:
            raise WorkflowDefinitionError(
                f"workflow {workflow.name!r} version {workflow.version} is registered twice")
        self._workflows[key] = workflow
        self._leases = None
        return workflow

    def get(self, name: str, version: int | None = None) -> Workflow[Any] | None:
        """The exact version, or the newest one when ``version`` is None."""
        if version is not None:
            return self._workflows.get((name, version))
        return self.latest(name)

    def latest(self, name: str) -> Workflow[Any] | None:
        versions = self.versions(name)
        return self._workflows[(name, versions[-1])] if versions else None

    def versions(self, name: str) -> list[int]:
        return sorted(v for (n, v) in self._workflows if n == name)

    def names(self) -> list[str]:
        return sorted({name for name, _ in self._workflows})

    def first_claim_versions(self) -> dict[str, list[int]]:
        """What a run not yet bound to a version binds to when this code claims it (the
        claim records it, ledger/steps.py): per workflow, the newest version's
        ``[version, state_schema_version]``, the code that would run its first step."""
        bound: dict[str, list[int]] = {}
        for workflow in self.all():  # sorted: the newest version of each name comes last
            bound[workflow.name] = [workflow.version, workflow.state_schema_version]
        return bound

    def step_leases(self, margin_s: float) -> dict[str, dict[str, float]]:
        """The lease a claim takes at least, per workflow and step (``""``: the start step),
        for the steps with a timeout: the timeout and ``margin_s``, the longest over the
        versions this code has. The claim statement reads it (ledger/steps.py)."""
        if self._leases is not None and self._leases[0] == margin_s:
            return self._leases[1]
        leases: dict[str, dict[str, float]] = {}
        for workflow in self.all():
            for step in workflow.steps.values():
                lease = step.lease_s(margin_s)
                if lease is None:
                    continue
                names = [step.name, ""] if step is workflow.start else [step.name]
                for name in names:
                    per_step = leases.setdefault(workflow.name, {})
                    per_step[name] = max(lease, per_step.get(name, 0.0))
        self._leases = (margin_s, leases)
        return leases

    def async_parts(self) -> dict[str, list[str]]:
        """Per workflow (``name vN``), what of it needs an event loop: its ``async def``
        steps, an async model client, and the async tools its module defines."""
        from tasks.tools import Tool as ToolType

        found: dict[str, list[str]] = {}
        for workflow in self.all():
            parts = [f"async step {name}" for name in workflow.async_steps]
            complete = getattr(workflow.llm, "complete", None)
            if complete is not None and inspect.iscoroutinefunction(complete):
                parts.append("async model client")
            for module in {step.fn.__module__ for step in workflow.steps.values()}:
                values = vars(sys.modules[module]).values() if module in sys.modules else ()
                parts += sorted(f"async tool {v.name}" for v in values
                                if isinstance(v, ToolType) and v.is_async)
            if parts:
                found[f"{workflow.name} v{workflow.version}"] = parts
        return found

    def all(self) -> list[Workflow[Any]]:
        return [self._workflows[key] for key in sorted(self._workflows)]

    def tool(self, name: str) -> Tool | None:
        """The ``Tool`` named ``name`` among the top-level names of the modules that define
        the registered workflows' steps (None if none): how a worker resolves an effect of
        a step it did not run (a refusal before the step, a cancel)."""
        import sys

        from tasks.tools import Tool as ToolType

        modules = {step.fn.__module__ for workflow in self._workflows.values()
                   for step in workflow.steps.values()}
        for module_name in sorted(modules):
            module = sys.modules.get(module_name)
            for value in vars(module).values() if module is not None else ():
                if isinstance(value, ToolType) and value.name == name:
                    return value
        return None

    def load_modules(self, modules: list[str]) -> None:
        """Import each module and register every Workflow defined at its top level."""
        import importlib

        for module_name in modules:
            module = importlib.import_module(module_name)
            found = [v for v in vars(module).values() if isinstance(v, Workflow)]
            if not found:
                raise WorkflowDefinitionError(f"module {module_name} defines no Workflow")
            for workflow in found:
                self.register(workflow)
