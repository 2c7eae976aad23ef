"""``test_migrating`` version 2, state schema 2 (``customer`` renamed ``customer_id``), with
the migration from schema 1; its ``send`` no longer raises."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tasks import Workflow
from tests.versions.migrating import define_steps, model


class StateV2(BaseModel):
    customer_id: str
    wait: str = ""


migrating = Workflow("test_migrating", version=2, state=StateV2, llm=model,
                     state_schema_version=2)


@migrating.migration(from_schema=1)
def rename_customer(state: dict[str, Any]) -> dict[str, Any]:
    state["customer_id"] = state.pop("customer")
    return state


define_steps(migrating, "customer_id")
