"""``onward embedded down`` stops the embedded PostgreSQL even after a process that used it
was SIGKILLed, as ``make demo`` kills workers: pgserver keeps a list of the processes using
its server and stops it only when the last one leaves, and a killed one never leaves. And
``onward console`` on the embedded default revokes its login token when it is stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from console.cli import app
from tests.support.cluster import wait_for

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


def test_console__sigterm_revokes_its_login_token(home: Path) -> None:
    """Invariant (README: the login link's admin token is revoked when the console stops):
    a console stopped by SIGTERM (kill, systemd, docker stop) revokes it, as Ctrl-C does.
    Before, uvicorn raised SIGTERM again after its shutdown and the default handler ended
    the process before the revocation: the 12-hour admin token stayed valid."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONWARD_")},
           "ONWARD_HOME": str(home)}
    root = Path(__file__).resolve().parents[2]

    def onward(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "console", *args], env=env, cwd=root,
                              timeout=120, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        onward("db", "upgrade")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        console = subprocess.Popen([sys.executable, "-m", "console", "console", "--port",
                                    str(port)], env=env, cwd=root, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        assert console.stdout is not None
        link = console.stdout.readline()  # printed once the token exists
        assert "/login?token=onw_" in link, link
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/api/docs"), timeout=60,
                 what="the console to listen")
        console.send_signal(signal.SIGTERM)
        assert console.wait(timeout=60) == 0
        [token] = [t for t in json.loads(onward("tokens", "ls", "--all", "--json"))
                   if t["note"] == "onward console login link"]
        assert token["revoked_at"] is not None
    finally:
        onward("embedded", "down")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False
