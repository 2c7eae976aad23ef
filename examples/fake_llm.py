"""A deterministic, offline model client: same request, same answer; counts its calls."""

from __future__ import annotations

import hashlib
from typing import Any

from examples.settings import ExampleSettings
from tasks import LLMResponse


class FakeModel:
    """Classifies by keyword and writes short deterministic text. If ``ONWARD_FAKE_LLM_LOG``
    names a file, each real call appends one line to it (tests count paid calls that way).
    It answers at once: its time limit, which onward covers with the lease, is 1 s."""

    timeout_s = 1.0

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        prompt = " ".join(str(m.get("content", "")) for m in messages)
        log = ExampleSettings().fake_llm_log
        if log:
            with log.open("a") as handle:
                handle.write(f"{model}\t{hashlib.sha256(prompt.encode()).hexdigest()[:12]}\n")
        if params.get("task") == "classify":
            text = "offer" if any(w in prompt.lower() for w in ("price", "offer", "quote")) \
                else "support"
        else:
            digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
            text = f"[{model}:{digest}] {prompt[:80]}"
        tokens_in = len(prompt.split())
        tokens_out = len(text.split())
        return LLMResponse(text=text, model=f"{model}-fake-1", input_tokens=tokens_in,
                           output_tokens=tokens_out, cost_usd=(tokens_in + tokens_out) * 1e-6)
