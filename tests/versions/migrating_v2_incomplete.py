"""A broken deploy of ``test_migrating`` version 2: schema 2 without the migration."""

from __future__ import annotations

from tasks import Workflow
from tests.versions.migrating import define_steps, model
from tests.versions.migrating_v2 import StateV2

migrating = Workflow("test_migrating", version=2, state=StateV2, llm=model,
                     state_schema_version=2)
define_steps(migrating, "customer_id")
