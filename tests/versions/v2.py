"""Version 2: same state schema, no compatibility declared with v1."""

from __future__ import annotations

from tasks import Workflow
from tests.versions.common import define_steps
from tests.versions.v1 import StateV1

versioned = Workflow("test_versioned", version=2, state=StateV1)
define_steps(versioned)
