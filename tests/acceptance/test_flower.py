"""Flower, started for real against the test broker, shows every step of a run as a task
named ``<workflow>.<step>``, including the steps a worker ran by eager continuation (which
had no broker message of their own), once task events are on (``ONWARD_TASK_EVENTS``; off
by default, and then Flower lists none)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from ledger import Ledger, RunStatus
from tests.support.cluster import ROOT, Cluster, wait_for

pytestmark = pytest.mark.acceptance

STEPS = ["plan", "search", "read", "write", "publish"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def flower(settings_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """Real Flower (``celery flower``) on the test broker, its API open on loopback as
    compose.yaml runs it (FLOWER_UNAUTHENTICATED_API)."""
    port = _free_port()
    env = {**os.environ, **settings_env, "FLOWER_UNAUTHENTICATED_API": "true"}
    log = open(tmp_path / "flower.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "--broker", settings_env["ONWARD_BROKER_URL"],
         "flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(base, "/healthcheck") == "OK", timeout=60,
                 what="Flower to answer", seen=lambda: (tmp_path / "flower.log").read_text())
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _get(base: str, path: str, **params: Any) -> Any:
    try:
        response = httpx.get(base + path, params=params, timeout=5)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return response.json() if "json" in response.headers.get("content-type", "") \
        else response.text


def _tasks_of(base: str, run_id: UUID, **params: Any) -> list[dict[str, Any]]:
    """Flower's tasks whose kwargs name this run, oldest received first."""
    tasks = _get(base, "/api/tasks", **params) or {}
    mine = [dict(t, uuid=u) for u, t in tasks.items() if str(run_id) in str(t.get("kwargs"))]
    return sorted(mine, key=lambda t: (t.get("received") or t.get("timestamp") or 0))


def _settled(tasks: list[dict[str, Any]], count: int) -> bool:
    return len(tasks) >= count and all(t["state"] in ("SUCCESS", "FAILURE") for t in tasks)


def test_flower__every_step_is_a_named_task(ledger: Ledger, cluster: Cluster,
                                            flower: str) -> None:
    """Invariant: a five-step run with eager continuation on (the default) shows in Flower
    as five tasks, named test_five.plan … test_five.publish in the order they ran, each
    SUCCESS, with kwargs naming the run, its seq and attempt 1; four of them ran eagerly
    (children of the delivered message) on the same worker. Filtering by name finds one.

    A run whose third step fails for good shows three tasks, the last FAILURE."""
    events = {"ONWARD_TASK_EVENTS": "true"}  # off by default; Flower needs them
    cluster.dispatcher(env=events)
    cluster.worker(concurrency=1, env=events)
    wait_for(lambda: _get(flower, "/api/workers", refresh="1"), timeout=60,
             what="Flower to see the worker")
    run_id = ledger.start_run("test_five", {})
    wait_for(lambda: ledger.get_run(run_id).status is RunStatus.COMPLETED, timeout=60,
             what="the run to complete")
    tasks = wait_for(lambda: (lambda t: t if _settled(t, 5) else None)(_tasks_of(flower, run_id)),
                     timeout=30, what="Flower to list the run's five tasks",
                     seen=lambda: _tasks_of(flower, run_id))
    assert [t["name"] for t in tasks] == [f"test_five.{s}" for s in STEPS]
    assert [t["state"] for t in tasks] == ["SUCCESS"] * 5
    for seq, task in enumerate(tasks):
        assert f"'seq': {seq}" in task["kwargs"] and "'attempt': 1" in task["kwargs"]
        assert task["received"] and task["started"] and task["succeeded"]
    delivered = tasks[0]["uuid"]
    eager = [t for t in tasks if t.get("parent_id") == delivered]
    assert len(eager) >= 1, "eager continuation should have run the next steps itself"
    assert len({t["worker"] for t in tasks}) == 1
    found = _tasks_of(flower, run_id, taskname="test_five.read")
    assert [t["name"] for t in found] == ["test_five.read"]

    failing = ledger.start_run("test_five", {"fail_at": "read"})
    wait_for(lambda: ledger.get_run(failing).status is RunStatus.FAILED, timeout=60,
             what="the failing run to fail")
    tasks = wait_for(lambda: (lambda t: t if _settled(t, 3) else None)(_tasks_of(flower,
                                                                                 failing)),
                     timeout=30, what="Flower to list the failing run's tasks",
                     seen=lambda: _tasks_of(flower, failing))
    assert [(t["name"], t["state"]) for t in tasks] == [
        ("test_five.plan", "SUCCESS"), ("test_five.search", "SUCCESS"),
        ("test_five.read", "FAILURE")]
