"""``test_migrating`` version 1, state schema 1 (``customer``)."""

from __future__ import annotations

from pydantic import BaseModel

from tasks import Workflow
from tests.versions.migrating import define_steps, model


class StateV1(BaseModel):
    customer: str = "c-1"
    wait: str = ""  # "", "approval" or "signal"


migrating = Workflow("test_migrating", version=1, state=StateV1, llm=model)
define_steps(migrating, "customer")
