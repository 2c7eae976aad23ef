"""``ctx``: what a step sees of the engine. Outcomes are built here, committed by the executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from tasks.exceptions import LeaseLost
from tasks.outcomes import Fail, Finish, Goto
from tasks.workflow import Step, Workflow


@dataclass
class StepContext:
    """Identity of the running step and the outcome builders.

    A step body may run more than once (at-least-once); only its commit happens once.
    """

    run_id: UUID
    seq: int
    attempt: int
    step: str
    workflow: Workflow[Any]
    worker: str
    tenant_id: str
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

    def heartbeat(self) -> None:
        """Extend the lease during a long step; raises LeaseLost if another worker took over."""
        if not self._heartbeat():
            raise LeaseLost(f"run {self.run_id} seq {self.seq}: the lease was taken over")
