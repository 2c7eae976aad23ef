"""Starting out: ``onward db status`` against a database the code does not match,
``onward console`` on a port that is taken and ``onward worker`` with no workflows say what
to do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from typer.testing import CliRunner

from console.cli import app
from ledger.db import HEAD_REVISION
from tests.support.cluster import ROOT
from workers.settings import WorkerSettings

__all__: list[str] = []


def test_db_status__a_database_behind_the_code_names_the_upgrade(empty_database: str) -> None:
    """An empty (or older) schema exits 2 and names ``onward db upgrade``; it said only
    'database: 0045   code needs: 0046'."""
    shown = CliRunner().invoke(app, ["db", "status"],
                               env={"ONWARD_DATABASE_URL": empty_database, "COLUMNS": "200"})
    assert shown.exit_code == 2, shown.output
    assert f"code needs: {HEAD_REVISION}" in shown.output
    assert "onward db upgrade" in shown.output


def test_console__a_port_in_use_is_refused_before_anything_starts(
        settings: WorkerSettings) -> None:
    """``onward console`` on a taken port exits 2 naming --port, before a login token is
    made or uvicorn starts; it printed a login link (to whatever held the port), then
    uvicorn's 'address already in use'."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        shown = CliRunner().invoke(app, ["console", "--port", str(port)], env={"COLUMNS": "200"})
    assert shown.exit_code == 2, shown.output
    assert f"127.0.0.1:{port}" in shown.stderr and "--port" in shown.stderr
    assert "open http" not in shown.output


def test_worker__with_no_workflows_is_refused(settings: WorkerSettings) -> None:
    """``onward worker`` with ONWARD_WORKFLOWS unset exits 2 naming it, before Celery
    starts: it started, consumed the base queue, and handed back other workflows' steps,
    spending their runs' attempts until they were parked."""
    env = {k: v for k, v in os.environ.items() if k != "ONWARD_WORKFLOWS"}
    done = subprocess.run([sys.executable, "-m", "console", "worker", "-c", "1"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no workflows to run" in done.stderr and "ONWARD_WORKFLOWS" in done.stderr
