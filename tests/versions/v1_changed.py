"""Version 1 again, its state model changed incompatibly without a new version or schema
(``name`` became a required ``full_name``): a deploy mistake that meets stored runs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tasks import Workflow
from tests.versions.common import define_steps


class StateV1Changed(BaseModel):
    full_name: str
    ran: list[str] = Field(default_factory=list)


versioned = Workflow("test_versioned", version=1, state=StateV1Changed)
define_steps(versioned)
