"""The model server (examples/model_server.py) as a real subprocess for one test
(harness/model_server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.model_server import ModelServer
from harness.processes import Processes

__all__ = ["ModelServer", "running_model_server"]


@contextmanager
def running_model_server(tmp: Path, *options: str) -> Iterator[ModelServer]:
    """``python -m examples.model_server --port 0 OPTIONS`` until the block ends."""
    processes = Processes(env={}, log_dir=tmp)
    server = ModelServer.start(processes, tmp, *options, timeout=30)
    try:
        yield server
    finally:
        server.stop()
