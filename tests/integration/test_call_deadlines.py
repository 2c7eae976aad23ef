"""A provider call's time limit is a total deadline (review F20): the reference client keeps
to it whatever the provider does, and onward defends against a tool that does not. Real
PostgreSQL; two workers as threads with their own connections and a 1 s lease; the outside
world an in-process provider (tests/workflows_outcomes.OUTSIDE) or a small HTTP server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID

import httpx
import pytest

from examples import provider_client
from ledger import Ledger, RunStatus
from ledger.effects import ANSWER_AFTER_LEASE
from ledger.steps import StepStore
from ledger.vocabulary import Role
from tasks.executor import ExecutorConfig, StepMessage, execute_step
from tasks.workflow import Registry
from tests.support.cluster import wait_for
from tests.support.driver import driver
from tests.workflows_outcomes import OUTSIDE

MODULES = ["tests.workflows_outcomes"]


class Dribbling:
    """An HTTP provider whose first create answers its first 20 bytes one every 0.3 s (6 s),
    and which makes an object real only once its answer is fully written (it commits at
    the end: a client that gives up first leaves nothing). Later creates answer at once."""

    def __init__(self) -> None:
        self.committed: list[str] = []  # keys of the objects the provider holds
        self.requests = 0
        self.lock = threading.Lock()


def _handler(provider: Dribbling) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # /v1/<collection>/by-key/<key>
            key = self.path.rsplit("/", 1)[-1]
            with provider.lock:
                found = key in provider.committed
            self._answer(200 if found else 404, {"id": f"pay_{key[:8]}"} if found else {})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            key = self.headers.get("Idempotency-Key", "")
            with provider.lock:
                provider.requests += 1
                slow = provider.requests == 1
            self._answer(201, {"id": f"pay_{key[:8]}", "key": key}, slow=slow, key=key)

        def _answer(self, status: int, body: dict[str, Any], *, slow: bool = False,
                    key: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for i in range(20 if slow else 0):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.3)
                self.wfile.write(data[20:] if slow else data)
                self.wfile.flush()
            except OSError:
                return  # the client went away: nothing is committed
            if key is not None:
                with provider.lock:
                    provider.committed.append(key)

    return Handler


@pytest.fixture()
def dribbling(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dribbling]:
    provider = Dribbling()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("ONWARD_EXAMPLE_PROVIDER_URL", f"http://127.0.0.1:{server.server_port}")
    yield provider
    server.shutdown()
    server.server_close()


def test_reference_client__timeout_is_a_total_deadline(dribbling: Dribbling) -> None:
    """Invariant (docs/effects.md, the contract an integrator fulfils): a tool's callable
    gives up by its ``timeout`` in total. The provider answers a byte every 0.3 s (each
    read well within any per-read timeout); the reference client gives up after 1 s, not
    when the answer is complete (~6 s)."""
    started = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        provider_client.create("payments", {"amount": 1}, "k" * 64, timeout=1.0)
    took = time.monotonic() - started
    assert took < 1.5, f"the call took {took:.1f}s with a 1 s time limit"
    assert dribbling.committed == []  # it gave up before the provider committed
    assert provider_client.find_by_key("payments", "k" * 64, timeout=1.0) is None


def _two_workers(ledger: Ledger, run_id: UUID) -> dict[str, str]:
    """Worker a executes the run's first step; worker b tries it once a's lease (1 s,
    extended over the call's 1 s limit and a 0.5 s margin when a begins its call) has
    expired or been given back, read from the ledger by the ledger's clock (a fixed pause
    would be too long on a quiet machine and too short on a busy one). Returns each
    worker's report."""
    registry = Registry()
    registry.load_modules(MODULES)
    config = ExecutorConfig(keys=ledger.keys, max_state_bytes=1_000_000, retry_base_s=0.0,
                            retry_max_s=0.0, tool_timeout_s=1.0, tool_lease_margin_s=0.5)
    stores = [StepStore(ledger.url, ledger.keys, lease_ttl_s=1.0) for _ in range(2)]
    reports: dict[str, str] = {}

    def work(name: str, store: StepStore) -> None:
        reports[name] = execute_step(store, registry, config, StepMessage(run_id=run_id, seq=0),
                                     worker=name, publish=lambda *a: None).kind.value

    first = threading.Thread(target=work, args=("a", stores[0]))
    try:
        first.start()
        _wait_for_the_lease_to_lapse(ledger, run_id)
        work("b", stores[1])
        first.join(timeout=30)
    finally:
        for store in stores:
            store.close()
    return reports


def _wait_for_the_lease_to_lapse(ledger: Ledger, run_id: UUID) -> None:
    """Until the first holder has begun its call (which extends its lease over the call's
    time limit, and nothing extends it further), then until that lease has ended by the
    ledger's clock, or the holder gave the step back."""
    def call_begun() -> bool:
        return any(ledger.effect_attempts(effect) for effect in ledger.effects(run_id))

    def lease_lapsed() -> bool:
        run = ledger.get_run(run_id)
        assert run is not None
        return run.lease_expires_at is None or run.lease_expires_at <= ledger.now()

    wait_for(call_begun, timeout=30, what="the first holder's call", interval=0.01)
    wait_for(lease_lapsed, timeout=30, what="the first holder's lease to end", interval=0.01)


def test_call_overrunning_its_time_limit__the_next_holder_does_not_send_again(
        ledger: Ledger) -> None:
    """Invariant (design 13.2 and 13.4; review F20): a tool that does not keep to its time
    limit (its call takes 4 s with a 1 s limit) outlives the lease onward covered it with;
    its worker marks it as overrunning before that lease ends, so the next holder does not
    trust a lookup made while the request may still land: it parks the run instead of
    sending again. The late answer is recorded on its attempt as ``unknown`` (never as the
    effect's outcome); once a person continues the run, the lookup finds the object.
    One object."""
    OUTSIDE.reset()
    ops = ledger.acting_as("olga", Role.OPERATOR)
    run_id = ledger.start_run("test_outcome_send", {"tool": "overrun"})
    reports = _two_workers(ledger, run_id)
    assert OUTSIDE.count() == 1, reports
    assert reports == {"a": "lease_lost", "b": "parked"}
    run = ops.get_run(run_id)
    assert run.parked_reason == "effect_outcome_unknown"
    [effect] = ops.effects(run_id)
    [call] = ops.effect_attempts(effect)
    assert (call.kind, call.outcome, call.provider_ref) == ("call", "unknown", "obj_1")
    assert call.error is not None and call.error["type"] == ANSWER_AFTER_LEASE
    ops.continue_run(run_id, "the slow call has ended; look it up")
    with driver(ops, MODULES) as drv:
        done = drv.drive(run_id)
    assert done.status is RunStatus.COMPLETED, done.last_error
    assert done.result == {"sent": "obj_1"}
    assert OUTSIDE.count() == 1
    assert ops.verify_run(run_id) == []
    OUTSIDE.reset()


def test_reference_client_on_a_slow_provider__one_object(
        ledger: Ledger, dribbling: Dribbling) -> None:
    """Invariant (review F20, end to end): with the reference client, a provider that
    answers slowly but steadily never keeps a call alive past its lease: the call gives up
    at its 1 s limit (the provider, which commits at the end, keeps nothing), the step is
    retried and sends once more with the same key. One object at the provider."""
    run_id = ledger.start_run("test_outcome_slow_http", {})
    reports = _two_workers(ledger, run_id)
    run = ledger.get_run(run_id)
    assert len(dribbling.committed) == 1, (reports, dribbling.committed)
    assert run.status is RunStatus.COMPLETED, (reports, run.last_error)
