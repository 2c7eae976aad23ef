"""The pluggable model client. onward records each call as evidence; it never needs to know
which vendor is behind the client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class LLMResponse:
    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # anything else the client returns

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
    """Anything that can complete a chat: a vendor SDK wrapper, or a deterministic fake."""

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse: ...
