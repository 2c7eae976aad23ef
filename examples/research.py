"""A research agent in five steps: collect sources, extract claims, draft, validate
citations, publish. Its model calls go through ``ctx.llm`` with the official ``openai``
client to an OpenAI-compatible endpoint: ``ONWARD_MODEL_URL`` (default the loopback model
server of examples/model_server.py on port 8780, which ``make demo`` starts), model
``ONWARD_MODEL_NAME``. Collecting sources asks the model to call a ``search`` tool; the
draft is streamed (``stream=True``) to whoever subscribes to the run. Every answer is
recorded as evidence, so a step that runs again after a crash gets the same answer, tool
calls included, without calling the model twice."""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

from pydantic import BaseModel, Field

from examples.settings import ExampleSettings
from tasks import Finish, Goto, LLMResponse, StepContext, Workflow
from tasks.llm_openai import OpenAIChat

SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Find sources about a topic.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}


class ResearchState(BaseModel):
    topic: str
    sources: list[str] = Field(default_factory=list)
    claims: list[str] = Field(default_factory=list)
    draft: str = ""
    citations_ok: bool = False


class _Model:
    """The ``openai`` adapter, built on first use from the environment."""

    @property
    def timeout_s(self) -> float:
        """The SDK's time limit below, which the step's lease covers."""
        return ExampleSettings().research_model_timeout_s

    @cache  # noqa: B019 - one client per process, for the process's life
    def _client(self) -> OpenAIChat:
        settings = ExampleSettings()
        return OpenAIChat(base_url=settings.model_url, api_key=settings.model_api_key,
                          timeout_s=self.timeout_s, max_retries=2)

    def complete(self, **call: Any) -> LLMResponse:
        return self._client().complete(**call)

    def stream(self, **call: Any) -> LLMResponse:
        return self._client().stream(**call)


MODEL = ExampleSettings().model_name
research = Workflow("research_agent", version=1, state=ResearchState, max_attempts=3,
                    llm=_Model(), description="collect → extract → draft → validate → publish")


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:8]


def _ask(ctx: StepContext, prompt: str, **params: Any) -> LLMResponse:
    return ctx.llm(model=MODEL, messages=[
        {"role": "system", "content": "You are a careful research assistant."},
        {"role": "user", "content": prompt}], **params)


@research.step(start=True)
def collect_sources(ctx: StepContext, state: ResearchState) -> Goto:
    answer = _ask(ctx, f"Find three sources about {state.topic}.", tools=[SEARCH_TOOL])
    refs = [call["arguments"].get("ref", "") for call in answer.tool_calls] or [answer.text]
    sources = [f"https://example.org/{state.topic}/{i}-{_digest(state.topic, str(i), *refs)}"
               for i in range(3)]
    return ctx.goto(extract_claims, sources=sources)


@research.step
def extract_claims(ctx: StepContext, state: ResearchState) -> Goto:
    answer = _ask(ctx, "Extract one claim from each source:\n" + "\n".join(state.sources))
    claims = [f"claim {i} from {src.rsplit('/', 1)[-1]} ({answer.text[1:9]})"
              for i, src in enumerate(state.sources)]
    return ctx.goto(draft, claims=claims)


@research.step
def draft(ctx: StepContext, state: ResearchState) -> Goto:
    answer = _ask(ctx, f"Write a short report on {state.topic}.", stream=True)
    body = f"# {state.topic}\n{answer.text}\n" + "\n".join(
        f"- {c} [{i}]" for i, c in enumerate(state.claims))
    return ctx.goto(validate_citations, draft=body)


@research.step
def validate_citations(ctx: StepContext, state: ResearchState) -> Goto:
    cited = all(f"[{i}]" in state.draft for i in range(len(state.sources)))
    if not cited:
        return ctx.goto(draft)  # redraft until every source is cited
    return ctx.goto(publish, citations_ok=True)


@research.step
def publish(ctx: StepContext, state: ResearchState) -> Finish:
    answer = _ask(ctx, f"Give a one-line title for:\n{state.draft}")
    return ctx.finish(url=f"https://reports.example.org/{_digest(state.draft)}",
                      title=answer.text, sources=len(state.sources))
