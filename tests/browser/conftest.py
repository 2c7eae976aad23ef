"""Browser tests: pytest-playwright driving Debian's Chromium (``/usr/bin/chromium``; no
browser download exists on these machines). Locally they skip, saying how to install it;
under CI=true they fail instead (.ci/run installs the package)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from console.http.app import create_app
from ledger import Ledger

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium dials out at start-up, and this
# machine's closed network refuses it.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, Any]:
    """pytest-playwright launches Debian's Chromium, not a downloaded one."""
    if not CHROMIUM.exists():
        message = ("no Chromium at /usr/bin/chromium: install it with "
                   "`apt-get install -y chromium` (Debian) to run the browser tests")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return {"executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS, "headless": True}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def console_url(settings: Any) -> Iterator[str]:
    """A real console server (uvicorn on loopback, in a thread) on the test's database."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Ledger.from_env(settings)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console server did not start within 20 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
