"""The reference provider (examples/provider.py) as a real subprocess for one test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.cluster import ROOT, wait_for


class Provider:
    def __init__(self, url: str, popen: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.popen = popen
        self.http = httpx.Client(base_url=url, timeout=5.0)

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def objects(self) -> list[dict[str, Any]]:
        return list(self.http.get("/admin/objects").raise_for_status().json())

    def configure(self, **values: Any) -> None:
        self.http.post("/admin/config", json=values).raise_for_status()

    def arm(self, collection: str, **faults: int) -> None:
        response = self.http.post("/admin/faults", json={"collection": collection, **faults})
        response.raise_for_status()


@contextmanager
def running_provider(tmp: Path) -> Iterator[Provider]:
    port_file = tmp / "provider.port"
    log = open(tmp / "provider.log", "wb")  # noqa: SIM115 - closed below
    popen = subprocess.Popen(
        [sys.executable, "-m", "examples.provider", "--port", "0", "--db",
         str(tmp / "provider.db"), "--port-file", str(port_file)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for(port_file.exists, timeout=20, what="the provider to listen")
        provider = Provider(f"http://127.0.0.1:{port_file.read_text().strip()}", popen)
        yield provider
        provider.http.close()
    finally:
        popen.terminate()
        popen.wait(timeout=10)
        log.close()
