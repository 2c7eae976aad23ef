"""``ctx.llm`` through the official ``anthropic`` client (``pip install 'onward[anthropic]'``).

``messages`` are Anthropic's (``system`` is a parameter, as in the SDK); ``max_tokens``
defaults to 1024. The evidence keeps the whole message as the SDK returned it
(``data["response"]``, ``tool_use`` blocks included); ``LLMResponse.tool_calls`` lists them
as ``{"id", "name", "arguments"}``, the same shape the OpenAI adapter gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tasks.limits import Limit
from tasks.llm import LLMResponse, sdk_timeout
from tasks.llm_openai import Prices, price_of
from tasks.retry import RetryPolicy

__all__ = ["AnthropicMessages"]


class AnthropicMessages:
    """An ``LLMClient`` over ``anthropic.Anthropic().messages``."""

    def __init__(self, client: Any = None, *, prices: Prices | None = None,
                 max_tokens: int = 1024, timeout_s: float | None = None,
                 limits: Sequence[Limit] = (), retry: RetryPolicy | None = None,
                 **client_options: Any) -> None:
        """``timeout_s``: one call's time limit, covered by the step's lease (given to the SDK
        as ``timeout`` when this builds the client; a ``timeout=`` number is read as it).
        ``limits`` and ``retry``: as ``OpenAIChat`` (docs/limits.md)."""
        self.timeout_s = sdk_timeout(timeout_s, client_options)
        self.limits = tuple(limits)
        self.retry = retry
        if client is None:
            try:
                import anthropic
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ImportError("AnthropicMessages needs the anthropic package: "
                                  "pip install 'onward[anthropic]'") from exc
            client = anthropic.Anthropic(**client_options)
        self.client = client
        self.prices = prices or {}
        self.max_tokens = max_tokens

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        params.setdefault("max_tokens", self.max_tokens)
        answer = self.client.messages.create(model=model, messages=messages, **params)
        return self._response(answer.model_dump(mode="json"))

    def stream(self, *, model: str, messages: list[dict[str, Any]],
               on_text: Callable[[str], None], **params: Any) -> LLMResponse:
        params.setdefault("max_tokens", self.max_tokens)
        with self.client.messages.stream(model=model, messages=messages, **params) as stream:
            for piece in stream.text_stream:
                on_text(piece)
            final = stream.get_final_message()
        return self._response(final.model_dump(mode="json"))

    def _response(self, raw: dict[str, Any]) -> LLMResponse:
        blocks = raw.get("content") or []
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        calls = [{"id": b.get("id"), "name": b.get("name"), "arguments": b.get("input") or {}}
                 for b in blocks if b.get("type") == "tool_use"]
        usage = raw.get("usage") or {}
        tokens_in = int(usage.get("input_tokens") or 0)
        tokens_out = int(usage.get("output_tokens") or 0)
        model = str(raw.get("model") or "")
        return LLMResponse(
            text=text, model=model, input_tokens=tokens_in, output_tokens=tokens_out,
            cost_usd=price_of(self.prices, model, tokens_in, tokens_out),
            data={"response": raw, "tool_calls": calls, "finish_reason": raw.get("stop_reason")})
