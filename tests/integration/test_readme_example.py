"""The README's first example is code that runs: its workflow module, as printed, registers
in a worker and routes an invoice ticket to billing; its application code starts the run."""

from __future__ import annotations

import re
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from tests.support.driver import driver

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", readme, re.DOTALL | re.MULTILINE)


def test_readme__the_example_workflow_runs_as_printed(
        ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module the README names (myapp/agents.py) holds only the workflow (a worker
    imports it); the application code beside it starts the run. Before, one block held
    both, so pasting it into myapp/agents.py started a run in every worker process."""
    module, application = _python_blocks()[:2]
    assert module.startswith("# myapp/agents.py") and "start_run" not in module
    package = tmp_path / "readme_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    with driver(ledger, ["readme_app.agents"]) as drv:
        scope: dict[str, object] = {}
        exec(compile(application, "README.md", "exec"), scope)  # the README's own code
        run = drv.drive(UUID(str(scope["run_id"])))
    assert run.status is RunStatus.COMPLETED
    assert run.result == {"reply": "routed to billing"}
