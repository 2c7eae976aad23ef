"""The pluggable model client. onward records each call as evidence; it never needs to know
which vendor is behind the client.

Adapters for the official SDKs: ``tasks.llm_openai.OpenAIChat`` (any OpenAI-compatible
endpoint: OpenAI, vLLM, Ollama, a LiteLLM proxy) and ``tasks.llm_anthropic.AnthropicMessages``.
Each keeps the vendor's whole response in ``LLMResponse.data["response"]`` and the tool calls,
in one vendor-neutral shape, in ``LLMResponse.tool_calls``: the evidence holds both, so a
re-executed step gets the same tool calls back without calling the model again.

``ctx.llm(..., stream=True)`` also publishes the text as it arrives to whoever subscribes to
the run (best effort, through the sink the worker configures: Redis pub/sub, see
workers/streams.py); the durable record is still the evidence, written once the whole answer
is in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from tasks import aio, deadline

__all__ = [
    "LLMClient",
    "LLMResponse",
    "StreamTo",
    "TokenSink",
    "call_model",
    "parse_arguments",
    "sdk_timeout",
    "set_token_sink",
]


@dataclass(frozen=True)
class LLMResponse:
    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # anything else the client returns

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls the model asked for: ``{"id", "name", "arguments"}`` each
        (``arguments`` a dict; the raw text under ``arguments_raw`` if it was not JSON)."""
        calls: list[dict[str, Any]] = self.data.get("tool_calls") or []
        return calls

    def as_record(self) -> dict[str, Any]:
        return {
            "text": self.text, "model": self.model, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "cost_usd": self.cost_usd, "data": self.data,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LLMResponse:
        return cls(
            text=record["text"], model=record["model"],
            input_tokens=int(record.get("input_tokens", 0)),
            output_tokens=int(record.get("output_tokens", 0)),
            cost_usd=float(record.get("cost_usd", 0.0)), data=record.get("data") or {},
        )


class LLMClient(Protocol):
    """Anything that can complete a chat: a vendor SDK wrapper, or a deterministic fake.

    A client may also offer ``stream(*, model, messages, on_text, **params) -> LLMResponse``,
    calling ``on_text(piece)`` as text arrives; ``ctx.llm(..., stream=True)`` uses it.

    A client may declare ``timeout_s`` (seconds): one call's time limit, which the client
    keeps to (its SDK's timeout). Before each call onward extends the step's lease to cover
    it (plus ``ONWARD_TOOL_LEASE_MARGIN_S``), unless the claim's lease covers the step's first
    call already; without it, ``ONWARD_MODEL_TIMEOUT_S`` is used (docs/effects.md, "Call
    timeouts and the lease").

    ``complete`` (and ``stream``) may be ``async def``: the call is then awaited on the
    worker's event loop, from plain and async steps alike (docs/steps.md)."""

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse | Awaitable[LLMResponse]: ...


class TokenSink(Protocol):
    """Where streamed text goes (the worker sets one: Redis pub/sub)."""

    def publish(self, run_id: UUID, seq: int, command_id: str, event: dict[str, Any]) -> None: ...


_sink: list[TokenSink] = []


def set_token_sink(sink: TokenSink | None) -> None:
    """Send streamed text to ``sink`` from now on in this process (None: nowhere)."""
    _sink[:] = [sink] if sink is not None else []


@dataclass(frozen=True)
class StreamTo:
    run_id: UUID
    seq: int
    command_id: str

    def publisher(self) -> Callable[[dict[str, Any]], None]:
        def publish(event: dict[str, Any]) -> None:
            for sink in _sink:
                with contextlib.suppress(Exception):  # best effort: never fails the step
                    sink.publish(self.run_id, self.seq, self.command_id, event)
        return publish


def sdk_timeout(timeout_s: float | None, client_options: dict[str, Any]) -> float | None:
    """The time limit an SDK adapter declares: ``timeout_s``, else the SDK client's
    ``timeout`` option when it is a number of seconds; with ``timeout_s`` and no such
    option, the option is set to it, so the SDK keeps to the limit onward covers."""
    given = client_options.get("timeout")
    if timeout_s is not None:
        client_options.setdefault("timeout", timeout_s)
        return timeout_s
    return float(given) if isinstance(given, int | float) else None


def call_model(client: LLMClient, *, model: str, messages: list[dict[str, Any]],
               params: dict[str, Any], stream_to: StreamTo | None) -> LLMResponse:
    """Call ``client``; with ``stream_to``, publish its text as it arrives (whole, at the
    end, for a client that cannot stream), then a ``done`` event."""
    with deadline.interruptible():  # the call is what a step's timeout may interrupt
        return _call_model(client, model, messages, params, stream_to)


def _call_model(client: LLMClient, model: str, messages: list[dict[str, Any]],
                params: dict[str, Any], stream_to: StreamTo | None) -> LLMResponse:
    # an async client's coroutine is awaited on the worker's event loop (tasks/aio.py)
    if stream_to is None:
        answer: LLMResponse = aio.resolve(client.complete(model=model, messages=messages,
                                                          **params))
        return answer
    publish = stream_to.publisher()
    stream = getattr(client, "stream", None)
    if stream is not None:
        response: LLMResponse = aio.resolve(stream(
            model=model, messages=messages, on_text=lambda piece: publish({"delta": piece}),
            **params))
    else:
        response = aio.resolve(client.complete(model=model, messages=messages, **params))
        publish({"delta": response.text})
    publish({"done": True, "model": response.model, "tool_calls": response.tool_calls})
    return response


def parse_arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict (models send JSON text; keep it when it is not)."""
    from ledger.json_input import read_json

    if isinstance(raw, dict):
        return {"arguments": raw}
    try:
        parsed = read_json(raw or "{}")
    except ValueError:
        return {"arguments": {}, "arguments_raw": raw}
    return {"arguments": parsed} if isinstance(parsed, dict) else \
        {"arguments": {}, "arguments_raw": raw}
