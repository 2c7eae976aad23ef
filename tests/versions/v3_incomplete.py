"""A broken deploy: schema 3 with no migration from schema 1."""

from __future__ import annotations

from typing import Any

from tasks import Workflow
from tests.versions.common import define_steps
from tests.versions.v3 import StateV3

versioned = Workflow("test_versioned", version=3, state=StateV3, state_schema_version=3)


@versioned.migration(from_schema=2)
def add_greeting(state: dict[str, Any]) -> dict[str, Any]:
    state["greeting"] = f"hello {state['full_name']}"
    return state


define_steps(versioned)
