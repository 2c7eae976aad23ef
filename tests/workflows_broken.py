"""A workflow module that raises while it is imported (tests of the clear error onward
gives for a module in ONWARD_WORKFLOWS that cannot be imported)."""

from __future__ import annotations

raise RuntimeError("tests.workflows_broken fails at import on purpose")
