"""A throwaway PostgreSQL server of one's own, for a bench that restarts its database.

Never restart a server somebody else uses: the chaos bench (bench/chaos/) initdbs a
cluster in a temporary directory with the binaries the ``pgserver`` package ships (the same
ones the embedded default runs, see ledger/embedded.py), listens on a free loopback port,
and stops or restarts it with ``pg_ctl``. It needs no PostgreSQL on the machine.

PostgreSQL refuses to run as root: when this process is root, the server runs as the
unprivileged ``pgserver`` user (created if missing, as pgserver itself does).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVER_USER = "pgserver"
SUPERUSER = "postgres"


def bin_dir() -> Path:
    """The ``bin/`` of the PostgreSQL that the pgserver package bundles."""
    spec = importlib.util.find_spec("pgserver")  # found, not imported (it warns on import)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver package is not installed: pip install pgserver")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_user() -> str | None:
    """The user the server runs as: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/false", SERVER_USER], check=True,
                       capture_output=True)
    return SERVER_USER


class PrivatePostgres:
    """One PostgreSQL cluster in a temporary directory, on 127.0.0.1:<free port>."""

    def __init__(self, prefix: str = "onward-pg-", settings: dict[str, str] | None = None):
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self.user = _server_user()
        self.settings = {"max_connections": "200", **(settings or {})}
        if self.user is not None:
            self.root.chmod(0o755)
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of its ``postgres`` database."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 60.0) -> None:
        done = subprocess.run([str(bin_dir() / tool), *args], user=self.user,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def init(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", SUPERUSER,
                  "--encoding=utf8", "--no-sync")
        return self

    def _start_args(self) -> list[str]:
        options = " ".join([f"-h 127.0.0.1 -p {self.port} -k {self.root}",
                            *(f"-c {k}={v}" for k, v in self.settings.items())])
        return ["-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "60",
                "-o", options, "start"]

    def start(self) -> None:
        """Start it and wait until it accepts connections (``pg_ctl -w``)."""
        self._run("pg_ctl", *self._start_args())

    def start_command(self) -> str:
        """The shell command that starts it again (for a cluster kept for inspection)."""
        runner = f"runuser -u {self.user} -- " if self.user else ""
        return runner + shlex.join([str(bin_dir() / "pg_ctl"), *self._start_args()])

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` is a crash (recovery on the next start),
        ``fast`` ends every session and shuts down cleanly."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def running(self) -> bool:
        done = subprocess.run([str(bin_dir() / "pg_ctl"), "-D", str(self.data), "status"],
                              user=self.user, capture_output=True, stdin=subprocess.DEVNULL)
        return done.returncode == 0

    def destroy(self, keep: bool = False) -> None:
        """Stop it (if it runs) and remove its directory unless ``keep``."""
        if self.data.exists() and self.running():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
