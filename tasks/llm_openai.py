"""``ctx.llm`` through the official ``openai`` client (``pip install 'onward[openai]'``).

Works with any OpenAI-compatible chat-completions endpoint (OpenAI, Azure OpenAI, vLLM,
Ollama, a LiteLLM proxy, examples/model_server.py): pass ``base_url`` and ``api_key`` or a
client of your own. The evidence keeps the whole response as the SDK returned it
(``data["response"]``, tool calls included); ``LLMResponse.tool_calls`` lists them as
``{"id", "name", "arguments"}``. The SDK's own retries are the caller's choice
(``max_retries``, default 2, as in the SDK); each retry is inside one ``ctx.llm`` call, and
only the answer that came back is recorded.

``clients=N`` spreads calls over N SDK clients, each with its own connection pool: httpx's
pool goes over every one of its connections when a request starts and when a response is
closed, so with hundreds of calls in flight through one client that bookkeeping costs more
CPU than the call itself (a fifth of an async worker's CPU at 200 calls in flight, measured
by bench/agents.py). About one client per 50 concurrent calls keeps it small.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from tasks.limits import Limit
from tasks.llm import LLMResponse, parse_arguments, sdk_timeout
from tasks.retry import RetryPolicy

__all__ = ["AsyncOpenAIChat", "OpenAIChat", "Prices", "price_of"]


Prices = dict[str, tuple[float, float]]
"""USD per million input and output tokens, by the model name the response reports (or a
prefix of it); a model not listed costs 0."""


def price_of(prices: Prices, model: str, input_tokens: int, output_tokens: int) -> float:
    for name, (per_in, per_out) in prices.items():
        if model.startswith(name):
            return (input_tokens * per_in + output_tokens * per_out) / 1_000_000
    return 0.0


class OpenAIChat:
    """An ``LLMClient`` over ``openai.OpenAI().chat.completions``."""

    def __init__(self, client: Any = None, *, prices: Prices | None = None,
                 timeout_s: float | None = None, limits: Sequence[Limit] = (),
                 retry: RetryPolicy | None = None, clients: int = 1,
                 **client_options: Any) -> None:
        """``timeout_s``: one call's time limit, covered by the step's lease (given to the SDK
        as ``timeout`` when this builds the client; a ``timeout=`` number is read as it).
        ``limits``: fleet-wide limits on its calls; ``retry``: how failed calls are retried
        (default: as reads; docs/limits.md). Pass ``max_retries=0`` to leave retries to
        onward, which defers them without holding a worker. ``clients``: how many SDK
        clients calls are spread over (see the module doc; not with ``client``)."""
        self.timeout_s = sdk_timeout(timeout_s, client_options)
        self.limits = tuple(limits)
        self.retry = retry
        _check_clients(clients, client)
        if client is None:
            try:
                import openai
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ImportError("OpenAIChat needs the openai package: "
                                  "pip install 'onward[openai]'") from exc
            self._sdks = tuple(openai.OpenAI(**client_options) for _ in range(clients))
            for sdk in self._sdks:  # the SDK imports its resources on first access: here,
                sdk.chat.completions  # noqa: B018 - not in a step's first call (~30 ms)
        else:
            self._sdks = (client,)
        self.client = self._sdks[0]
        self._turn = itertools.count()
        self.prices = prices or {}

    def _sdk(self) -> Any:
        """The SDK client for the next call (in turn, when there are several)."""
        sdks = self._sdks
        return sdks[0] if len(sdks) == 1 else sdks[next(self._turn) % len(sdks)]

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        answer = self._sdk().chat.completions.create(model=model, messages=messages, **params)
        return self._response(answer.model_dump(mode="json", exclude_unset=False))

    def stream(self, *, model: str, messages: list[dict[str, Any]],
               on_text: Callable[[str], None], **params: Any) -> LLMResponse:
        """Stream the answer (``on_text`` per piece); the record is the assembled answer in
        the non-streamed shape, usage included."""
        options = {**params, "stream": True,
                   "stream_options": {**params.get("stream_options", {}), "include_usage": True}}
        assembled = _Assembler()
        for chunk in self._sdk().chat.completions.create(model=model, messages=messages,
                                                         **options):
            piece = assembled.add(chunk.model_dump(mode="json"))
            if piece:
                on_text(piece)
        return self._response(assembled.response())

    def _response(self, raw: dict[str, Any]) -> LLMResponse:
        return _response(self.prices, raw)


class AsyncOpenAIChat:
    """An ``LLMClient`` over ``openai.AsyncOpenAI().chat.completions``: its calls are
    awaited on the worker's event loop (from plain and ``async def`` steps alike), so a
    step waiting for the model holds no thread (docs/steps.md, "Async steps")."""

    def __init__(self, client: Any = None, *, prices: Prices | None = None,
                 timeout_s: float | None = None, clients: int = 1,
                 **client_options: Any) -> None:
        """As ``OpenAIChat``; the SDK clients are built on first use, on the loop that uses
        them (``clients`` of them per loop)."""
        _check_clients(clients, client)
        self.timeout_s = sdk_timeout(timeout_s, client_options)
        self._options = client_options
        self._count = clients
        self._clients: dict[int, tuple[Any, ...]] = {}
        self._turn = itertools.count()
        self._given = client
        self.prices = prices or {}

    def _client(self) -> Any:
        if self._given is not None:
            return self._given
        import asyncio

        loop = id(asyncio.get_running_loop())  # an SDK client's connections are the loop's
        sdks = self._clients.get(loop)
        if sdks is None:
            try:
                import openai
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ImportError("AsyncOpenAIChat needs the openai package: "
                                  "pip install 'onward[openai]'") from exc
            sdks = self._clients[loop] = tuple(openai.AsyncOpenAI(**self._options)
                                               for _ in range(self._count))
        return sdks[0] if len(sdks) == 1 else sdks[next(self._turn) % len(sdks)]

    async def complete(self, *, model: str, messages: list[dict[str, Any]],
                       **params: Any) -> LLMResponse:
        answer = await self._client().chat.completions.create(model=model, messages=messages,
                                                              **params)
        return _response(self.prices, answer.model_dump(mode="json", exclude_unset=False))

    async def stream(self, *, model: str, messages: list[dict[str, Any]],
                     on_text: Callable[[str], None], **params: Any) -> LLMResponse:
        """``OpenAIChat.stream``, awaited."""
        options = {**params, "stream": True,
                   "stream_options": {**params.get("stream_options", {}), "include_usage": True}}
        assembled = _Assembler()
        chunks = await self._client().chat.completions.create(model=model, messages=messages,
                                                              **options)
        async for chunk in chunks:
            piece = assembled.add(chunk.model_dump(mode="json"))
            if piece:
                on_text(piece)
        return _response(self.prices, assembled.response())


def _check_clients(clients: int, client: Any) -> None:
    if clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    if client is not None and clients != 1:
        raise ValueError("clients=N builds N SDK clients itself: pass client= or clients=, "
                         "not both")


def _response(prices: Prices, raw: dict[str, Any]) -> LLMResponse:
    """A chat completion (as JSON) as the evidence keeps it."""
    choice = (raw.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    usage = raw.get("usage") or {}
    tokens_in = int(usage.get("prompt_tokens") or 0)
    tokens_out = int(usage.get("completion_tokens") or 0)
    calls = [{"id": call.get("id"), "name": (call.get("function") or {}).get("name"),
              **parse_arguments((call.get("function") or {}).get("arguments"))}
             for call in message.get("tool_calls") or []]
    model = str(raw.get("model") or "")
    return LLMResponse(
        text=message.get("content") or "", model=model, input_tokens=tokens_in,
        output_tokens=tokens_out, cost_usd=price_of(prices, model, tokens_in, tokens_out),
        data={"response": raw, "tool_calls": calls,
              "finish_reason": choice.get("finish_reason")})


class _Assembler:
    """Chat-completion chunks back into one chat completion."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> str:
        self.head = self.head or {k: chunk.get(k) for k in ("id", "created", "model",
                                                             "system_fingerprint")}
        self.usage = chunk.get("usage") or self.usage
        piece = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                self._merge(call)
            self.finish = choice.get("finish_reason") or self.finish
        self.text.append(piece)
        return piece

    def _merge(self, call: dict[str, Any]) -> None:
        found = self.calls.setdefault(int(call.get("index") or 0), {
            "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        found["id"] = call.get("id") or found["id"]
        function = call.get("function") or {}
        found["function"]["name"] += function.get("name") or ""
        found["function"]["arguments"] += function.get("arguments") or ""

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {**self.head, "object": "chat.completion", "usage": self.usage,
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish}]}
