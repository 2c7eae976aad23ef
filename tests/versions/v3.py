"""Version 3: state schema 3, reached from schema 1 by two tested migrations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tasks import Workflow
from tests.versions.common import define_steps


class StateV3(BaseModel):
    full_name: str
    greeting: str
    ran: list[str] = Field(default_factory=list)


versioned = Workflow("test_versioned", version=3, state=StateV3, state_schema_version=3)


@versioned.migration(from_schema=1)
def rename_name(state: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 calls ``name`` ``full_name``."""
    state["full_name"] = state.pop("name")
    return state


@versioned.migration(from_schema=2)
def add_greeting(state: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 adds a greeting derived from the name."""
    state["greeting"] = f"hello {state['full_name']}"
    return state


define_steps(versioned)
