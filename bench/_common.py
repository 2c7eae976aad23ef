"""What bench/steps.py and bench/waiting.py share: their own database on the configured
server, real processes with logs, and worker readiness."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ledger.migrate import upgrade

ROOT = Path(__file__).resolve().parents[1]


class BenchFailed(RuntimeError):
    """The bench could not do what it set out to do."""


# -- a database of the bench's own ---------------------------------------------------------
def create_database(admin_url: str, prefix: str) -> tuple[str, str]:
    """Create and migrate ``<prefix>_<random>`` on the server of ``admin_url``: (name, url)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    upgrade(engine)
    engine.dispose()
    return name, url


def drop_database(admin_url: str, name: str) -> None:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a redis URL: hide a password if any
        head, sep, tail = url.rpartition("@")
        return f"{head.split('//')[0]}//***@{tail}" if sep else url


# -- processes -----------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a Celery worker then shuts its pool down), SIGKILL of the tree if stuck."""
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)  # its own session: only its tree
            self.popen.wait(timeout=10)


@dataclass
class Processes:
    """Python processes started from the repository root, each in its own session, each
    with its log file in ``log_dir``."""

    log_dir: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        """``python ARGV...`` (e.g. ``["-m", "console", "worker"]``)."""
        env = {**os.environ, **self.env, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        path = self.log_dir / f"{len(self.procs):02d}-{name}.log"
        with open(path, "wb") as handle:  # the child keeps its own descriptor
            popen = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=handle,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        proc = Proc(name, popen, path)
        self.procs.append(proc)
        return proc

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise BenchFailed(f"{proc.name} exited ({proc.popen.returncode}):\n"
                                  f"{proc.tail()}")

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


def wait_ready(app: Any, proc: Proc, node: str, timeout: float = 120.0) -> None:
    """A worker is ready when it answers a remote-control ping (works at any log level)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise BenchFailed(f"{proc.name} exited:\n{proc.tail()}")
        if app.control.ping(destination=[node], timeout=0.5):
            return
    raise BenchFailed(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.tail()}")
