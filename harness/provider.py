"""The reference provider (examples/provider.py) as a real HTTP service in its own process,
with its store in a directory of the caller's, and a client for its admin API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from harness.errors import ProcessExited
from harness.processes import Proc, Processes
from harness.waiting import wait_for


class ReferenceProvider:
    """Started by ``start()`` on a free loopback port; ``url`` is where workers reach it."""

    def __init__(self, proc: Proc, url: str) -> None:
        self.proc = proc
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30.0)

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
        return cls(proc, f"http://127.0.0.1:{port_file.read_text().strip()}")

    def stats(self) -> dict[str, Any]:
        """What the outside world holds, from the provider itself (not from the ledger)."""
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def objects(self) -> list[dict[str, Any]]:
        return list(self.http.get("/admin/objects").raise_for_status().json())

    def configure(self, **values: Any) -> None:
        self.http.post("/admin/config", json=values).raise_for_status()

    def arm(self, collection: str, **faults: float) -> None:
        """The next creates in ``collection`` misbehave: drop_response, error_500, slow,
        hold (with slow_s / hold_s)."""
        self.http.post("/admin/faults",
                       json={"collection": collection, **faults}).raise_for_status()

    def stop(self) -> None:
        self.http.close()
        self.proc.stop(timeout=10.0)
