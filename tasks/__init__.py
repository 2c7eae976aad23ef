"""What runs inside a worker: the authoring API and the step executor."""

from __future__ import annotations

from tasks.context import AsyncStepContext, StepContext
from tasks.exceptions import (
    LeaseLost,
    OutcomeError,
    StepError,
    StepTimedOut,
    WorkflowDefinitionError,
)
from tasks.executor import ExecutorConfig, StepMessage, StepReport, execute_step
from tasks.outcomes import Fail, Finish, Goto, Outcome
from tasks.sensitive import Sensitive
from tasks.workflow import Registry, Step, Workflow

__all__ = [
    "AsyncStepContext",
    "ExecutorConfig",
    "Fail",
    "Finish",
    "Goto",
    "LeaseLost",
    "Outcome",
    "OutcomeError",
    "Registry",
    "Sensitive",
    "Step",
    "StepContext",
    "StepError",
    "StepMessage",
    "StepReport",
    "StepTimedOut",
    "Workflow",
    "WorkflowDefinitionError",
    "execute_step",
]
