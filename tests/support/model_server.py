"""The model server (examples/model_server.py) for one test (harness/model_server.py): in a
thread of the test process for integration tests, which start no processes; as a real
subprocess for acceptance tests, beside the workers they start."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.model_server import ModelServer
from harness.processes import Processes

__all__ = ["ModelServer", "model_fixture", "model_server_in_thread", "running_model_server"]


@contextmanager
def model_server_in_thread(**limits: Any) -> Iterator[ModelServer]:
    """The model server in a daemon thread of this process until the block ends, with
    ``limits`` (``latency_ms``, ``jitter``, ``max_concurrency``, ``rate_per_s``); what it
    counts is read over HTTP (``stats()``) as from a process."""
    server = ModelServer.in_thread(**limits)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def running_model_server(tmp: Path, *options: str) -> Iterator[ModelServer]:
    """``python -m examples.model_server --port 0 OPTIONS`` until the block ends."""
    processes = Processes(env={}, log_dir=tmp)
    server = ModelServer.start(processes, tmp, *options, timeout=30)
    try:
        yield server
    finally:
        server.stop()


def model_fixture(*options: str) -> Callable[..., Iterator[ModelServer]]:
    """An acceptance module's ``model`` fixture: ``running_model_server`` with ``options``
    (``"--latency-ms", "50"``) for one test, its log in ``tmp_path / "model"``."""
    @pytest.fixture()
    def model(tmp_path: Path) -> Iterator[ModelServer]:
        with running_model_server(tmp_path / "model", *options) as server:
            yield server

    return model
