"""The public surface is explicit (docs/design.md, "Packages"): ``tasks`` exports the whole
authoring API and ``ledger`` the application API, and every module of the four packages
says what it exports with ``__all__``. The two package lists are pinned here, so a change
to what an application or a workflow author imports is a deliberate one: edit the list
below in the same commit, and say so in CHANGELOG.md."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import ledger
import tasks

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "tasks", "workers", "console")

TASKS_API = [
    "AskApproval", "AsyncStepContext", "CallFailure", "CredentialUnavailable", "EffectFailed",
    "EffectOutcomeUnknown", "ExecutorConfig", "Fail", "Finish", "Goto", "LLMClient", "LLMResponse",
    "LeaseLost", "Limit", "Outcome", "OutcomeError", "Registry", "RetryPolicy", "Sensitive",
    "Sleep", "Step", "StepContext", "StepError", "StepMessage", "StepReport", "StepTimedOut",
    "Tool", "ToolClass", "ToolError", "ToolPromiseBroken", "ToolResult", "WaitSignal", "Workflow",
    "WorkflowDefinitionError", "artifact_hash", "assert_tool_keeps_promises", "execute_step",
    "parse_retry_after",
]
LEDGER_API = [
    "Approval", "ApprovalRefused", "ApprovalStatus", "AsyncLedger", "AttemptOutcome",
    "BatchStats", "Cancelled", "CheckpointEnvelope", "Continued", "Effect", "EffectAttempt",
    "EffectAttemptOutcome", "EffectConflict", "EffectStatus", "EventKind", "FailReason",
    "IdempotencyConflict", "IntegrityViolation", "InvalidInput", "LaunchMode", "Ledger",
    "LedgerUnavailable", "LimitState", "OnwardError", "OnwardSettings", "OperationRefused",
    "OutcomeKind", "ParkReason", "PermissionDenied", "Priority", "Problem", "Role", "Run",
    "RunEvent", "RunOutcome", "RunStatus", "SchemaMismatch", "TimelineEntry",
    "Unauthenticated", "UnknownApproval", "UnknownEffect", "UnknownRun", "UnknownWorkflow",
    "WaitTimedOut",
]


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:  # Alembic's scripts, loaded by Alembic, not imported
                continue
            found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def _declared_all(path: Path) -> list[str] | None:
    for node in ast.parse(path.read_text()).body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
            value = ast.literal_eval(node.value)
            return list(value)
    return None


def test_tasks__exports_the_authoring_api() -> None:
    """What a workflow or tool author imports: ``from tasks import Tool, ToolClass, ...``."""
    assert sorted(tasks.__all__) == sorted(TASKS_API)
    assert len(set(tasks.__all__)) == len(tasks.__all__)


def test_ledger__exports_the_application_api() -> None:
    """What an application imports to start, wait for and operate runs."""
    assert sorted(ledger.__all__) == sorted(LEDGER_API)
    assert len(set(ledger.__all__)) == len(ledger.__all__)


def test_every_module__declares_all() -> None:
    """Each module of the packages says what it exports (a literal ``__all__``)."""
    missing = [name for name, path in _modules() if _declared_all(path) is None]
    assert missing == []


@pytest.mark.parametrize("name", [name for name, _ in _modules() if not name.endswith("__main__")])
def test_module_all__names_real_attributes(name: str) -> None:
    """Every name in a module's ``__all__`` exists in it, once (``from m import *`` works)."""
    module = importlib.import_module(name)
    exported = list(getattr(module, "__all__", []))
    assert [n for n in exported if not hasattr(module, n)] == []
    assert len(set(exported)) == len(exported)


def test_the_check__sees_a_module_without_all(tmp_path: Path) -> None:
    """The rule above can fail: a module with no ``__all__`` is seen as missing one."""
    without, with_ = tmp_path / "a.py", tmp_path / "b.py"
    without.write_text('"""doc"""\n\nX = 1\n')
    with_.write_text('"""doc"""\n\n__all__ = ["X"]\n\nX = 1\n')
    assert (_declared_all(without), _declared_all(with_)) == (None, ["X"])
