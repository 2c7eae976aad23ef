from __future__ import annotations

from pydantic import BaseModel, Field

from tasks import Workflow
from tests.versions.common import define_steps


class StateV1(BaseModel):
    name: str = "ada"
    ran: list[str] = Field(default_factory=list)


versioned = Workflow("test_versioned", version=1, state=StateV1)
define_steps(versioned)
