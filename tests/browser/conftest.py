"""Browser tests: pytest-playwright driving Debian's Chromium (``/usr/bin/chromium``; no
browser download exists on these machines). Locally they skip, saying how to install it;
under CI=true they fail instead (.ci/run installs the package)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, BrowserType, Playwright, sync_playwright

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


# pytest-playwright keeps Playwright, its browser and Chromium's processes for the whole
# session. Its sync API runs an event loop in a greenlet of the main thread, so in a serial
# run every later test met a running loop (asyncio.run refused: test_crypt's async client,
# test_llm_openai_clients), ast.parse a shifted recursion depth (test_migration_chain) and
# the integration tier's child-process check Chromium's helpers (test_scratch). So they
# are this package's and stop when its tests end (pytest-xdist had hidden this: another
# process ran those tests).


@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    running = sync_playwright().start()
    yield running
    running.stop()


@pytest.fixture(scope="package")
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    return getattr(playwright, browser_name)  # type: ignore[no-any-return]


@pytest.fixture(scope="package")
def launch_browser(browser_type_launch_args: dict[str, Any],
                   browser_type: BrowserType) -> Callable[..., Browser]:
    def launch(**kwargs: Any) -> Browser:
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})

    return launch


@pytest.fixture(scope="package")
def browser(launch_browser: Callable[..., Browser]) -> Iterator[Browser]:
    launched = launch_browser()
    yield launched
    launched.close()


@pytest.fixture(scope="package")
def browser_context_args() -> dict[str, Any]:
    """Plain contexts (pytest-playwright's reads the session's Playwright for --device,
    --base-url and --video, which these tests do not use)."""
    return {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Server(uvicorn.Server):
    """A uvicorn server that says when it has started (or given up), so a test blocks on
    an event instead of polling ``started``."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.settled = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.settled.set()

    def serve_in_thread(self) -> threading.Thread:
        def run() -> None:
            try:
                self.run()
            finally:
                self.settled.set()  # it exited before (or without) starting

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


@pytest.fixture()
def console_url(settings: Any) -> Iterator[str]:
    """A real console server (uvicorn on loopback, in a thread) on the test's database."""
    port = free_port()
    server = _Server(uvicorn.Config(create_app(Ledger.from_env(settings)),
                                    host="127.0.0.1", port=port, log_level="warning"))
    thread = server.serve_in_thread()
    if not server.settled.wait(timeout=20) or not server.started:
        raise RuntimeError("the console server did not start within 20 s")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
