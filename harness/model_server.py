"""The model server (examples/model_server.py) as a real HTTP service in its own process, and
a client for its admin API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from harness.errors import ProcessExited
from harness.processes import Proc, Processes
from harness.waiting import wait_for


class ModelServer:
    """Started by ``start()`` on a free loopback port; ``url`` (ending in ``/v1``) is what
    an OpenAI client's ``base_url`` takes."""

    def __init__(self, proc: Proc, url: str) -> None:
        self.proc = proc
        self.url = url
        self.http = httpx.Client(base_url=url.removesuffix("/v1"), timeout=30.0)

    @classmethod
    def start(cls, processes: Processes, workdir: Path, *options: str, timeout: float = 60.0,
              name: str = "model") -> ModelServer:
        """Start it among ``processes`` with ``options`` (e.g. ``"--latency-ms", "500"``)."""
        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / f"{name}.port"
        proc = processes.start(name, ["-m", "examples.model_server", "--port", "0",
                                      "--port-file", str(port_file), *options])

        def listening() -> bool:
            if not proc.alive():
                raise ProcessExited(f"the model server exited:\n{proc.tail()}")
            return port_file.exists() and bool(port_file.read_text().strip())

        wait_for(listening, timeout=timeout, what="the model server to listen")
        return cls(proc, f"http://127.0.0.1:{port_file.read_text().strip()}/v1")

    def stats(self) -> dict[str, Any]:
        """What the server saw: requests, completed, rejected_429, max_inflight, ..."""
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def configure(self, **limits: Any) -> None:
        """latency_ms, jitter, max_concurrency, rate_per_s (0: no limit)."""
        self.http.post("/admin/config", json=limits).raise_for_status()

    def reset(self) -> None:
        """Zero the counters."""
        self.http.post("/admin/reset").raise_for_status()

    def stop(self) -> None:
        self.http.close()
        self.proc.stop(timeout=10.0)
