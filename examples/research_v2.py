"""Version 2 of the research agent (examples/research.py), the code change the README's
corpus replay reviews: the draft step asks the model for a neutral report that says which
claims are unverified (another prompt), and a new validation step, ``check_claims``, marks
the claims whose source is not on the vetted list before the draft is written. Every other
step is version 1's.

    onward corpus replay demo --code examples.research_v2

Version 2 keeps version 1's state, so it declares v1 compatible: a v1 run in flight when v2
is deployed continues on v2.
"""

from __future__ import annotations

import examples.research as v1  # the module: its Workflow is not registered from here
from examples.research import ResearchState
from tasks import Goto, StepContext, Workflow

DRAFT_PROMPT = ("Write a short, neutral report on {topic}. Say which claims are unverified "
                "and cite every claim by its number.")

research_v2 = Workflow("research_agent", version=2, state=ResearchState, max_attempts=3,
                       llm=v1.research.llm, compatible_with=(1,),
                       description="collect → extract → check → draft → validate → publish")

# unchanged steps: version 1's functions (a goto names its target step, found here by name)
for _name in ("collect_sources", "validate_citations", "publish"):
    research_v2.step(start=_name == "collect_sources", name=_name)(v1.research.steps[_name].fn)


def vetted(source: str) -> bool:
    """A source is vetted unless its id starts with 0 (standing for an unknown domain)."""
    return not source.rsplit("/", 1)[-1].split("-")[-1].startswith("0")


@research_v2.step
def extract_claims(ctx: StepContext, state: ResearchState) -> Goto:
    answer = v1._ask(ctx, "Extract one claim from each source:\n" + "\n".join(state.sources))
    claims = [f"claim {i} from {src.rsplit('/', 1)[-1]} ({answer.text[1:9]})"
              for i, src in enumerate(state.sources)]
    if all(vetted(source) for source in state.sources):
        return ctx.goto(draft, claims=claims)
    return ctx.goto(check_claims, claims=claims)


@research_v2.step
def check_claims(ctx: StepContext, state: ResearchState) -> Goto:
    """New in v2: a claim whose source is not vetted is marked unverified."""
    claims = [claim if vetted(source) else f"{claim} (unverified)"
              for claim, source in zip(state.claims, state.sources, strict=True)]
    return ctx.goto(draft, claims=claims)


@research_v2.step
def draft(ctx: StepContext, state: ResearchState) -> Goto:
    answer = v1._ask(ctx, DRAFT_PROMPT.format(topic=state.topic), stream=True)
    body = f"# {state.topic}\n{answer.text}\n" + "\n".join(
        f"- {c} [{i}]" for i, c in enumerate(state.claims))
    return ctx.goto("validate_citations", draft=body)
