"""A workflow for the anchor tests (tests/integration/test_anchor.py): each step notes a
random word, standing for a model answer that differs when a step runs again, so a restored
older copy of the database that runs on writes a different history at the same seq."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel

from tasks import StepContext, Workflow


class Notes(BaseModel):
    notes: list[str] = []
    steps: int = 20


notes = Workflow("test_anchor_notes", version=1, state=Notes, max_attempts=3)


@notes.step(start=True)
def note(ctx: StepContext, state: Notes) -> Any:
    written = [*state.notes, secrets.token_hex(4)]
    if len(written) >= state.steps:
        return ctx.finish(notes=written)
    return ctx.goto(note, notes=written)
