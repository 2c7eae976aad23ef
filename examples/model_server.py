"""A model server standing for an LLM API: OpenAI chat completions over real HTTP, on loopback.

    python -m examples.model_server --port 0 --port-file /tmp/model.port --latency-ms 500

Each request is held for the configured latency (default 500 ms, ±20 % jitter drawn from
the request itself, so the same request waits as long every time), then answered with a
deterministic completion: the same messages give the same text, and a request that offers
``tools`` and carries no tool result yet gets the same tool call. Above the configured
concurrency (requests held at once) or rate (requests admitted per second), it answers 429
with ``Retry-After``, as OpenAI and Anthropic do. It counts what it saw.

API (OpenAI-compatible where it matters: the official ``openai`` client works unchanged)
  POST /v1/chat/completions     {"model", "messages", "tools"?, "stream"?, ...}; with
                                "stream": true, server-sent events ending "data: [DONE]"
  POST /v1/messages             the same answers in Anthropic's Messages format (streaming
                                included), for the ``anthropic`` client
  GET  /v1/models               the one model it serves, whatever name is asked
  GET  /admin/stats             requests, completed, rejected_429, inflight, max_inflight,
                                inflight_avg (time-weighted over the busy time), streams,
                                late_p50_ms / late_max_ms (how much longer than its latency
                                the server took to answer: its own lag), limits
  POST /admin/config            {"latency_ms", "jitter", "max_concurrency", "rate_per_s"}
                                (0 means no limit), "salt" (mixed into every answer)
  POST /admin/reset             zero the counters
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

Scope = dict[str, Any]
Send = Any
Receive = Any


@dataclass
class Limits:
    latency_ms: float = 500.0
    jitter: float = 0.2  # the hold is latency * (1 ± jitter)
    max_concurrency: int = 0  # requests held at once; 0: no limit
    rate_per_s: float = 0.0  # requests admitted per second (sliding 1 s window); 0: none
    # mixed into every answer: a test sets another to tell a later call's answer from an
    # earlier one's (a retried step must use what was recorded, not ask again)
    salt: str = ""


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    rejected_429: int = 0
    streams: int = 0
    tool_calls: int = 0
    inflight: int = 0
    max_inflight: int = 0
    busy_s: float = 0.0  # time with at least one request held
    inflight_area: float = 0.0  # integral of inflight over time
    _since: float = field(default_factory=time.monotonic, repr=False)
    # per answered request: how much longer than its latency the server took to answer it
    # (its event loop's lag, parsing, sending): part of what a client sees as the model
    _late_ms: list[float] = field(default_factory=list, repr=False)

    def moved(self, delta: int) -> None:
        """Account for the time at the current in-flight level, then change it."""
        now = time.monotonic()
        if self.inflight > 0:
            self.busy_s += now - self._since
            self.inflight_area += self.inflight * (now - self._since)
        self._since = now
        self.inflight += delta
        self.max_inflight = max(self.max_inflight, self.inflight)

    def report(self) -> dict[str, Any]:
        public = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        public["inflight_avg"] = round(self.inflight_area / self.busy_s, 2) if self.busy_s else 0
        late = sorted(self._late_ms)
        public["late_p50_ms"] = round(late[(len(late) - 1) // 2], 2) if late else None
        public["late_max_ms"] = round(late[-1], 2) if late else None
        return public


class ModelServer:
    """The ASGI application (run by uvicorn)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.stats = Stats()
        self.admitted: deque[float] = deque()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        route = (scope["method"], scope["path"].rstrip("/"))
        if route == ("POST", "/v1/chat/completions"):
            await self.complete(body, send)
        elif route == ("POST", "/v1/messages"):
            await self.complete(body, send, anthropic=True)
        elif route == ("GET", "/v1/models"):
            await _json(send, 200, {"object": "list", "data": [{"id": "onward-echo-1",
                                                                 "object": "model"}]})
        elif route == ("GET", "/admin/stats"):
            await _json(send, 200, {**self.stats.report(), "limits": asdict(self.limits)})
        elif route == ("POST", "/admin/config"):
            for name, value in json.loads(body or b"{}").items():
                setattr(self.limits, name, type(getattr(self.limits, name))(value))
            await _json(send, 200, asdict(self.limits))
        elif route == ("POST", "/admin/reset"):
            self.stats, self.admitted = Stats(), deque()
            await _json(send, 200, {"reset": True})
        else:
            await _json(send, 404, {"error": {"message": f"no route {route}"}})

    def _refusal(self) -> str | None:
        limits, now = self.limits, time.monotonic()
        while self.admitted and now - self.admitted[0] >= 1.0:
            self.admitted.popleft()
        if limits.max_concurrency and self.stats.inflight >= limits.max_concurrency:
            return f"concurrency limit of {limits.max_concurrency} requests reached"
        if limits.rate_per_s and len(self.admitted) >= limits.rate_per_s:
            return f"rate limit of {limits.rate_per_s:g} requests per second reached"
        self.admitted.append(now)
        return None

    async def complete(self, body: bytes, send: Send, *, anthropic: bool = False) -> None:
        began = time.monotonic()
        self.stats.requests += 1
        try:
            request = json.loads(body)
            messages = request["messages"]
        except (ValueError, KeyError, TypeError):
            await _json(send, 400, {"error": {"message": "body must be JSON with messages",
                                              "type": "invalid_request_error"}})
            return
        refused = self._refusal()
        if refused is not None:
            self.stats.rejected_429 += 1
            await _json(send, 429, {"error": {"message": refused, "type": "rate_limit_error",
                                              "code": "rate_limit_exceeded"}},
                        headers=[(b"retry-after", b"1")])
            return
        self.stats.moved(+1)
        try:
            if anthropic:
                messages, tools = _from_anthropic(messages, request.get("tools"))
            else:
                tools = request.get("tools")
            answer = answer_for(request.get("model", "model"), messages, tools,
                                salt=self.limits.salt)
            hold = self._hold_s(answer["id"])
            await asyncio.sleep(hold)
            self.stats.streams += bool(request.get("stream"))
            if anthropic:
                await _send_anthropic(send, to_anthropic(answer), bool(request.get("stream")))
            elif request.get("stream"):
                await _stream(send, answer)
            else:
                await _json(send, 200, answer)
            self.stats.completed += 1
            self.stats._late_ms.append(1000 * (time.monotonic() - began - hold))
            self.stats.tool_calls += bool(answer["choices"][0]["message"].get("tool_calls"))
        finally:
            self.stats.moved(-1)

    def _hold_s(self, answer_id: str) -> float:
        return hold_s(answer_id, self.limits.latency_ms, self.limits.jitter)


def hold_s(answer_id: str, latency_ms: float, jitter: float) -> float:
    """How long the server holds the request whose answer has ``answer_id`` (deterministic:
    a benchmark can subtract exactly the model's latency from a step's duration)."""
    spread = (int(answer_id[-4:], 16) / 0xFFFF) * 2 - 1  # in [-1, 1], from the request
    return max(0.0, latency_ms * (1 + jitter * spread) / 1000)


def answer_for(model: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None, *, salt: str = "") -> dict[str, Any]:
    """The deterministic chat completion for this request (and the server's ``salt``)."""
    prompt = json.dumps(messages, sort_keys=True)
    digest = hashlib.sha256(f"{model}|{prompt}|{bool(tools)}{salt}".encode()).hexdigest()
    last = str(messages[-1].get("content", "")) if messages else ""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tools and not any(m.get("role") == "tool" for m in messages):
        name = tools[0].get("function", {}).get("name", "tool")
        message["tool_calls"] = [{"id": f"call_{digest[:12]}", "type": "function", "function": {
            "name": name, "arguments": json.dumps({"query": last[:60], "ref": digest[:8]})}}]
        finish = "tool_calls"
    else:
        message["content"] = f"[{digest[:8]}] {last[:120]}".strip()
        finish = "stop"
    prompt_tokens = max(1, len(prompt) // 4)
    completion_tokens = max(1, len(json.dumps(message)) // 4)
    return {
        "id": f"chatcmpl-{digest[:24]}", "object": "chat.completion", "created": 1_700_000_000,
        "model": f"{model}-echo-1", "system_fingerprint": "onward-model-server",
        "choices": [{"index": 0, "message": message, "finish_reason": finish,
                     "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def stream_chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer as OpenAI streams it: a role chunk, content pieces or the tool call, a
    finish chunk, then a usage chunk with no choices."""
    base = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    choice = answer["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                     "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    for call_index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": call_index, **call}]}))
    text = message.get("content") or ""
    chunks += [chunk({"content": text[i:i + 8]}) for i in range(0, len(text), 8)]
    chunks.append(chunk({}, choice["finish_reason"]))
    chunks.append({**base, "choices": [], "usage": answer["usage"]})
    return chunks


async def _stream(send: Send, answer: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    for piece in stream_chunks(answer):
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"data: {json.dumps(piece)}\n\n".encode()})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _from_anthropic(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """An Anthropic Messages request in the chat-completions terms ``answer_for`` takes."""
    plain: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            if any(block.get("type") == "tool_result" for block in content):
                plain.append({"role": "tool", "content": json.dumps(content)})
                continue
            content = "".join(block.get("text", "") for block in content)
        plain.append({"role": message.get("role"), "content": content})
    offered = [{"function": {"name": tool.get("name")}} for tool in tools or []]
    return plain, offered or None


def to_anthropic(answer: dict[str, Any]) -> dict[str, Any]:
    """The same answer as an Anthropic ``message``."""
    message = answer["choices"][0]["message"]
    blocks: list[dict[str, Any]] = [
        {"type": "tool_use", "id": "toolu_" + call["id"][5:], "name": call["function"]["name"],
         "input": json.loads(call["function"]["arguments"])}
        for call in message.get("tool_calls") or []]
    if message.get("content"):
        blocks.insert(0, {"type": "text", "text": message["content"]})
    usage = answer["usage"]
    return {"id": "msg_" + answer["id"][9:], "type": "message", "role": "assistant",
            "model": answer["model"], "content": blocks,
            "stop_reason": "tool_use" if message.get("tool_calls") else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": usage["prompt_tokens"],
                                             "output_tokens": usage["completion_tokens"]}}


async def _send_anthropic(send: Send, message: dict[str, Any], stream: bool) -> None:
    if not stream:
        await _json(send, 200, message)
        return
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": {
        **message, "content": [], "stop_reason": None,
        "usage": {**message["usage"], "output_tokens": 0}}})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(("content_block_start", {"index": index, "content_block": {
                "type": "text", "text": ""}}))
            events += [("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": block["text"][i:i + 8]}})
                for i in range(0, len(block["text"]), 8)]
        else:
            events.append(("content_block_start", {"index": index, "content_block": {
                **block, "input": {}}}))
            events.append(("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        events.append(("content_block_stop", {"index": index}))
    spent = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"delta": {"stop_reason": message["stop_reason"],
                                               "stop_sequence": None}, "usage": spent}))
    events.append(("message_stop", {}))
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    for name, data in events:
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"
                    .encode()})
    await send({"type": "http.response.body", "body": b""})


async def _json(send: Send, status: int, payload: Any,
                headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def listening_socket(port: int) -> socket.socket:
    """A socket on 127.0.0.1 bound to ``port`` (a free one when 0), listening.

    Its connections send without Nagle's delay (``TCP_NODELAY``, which Linux copies from the
    listening socket to each accepted one), as an LLM API's front end does: uvicorn writes
    a response's headers and its body separately, and with Nagle's algorithm on, the body
    waited for the client's delayed acknowledgement of the headers, about 40 ms on every
    answer after the first on a kept-alive connection, which ``bench/agents.py`` counted as
    the worker's overhead."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    return sock


def uvicorn_server(app: ModelServer, **config: Any) -> uvicorn.Server:
    """The uvicorn server that runs ``app`` (``config``: more ``uvicorn.Config`` options)."""
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                         backlog=2048, timeout_keep_alive=30, lifespan="on",
                                         **config))


def serve(limits: Limits, port: int, port_file: Path | None) -> None:
    """Run on 127.0.0.1 (a free port when 0), writing the port to ``port_file`` once bound."""
    sock = listening_socket(port)
    bound = sock.getsockname()[1]
    if port_file is not None:
        port_file.write_text(str(bound))
    print(f"model server on http://127.0.0.1:{bound}/v1", flush=True)
    uvicorn_server(ModelServer(limits)).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--jitter", type=float, default=0.2)
    parser.add_argument("--max-concurrency", type=int, default=0, help="0: no limit")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: no limit")
    args = parser.parse_args()
    serve(Limits(args.latency_ms, args.jitter, args.max_concurrency, args.rate), args.port,
          args.port_file)


if __name__ == "__main__":
    main()
