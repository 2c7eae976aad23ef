"""Workflows whose steps call a real HTTP model server (examples/model_server.py) through the
official ``openai`` client: ``ONWARD_MODEL_URL`` names it, read at each call."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from tasks import StepContext, Workflow
from tasks.llm import LLMResponse
from tasks.llm_openai import OpenAIChat

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}}}}}


class OpenAIFromEnv:
    """The openai adapter, pointed at ONWARD_MODEL_URL when the call is made."""

    timeout_s = 10.0  # the loopback model server answers within it

    def _client(self) -> OpenAIChat:
        return OpenAIChat(base_url=os.environ["ONWARD_MODEL_URL"], api_key="test",
                          max_retries=0, prices={"gpt-test": (1.0, 2.0)},
                          timeout_s=self.timeout_s)

    def complete(self, **call: Any) -> LLMResponse:
        return self._client().complete(**call)

    def stream(self, **call: Any) -> LLMResponse:
        return self._client().stream(**call)


class Question(BaseModel):
    question: str
    stream: bool = False
    tool_calls: list[dict[str, Any]] = []
    answer: str = ""


tool_agent = Workflow("test_tool_agent", version=1, state=Question, llm=OpenAIFromEnv())


@tool_agent.step(start=True)
def ask(ctx: StepContext, state: Question) -> Any:
    """One model call offering a tool; the tool calls it asks for go into the state."""
    reply = ctx.llm(model="gpt-test", messages=[{"role": "user", "content": state.question}],
                    tools=[LOOKUP], stream=state.stream)
    return ctx.goto(answer, tool_calls=reply.tool_calls)


@tool_agent.step
def answer(ctx: StepContext, state: Question) -> Any:
    """A second call carrying the tool's result: a plain text answer."""
    call = state.tool_calls[0]
    reply = ctx.llm(model="gpt-test", stream=state.stream, messages=[
        {"role": "user", "content": state.question},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "42"}])
    return ctx.finish(answer=reply.text)
