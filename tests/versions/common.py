"""Pieces shared by the versions of ``test_versioned`` (each module is one deploy)."""

from __future__ import annotations

from typing import Any

from tasks import StepContext, Workflow


def define_steps(workflow: Workflow[Any]) -> None:
    """start → (wait for signal "go") → finish, recording which version ran each part."""

    @workflow.step(start=True)
    def begin(ctx: StepContext, state: Any) -> Any:
        return ctx.wait_for_signal("go", then=end, ran=[*state.ran, f"begin@v{workflow.version}"])

    @workflow.step
    def end(ctx: StepContext, state: Any) -> Any:
        return ctx.finish(version=workflow.version, ran=[*state.ran, f"end@v{workflow.version}"],
                          state=state.model_dump(mode="json"))
