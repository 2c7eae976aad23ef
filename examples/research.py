"""A research agent in five steps: collect sources, extract claims, draft, validate
citations, publish. Deterministic and offline; each step takes ``ONWARD_EXAMPLE_STEP_MS``
(default 40 ms) to stand for model latency."""

from __future__ import annotations

import hashlib
import os
import time

from pydantic import BaseModel, Field

from tasks import StepContext, Workflow


class ResearchState(BaseModel):
    topic: str
    sources: list[str] = Field(default_factory=list)
    claims: list[str] = Field(default_factory=list)
    draft: str = ""
    citations_ok: bool = False


research = Workflow("research_agent", version=1, state=ResearchState, max_attempts=3,
                    description="collect → extract → draft → validate → publish")


def _think() -> None:
    time.sleep(float(os.environ.get("ONWARD_EXAMPLE_STEP_MS", "40")) / 1000.0)


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:8]


@research.step(start=True)
def collect_sources(ctx: StepContext, state: ResearchState):
    _think()
    sources = [f"https://example.org/{state.topic}/{i}-{_digest(state.topic, str(i))}"
               for i in range(3)]
    return ctx.goto(extract_claims, sources=sources)


@research.step
def extract_claims(ctx: StepContext, state: ResearchState):
    _think()
    claims = [f"claim {i} from {src.rsplit('/', 1)[-1]}" for i, src in enumerate(state.sources)]
    return ctx.goto(draft, claims=claims)


@research.step
def draft(ctx: StepContext, state: ResearchState):
    _think()
    body = f"# {state.topic}\n" + "\n".join(f"- {c} [{i}]" for i, c in enumerate(state.claims))
    return ctx.goto(validate_citations, draft=body)


@research.step
def validate_citations(ctx: StepContext, state: ResearchState):
    _think()
    cited = all(f"[{i}]" in state.draft for i in range(len(state.sources)))
    if not cited:
        return ctx.goto(draft)  # redraft until every source is cited
    return ctx.goto(publish, citations_ok=True)


@research.step
def publish(ctx: StepContext, state: ResearchState):
    _think()
    return ctx.finish(url=f"https://reports.example.org/{_digest(state.draft)}",
                      sources=len(state.sources))
