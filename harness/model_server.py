"""The model server (examples/model_server.py) as a real HTTP service, in its own process or
in a thread of this one, and a client for its admin API."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness.errors import HarnessError, ProcessExited
from harness.processes import Processes
from harness.waiting import wait_for


class ModelServer:
    """Started by ``start()`` (a process) or ``in_thread()`` on a free loopback port; ``url``
    (ending in ``/v1``) is what an OpenAI client's ``base_url`` takes. Either way it is
    reached over HTTP only, its counters through ``stats()``."""

    def __init__(self, url: str, stop: Callable[[], None]) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url.removesuffix("/v1"), timeout=30.0)
        self._stop = stop

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
        return cls(f"http://127.0.0.1:{port_file.read_text().strip()}/v1",
                   lambda: proc.stop(timeout=10.0))

    @classmethod
    def in_thread(cls, timeout: float = 30.0, **limits: Any) -> ModelServer:
        """Serve it from a daemon thread of this process (its own event loop) with
        ``limits`` (``latency_ms``, ``jitter``, ``max_concurrency``, ``rate_per_s``), for
        tests that start no processes; ``stop()`` shuts it down and joins the thread."""
        from examples.model_server import Limits, listening_socket, uvicorn_server
        from examples.model_server import ModelServer as App

        sock = listening_socket(0)
        # log_config=None: leave this process's logging as it is; a bounded graceful
        # shutdown, so a request still held cannot keep stop() waiting
        server = uvicorn_server(App(Limits(**limits)), log_config=None,
                                timeout_graceful_shutdown=5)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                  name="model-server", daemon=True)
        thread.start()

        def started() -> bool:
            if not thread.is_alive():
                raise HarnessError("the model server's thread ended before it listened")
            return bool(server.started)

        def stop() -> None:
            server.should_exit = True
            thread.join(timeout)
            sock.close()
            if thread.is_alive():
                raise HarnessError(f"the model server's thread did not stop in {timeout} s")

        try:
            wait_for(started, timeout=timeout, what="the model server to listen")
        except BaseException:
            stop()
            raise
        return cls(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", stop)

    def stats(self) -> dict[str, Any]:
        """What the server saw: requests, completed, rejected_429, max_inflight, ..."""
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def configure(self, **limits: Any) -> None:
        """latency_ms, jitter, max_concurrency, rate_per_s (0: no limit); salt (mixed into
        every answer from then on)."""
        self.http.post("/admin/config", json=limits).raise_for_status()

    def reset(self) -> None:
        """Zero the counters."""
        self.http.post("/admin/reset").raise_for_status()

    def stop(self) -> None:
        self.http.close()
        self._stop()
