"""The reference provider (examples/provider.py) as a real HTTP service, in its own process
or in a thread of this one, with its store in a directory of the caller's, and a client for
its admin API."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness.errors import HarnessError, ProcessExited
from harness.processes import Processes
from harness.waiting import wait_for


class ReferenceProvider:
    """Started by ``start()`` (a process) or ``in_thread()`` on a free loopback port; ``url``
    is where workers reach it, over HTTP either way."""

    def __init__(self, url: str, stop: Callable[[], None]) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30.0)
        self._stop = stop

    @classmethod
    def start(cls, processes: Processes, workdir: Path, timeout: float = 60.0,
              name: str = "provider") -> ReferenceProvider:
        """Start it among ``processes`` (its log with theirs), its store in ``workdir``."""
        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / f"{name}.port"
        proc = processes.start(name, ["-m", "examples.provider", "--port", "0", "--db",
                                      str(workdir / f"{name}.db"), "--port-file",
                                      str(port_file)])

        def listening() -> bool:
            if not proc.alive():
                raise ProcessExited(f"the provider exited:\n{proc.tail()}")
            return port_file.exists()

        wait_for(listening, timeout=timeout, what="the provider to listen")
        return cls(f"http://127.0.0.1:{port_file.read_text().strip()}",
                   lambda: proc.stop(timeout=10.0))

    @classmethod
    def in_thread(cls, workdir: Path, timeout: float = 30.0,
                  name: str = "provider") -> ReferenceProvider:
        """Serve it from a daemon thread of this process (each request in a thread of its
        own), its store in ``workdir``, for tests that start no processes; ``stop()`` shuts
        it down and joins the thread."""
        from examples.provider import ProviderServer

        workdir.mkdir(parents=True, exist_ok=True)
        server = ProviderServer(0, workdir / f"{name}.db")  # listening once made
        thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            thread.join(timeout)
            server.server_close()
            if thread.is_alive():
                raise HarnessError(f"the provider's thread did not stop in {timeout} s")

        return cls(f"http://127.0.0.1:{server.server_address[1]}", stop)

    def stats(self) -> dict[str, Any]:
        """What the outside world holds, from the provider itself (not from the ledger)."""
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def objects(self) -> list[dict[str, Any]]:
        return list(self.http.get("/admin/objects").raise_for_status().json())

    def configure(self, **values: Any) -> None:
        self.http.post("/admin/config", json=values).raise_for_status()

    def arm(self, collection: str, **faults: float) -> None:
        """The next requests in ``collection`` misbehave: creates with drop_response,
        commit_error_500, error_500, error_429, slow, hold (with slow_s / hold_s); lookups
        and status reads with lookup_error_500, lookup_slow, status_error_500, status_slow
        (with lookup_slow_s / status_slow_s). examples/provider.py says what each does."""
        self.http.post("/admin/faults",
                       json={"collection": collection, **faults}).raise_for_status()

    def stop(self) -> None:
        self.http.close()
        self._stop()
