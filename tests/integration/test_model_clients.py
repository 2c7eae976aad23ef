"""Real model clients: ``ctx.llm`` through the official ``openai`` client to a real HTTP
model server (examples/model_server.py in a thread of the test: the outside world), executed
in-process by the test driver against the real ledger.

What a model said is evidence: the whole response (tool calls included) is recorded, a
step that runs again gets the same answer and the same tool calls without a second request,
and streamed text reaches subscribers while the record stays the evidence.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest
import redis

from ledger import Ledger, OnwardSettings
from tasks import faults
from tasks.llm import set_token_sink
from tests.support.clock import set_on_store
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver
from tests.support.model_server import ModelServer, model_server_in_thread
from workers.broker import broker_url
from workers.streams import RedisTokenSink, token_channel, tokens

MODULES = ["tests.workflows_models"]


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    with model_server_in_thread(latency_ms=20) as server:
        monkeypatch.setenv("ONWARD_MODEL_URL", server.url)
        yield server


@pytest.fixture()
def steps(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, MODULES) as running:
        yield running


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, run_id: UUID, seq: int, command_id: str, event: dict[str, Any]) -> None:
        self.events.append({"run_id": run_id, "seq": seq, **event})


def test_model_clients__tool_calls_are_recorded_and_given_back_on_reexecution(
        ledger: Ledger, steps: Driver, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step asks the model with a tool offered; the model answers with a tool
    call. The step then dies before its commit (fault before_checkpoint_commit@ask:raise,
    once, standing for a crash), its lease runs out (the driver's clock moves 60 s on) and
    it runs again: the model server saw ONE request for it, and the re-executed
    step got the same tool call (same id, name and arguments) from the evidence. The
    evidence keeps the SDK's whole response; the run completes with the text answer."""
    monkeypatch.setenv("ONWARD_FAULTS", "before_checkpoint_commit@ask:raise:once")
    faults.arm_from_env()
    try:
        run_id = ledger.start_run("test_tool_agent", {"question": "what is six times seven"})
        with pytest.raises(faults.InjectedFault):
            steps.step(run_id, 0)
        assert model.stats()["requests"] == 1
        set_on_store(steps.store, timedelta(seconds=60))  # the dead attempt's lease expired
        run = steps.drive(run_id)
    finally:
        monkeypatch.delenv("ONWARD_FAULTS")
        faults.arm_from_env()

    assert run.status == "completed"
    assert model.stats()["requests"] == 2  # one per step, none repeated
    calls = ledger.model_calls(run_id)
    assert [c.step for c in calls] == ["ask", "answer"]
    recorded = calls[0].response["data"]
    [tool_call] = recorded["tool_calls"]
    assert tool_call["name"] == "lookup"
    assert tool_call["arguments"]["query"] == "what is six times seven"
    whole = recorded["response"]["choices"][0]["message"]["tool_calls"][0]
    assert whole["id"] == tool_call["id"] and whole["function"]["name"] == "lookup"
    state_calls = ledger.checkpoint(run_id, 1).state["tool_calls"]  # type: ignore[union-attr]
    assert state_calls == [tool_call]  # what the step used is what was recorded
    assert calls[0].input_tokens > 0 and float(calls[0].cost_usd) > 0  # priced per token
    assert run.result is not None and run.result["answer"].endswith("42")


def test_model_clients__streamed_text_reaches_the_sink_and_the_record_is_whole(
        ledger: Ledger, steps: Driver, model: ModelServer) -> None:
    """With stream=True the server streams (server-sent events), the sink receives the
    pieces as they arrive, then a done event naming the tool calls; the pieces joined are
    exactly the recorded text, and the record has the non-streamed shape, usage included."""
    sink = ListSink()
    set_token_sink(sink)
    try:
        run_id = ledger.start_run("test_tool_agent", {"question": "stream this please",
                                                      "stream": True})
        run = steps.drive(run_id)
    finally:
        set_token_sink(None)

    assert run.status == "completed"
    assert model.stats()["streams"] == 2
    done = [e for e in sink.events if e.get("done")]
    assert [e["seq"] for e in done] == [0, 1]
    assert done[0]["tool_calls"][0]["name"] == "lookup"
    text = "".join(e.get("delta", "") for e in sink.events if e["seq"] == 1)
    calls = ledger.model_calls(run_id)
    assert text == calls[1].response["text"] == run.result["answer"]  # type: ignore[index]
    assert len([e for e in sink.events if e["seq"] == 1 and e.get("delta")]) > 1
    assert calls[1].response["data"]["response"]["usage"]["completion_tokens"] > 0


def test_model_clients__stream_subscribers_get_tokens_through_redis(
        settings: OnwardSettings, ledger: Ledger, steps: Driver, model: ModelServer) -> None:
    """The worker's Redis sink publishes to the run's channel; a subscriber listening
    before the step (workers.streams.tokens) receives the pieces and the done event."""
    run_id = ledger.start_run("test_tool_agent", {"question": "over redis", "stream": True})
    received: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: received.extend(tokens(settings, run_id,
                                                                    timeout=20)))
    thread.start()
    broker = redis.Redis.from_url(broker_url(settings))
    wait_for(lambda: dict(broker.pubsub_numsub(token_channel(run_id)))[
        token_channel(run_id).encode()] == 1, timeout=10, what="the subscriber to listen")
    set_token_sink(RedisTokenSink(broker_url(settings)))
    try:
        steps.step(run_id, 0)
    finally:
        set_token_sink(None)
    thread.join(30)
    broker.close()

    assert received and received[-1]["done"] is True
    assert all(e["run_id"] == str(run_id) and e["seq"] == 0 for e in received)


def test_model_server__429_above_its_concurrency_and_rate() -> None:
    """Twelve requests at once against a server holding 2 s with a concurrency limit of 4:
    never more than 4 are held at once, the others are answered 429 with Retry-After in
    the OpenAI error shape, and the server counts each (and how late beyond its latency it
    answered the others). Then, with a rate of 5/s and no
    hold, twelve requests at once: no more are admitted than 5 per second they took."""
    with model_server_in_thread(latency_ms=2000, jitter=0, max_concurrency=4) as server:
        results = _burst(server, 12)
        refused = [r for r in results if r.status_code == 429]
        stats = server.stats()
        assert sorted({r.status_code for r in results}) == [200, 429]
        assert stats["max_inflight"] <= 4
        assert stats["rejected_429"] == len(refused) and stats["completed"] == 12 - len(refused)
        assert refused[0].headers["retry-after"] == "1"
        # what it took beyond its latency to answer (bench/agents.py reports it beside the
        # overhead): counted for the answered requests, not the 2 s hold itself
        assert -1 < stats["late_p50_ms"] <= stats["late_max_ms"] < 1000
        assert json.loads(refused[0].text)["error"]["type"] == "rate_limit_error"

        server.configure(max_concurrency=0, rate_per_s=5, latency_ms=0)
        began = time.monotonic()
        quick = _burst(server, 12)
        window = math.ceil(time.monotonic() - began)
        assert sum(r.status_code == 200 for r in quick) <= 5 * window
        assert any(r.status_code == 429 for r in quick) or window > 2


def _burst(server: ModelServer, count: int) -> list[httpx.Response]:
    """``count`` chat completions sent at the same moment (a barrier), their responses."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    gate = threading.Barrier(count)
    results: list[httpx.Response] = []

    def call() -> None:
        with httpx.Client(timeout=20) as http:
            gate.wait()
            results.append(http.post(f"{server.url}/chat/completions", json=body))

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_model_clients__anthropic_adapter_gives_the_same_shapes() -> None:
    """The anthropic adapter over the official client (the model server speaks the
    Messages API too): tool_use blocks become the same {"id", "name", "arguments"} tool
    calls the openai adapter gives, streamed text joins into the recorded text, and the
    whole message is kept with its usage."""
    from tasks.llm_anthropic import AnthropicMessages
    from tasks.llm_openai import OpenAIChat

    with model_server_in_thread(latency_ms=10) as server:
        claude = AnthropicMessages(base_url=server.url.removesuffix("/v1"), api_key="test",
                                   max_retries=0)
        gpt = OpenAIChat(base_url=server.url, api_key="test", max_retries=0)
        ask = [{"role": "user", "content": "find the answer"}]
        used = claude.complete(model="claude-test", messages=ask,
                               tools=[{"name": "lookup", "input_schema": {"type": "object"}}])
        same = gpt.complete(model="claude-test", messages=ask, tools=[{
            "type": "function", "function": {"name": "lookup", "parameters": {}}}])
        pieces: list[str] = []
        streamed = claude.stream(model="claude-test", messages=[
            {"role": "user", "content": "tell me a longer story please"}], on_text=pieces.append)

    [call] = used.tool_calls
    assert (call["name"], call["arguments"]) == (same.tool_calls[0]["name"],
                                                  same.tool_calls[0]["arguments"])
    assert used.data["response"]["content"][0]["type"] == "tool_use"
    assert used.input_tokens > 0 and used.output_tokens > 0
    assert len(pieces) > 1 and "".join(pieces) == streamed.text
    assert streamed.data["response"]["stop_reason"] == "end_turn"
