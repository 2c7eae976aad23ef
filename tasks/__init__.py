"""What runs inside a worker: the authoring API and the step executor.

Everything a workflow or tool author needs is importable from here (``from tasks import
Workflow, StepContext, Tool, ToolClass, ToolResult, ToolError``); the submodules are the
implementation. ``tests/unit/test_public_api.py`` pins this list, so a change to it is a
deliberate one. The model clients for the optional SDKs stay in their own modules
(``tasks.llm_openai``, ``tasks.llm_anthropic``) so importing ``tasks`` needs neither SDK.
"""

from __future__ import annotations

from ledger.vocabulary import CallFailure, ToolClass
from tasks.context import AsyncStepContext, StepContext
from tasks.exceptions import (
    CredentialUnavailable,
    EffectFailed,
    EffectOutcomeUnknown,
    LeaseLost,
    OutcomeError,
    StepError,
    StepTimedOut,
    ToolError,
    ToolPromiseBroken,
    WorkflowDefinitionError,
)
from tasks.executor import ExecutorConfig, StepMessage, StepReport, execute_step
from tasks.limits import Limit
from tasks.llm import LLMClient, LLMResponse
from tasks.outcomes import AskApproval, Fail, Finish, Goto, Outcome, Sleep, WaitSignal
from tasks.retry import RetryPolicy, parse_retry_after
from tasks.sensitive import Sensitive
from tasks.toolcheck import assert_tool_keeps_promises
from tasks.tools import Tool, ToolResult
from tasks.waiting import artifact_hash
from tasks.workflow import Registry, Step, Workflow

__all__ = [
    "AskApproval",
    "AsyncStepContext",
    "CallFailure",
    "CredentialUnavailable",
    "EffectFailed",
    "EffectOutcomeUnknown",
    "ExecutorConfig",
    "Fail",
    "Finish",
    "Goto",
    "LLMClient",
    "LLMResponse",
    "LeaseLost",
    "Limit",
    "Outcome",
    "OutcomeError",
    "Registry",
    "RetryPolicy",
    "Sensitive",
    "Sleep",
    "Step",
    "StepContext",
    "StepError",
    "StepMessage",
    "StepReport",
    "StepTimedOut",
    "Tool",
    "ToolClass",
    "ToolError",
    "ToolPromiseBroken",
    "ToolResult",
    "WaitSignal",
    "Workflow",
    "WorkflowDefinitionError",
    "artifact_hash",
    "assert_tool_keeps_promises",
    "execute_step",
    "parse_retry_after",
]
