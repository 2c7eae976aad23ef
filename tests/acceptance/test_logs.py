"""With ONWARD_LOG_JSON=1 every line every onward process writes is one JSON object:
onward's own lines, Celery's and kombu's, Python warnings, tracebacks and what step code
prints; lines about a step carry its run id and seq (and attempt where onward knows it)."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from ledger import Ledger, RunStatus
from tests.support.cluster import Cluster, Proc, wait_for

pytestmark = pytest.mark.acceptance

JSON_ENV = {"ONWARD_LOG_JSON": "1", "ONWARD_LOG_LEVEL": "DEBUG"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _objects(proc: Proc) -> list[dict[str, Any]]:
    """Every line of the process's output as JSON; fails naming the first line that is not."""
    objects = []
    for number, text in enumerate(proc.log().splitlines(), 1):
        try:
            value = json.loads(text)
        except ValueError:
            raise AssertionError(f"{proc.name} line {number} is not JSON: {text!r}") from None
        assert isinstance(value, dict), f"{proc.name} line {number}: {text!r}"
        assert {"event", "level", "timestamp"} <= set(value), text
        objects.append(value)
    return objects


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def test_logs__every_line_of_every_process_is_json(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: the worker, dispatcher, reaper, metrics exporter and web console, started
    with ONWARD_LOG_JSON=1 and stopped, wrote nothing but JSON objects, one per line; the
    worker's include Celery's own lines, the step's printed text and the failure, each
    bound to its run and seq; onward's step lines also carry the attempt."""
    worker = cluster.worker(concurrency=1, env=JSON_ENV)
    dispatcher = cluster.dispatcher(env=JSON_ENV)
    reaper = cluster.reaper(env=JSON_ENV)
    metrics_port, console_port = _free_port(), _free_port()
    metrics = cluster.command("metrics", ["metrics", "--port", str(metrics_port)], JSON_ENV)
    web = cluster.command("console", ["console", "--port", str(console_port)], JSON_ENV)
    good = ledger.start_run("test_five", {"shout": True})
    bad = ledger.start_run("test_five", {"fail_at": "search"})
    wait_for(lambda: ledger.get_run(good).status is RunStatus.COMPLETED
             and ledger.get_run(bad).status is RunStatus.FAILED, timeout=60,
             what="one run to complete and one to fail")
    wait_for(lambda: _answers(f"http://127.0.0.1:{metrics_port}/metrics"), timeout=30,
             what="the exporter", seen=metrics.log)
    wait_for(lambda: _answers(f"http://127.0.0.1:{console_port}/api/v1/runs"), timeout=30,
             what="the console", seen=web.log)
    cluster.stop_all()

    lines = _objects(worker)
    assert len(lines) >= 20
    celery = [o for o in lines if str(o.get("logger", "")).startswith("celery")]
    assert any("ready." in o["event"] for o in celery)
    assert any("succeeded" in o["event"] and o.get("run_id") == str(good) for o in celery)
    printed = [o for o in lines if "says hello" in o["event"]]
    assert len(printed) == 5 and all(o["run_id"] == str(good) for o in printed)
    assert sorted(o["seq"] for o in printed) == [0, 1, 2, 3, 4]
    failed = [o for o in lines if o["event"].startswith("step failed; run fail")]
    assert [(o["run_id"], o["seq"], o["attempt"]) for o in failed] == [(str(bad), 1, 1)]
    assert any(o["event"] == "worker starting" for o in lines)
    for proc in (dispatcher, reaper, metrics, web):
        assert _objects(proc), f"{proc.name} wrote nothing"
