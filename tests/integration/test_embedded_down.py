"""``onward embedded down`` stops the embedded PostgreSQL even after a process that used it
was SIGKILLed, as ``make demo`` kills workers: pgserver keeps a list of the processes using
its server and stops it only when the last one leaves, and a killed one never leaves."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from console.cli import app

_START_THEN_DIE = """
import os, signal, sys
from pathlib import Path
from ledger.embedded import postgres_url
postgres_url(Path(sys.argv[1]))
os.kill(os.getpid(), signal.SIGKILL)  # registered with pgserver, never unregistered
"""


@pytest.fixture
def home() -> Iterator[Path]:
    """A home pgserver's own user can reach when root starts it (tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="onward-embedded-"))
    path.chmod(0o755)
    yield path
    pid = _postmaster(path)
    if pid is not None:  # stop what the code under test left running
        _kill(pid)
    shutil.rmtree(path, ignore_errors=True)


def _postmaster(home: Path) -> int | None:
    try:
        pid = int((home / "pg" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGQUIT)  # immediate shutdown


def test_embedded_down__stops_postgres_a_killed_process_was_using(home: Path) -> None:
    """Invariant: after ``embedded down`` says postgres stopped, no postmaster runs there
    (before: it said so, and the server ran on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONWARD_")}
    started = subprocess.run([sys.executable, "-c", _START_THEN_DIE, str(home)], env=env,
                             cwd=Path(__file__).resolve().parents[2], timeout=120,
                             capture_output=True, text=True)
    assert started.returncode == -signal.SIGKILL, started.stderr
    pid = _postmaster(home)
    assert pid is not None
    result = CliRunner().invoke(app, ["embedded", "down"], env={
        "ONWARD_HOME": str(home), "ONWARD_DATABASE_URL": None, "ONWARD_BROKER_URL": None})
    assert result.exit_code == 0, result.output
    assert "postgres stopped: True" in result.stdout
    assert _postmaster(home) is None
