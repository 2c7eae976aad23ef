"""The authoring API: a workflow is an explicit state machine of named steps.

    research = Workflow("research_agent", version=1, state=ResearchState)

    @research.step(start=True)
    def collect(ctx, state):
        return ctx.goto(extract, sources=find_sources(state.topic))

Each step receives ``(ctx, state)`` and returns ``ctx.goto(...)``, ``ctx.finish(...)`` or
``ctx.fail(...)``. Definition mistakes raise ``WorkflowDefinitionError`` at import time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import BaseModel

from tasks.exceptions import WorkflowDefinitionError

if TYPE_CHECKING:
    from tasks.context import StepContext
    from ledger.runs import Budgets
    from tasks.llm import LLMClient
    from tasks.outcomes import Outcome

S = TypeVar("S", bound=BaseModel)
StepFn = Callable[["StepContext", Any], "Outcome"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")


@dataclass(frozen=True)
class Step:
    """One named step of a workflow; calling it calls the function."""

    name: str
    fn: StepFn
    workflow: str
    max_attempts: int | None

    def __call__(self, ctx: StepContext, state: Any) -> Outcome:
        return self.fn(ctx, state)


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
        self.steps: dict[str, Step] = {}
        self.start: Step | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version}, steps={list(self.steps)})"

    @overload
    def step(self, fn: StepFn, /) -> Step: ...

    @overload
    def step(
        self, *, start: bool = False, name: str | None = None, max_attempts: int | None = None
    ) -> Callable[[StepFn], Step]: ...

    def step(
        self,
        fn: StepFn | None = None,
        /,
        *,
        start: bool = False,
        name: str | None = None,
        max_attempts: int | None = None,
    ) -> Step | Callable[[StepFn], Step]:
        """Register a step; ``start=True`` marks the one a new run begins with."""

        def register(func: StepFn) -> Step:
            step_name = name or func.__name__
            if not _NAME.match(step_name):
                raise WorkflowDefinitionError(f"{self.name}: invalid step name {step_name!r}")
            if step_name in self.steps:
                raise WorkflowDefinitionError(f"{self.name}: step {step_name!r} defined twice")
            if max_attempts is not None and max_attempts < 1:
                raise WorkflowDefinitionError(f"{self.name}.{step_name}: max_attempts must be >= 1")
            step = Step(step_name, func, self.name, max_attempts)
            if start:
                if self.start is not None:
                    raise WorkflowDefinitionError(
                        f"{self.name}: both {self.start.name!r} and {step_name!r} say start=True"
                    )
                self.start = step
            self.steps[step_name] = step
            return step

        return register(fn) if fn is not None else register

    def resolve(self, name: str | None) -> Step | None:
        """The step a checkpoint names (None = the start step), or None if unknown."""
        if name is None:
            return self.start
        return self.steps.get(name)

    def attempts_for(self, step: Step | None) -> int:
        if step is not None and step.max_attempts is not None:
            return step.max_attempts
        return self.max_attempts

    def check(self) -> None:
        """Validate the whole definition; the registry calls this on registration."""
        if self.start is None:
            raise WorkflowDefinitionError(
                f"workflow {self.name} has no start step: mark one with @workflow.step(start=True)"
            )


class Registry:
    """The workflows a worker can run, by name (one version per name for now)."""

    def __init__(self) -> None:
        self._workflows: dict[str, Workflow[Any]] = {}

    def register(self, workflow: Workflow[Any]) -> Workflow[Any]:
        workflow.check()
        existing = self._workflows.get(workflow.name)
        if existing is not None and existing is not workflow:
            raise WorkflowDefinitionError(f"workflow {workflow.name!r} is registered twice")
        self._workflows[workflow.name] = workflow
        return workflow

    def get(self, name: str) -> Workflow[Any] | None:
        return self._workflows.get(name)

    def names(self) -> list[str]:
        return sorted(self._workflows)

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
