"""Workflow definitions: every mistake is refused at import time, before any run exists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from tasks import Registry, StepContext, Workflow, WorkflowDefinitionError


class State(BaseModel):
    n: int = 0


def _noop(ctx: StepContext, state: Any) -> Any:
    return ctx.finish()


def test_workflow__duplicate_step_name_is_refused() -> None:
    """Two steps with one name would make a checkpoint's ``next_step`` ambiguous."""
    flow = Workflow("dup", state=State)
    flow.step(_noop)
    with pytest.raises(WorkflowDefinitionError, match="'_noop' defined twice"):
        flow.step(_noop)
    with pytest.raises(WorkflowDefinitionError, match="defined twice"):
        flow.step(name="_noop")(lambda ctx, state: ctx.finish())


def test_workflow__two_start_steps_are_refused() -> None:
    """A run begins at exactly one step: a second ``start=True`` names both."""
    flow = Workflow("two_starts", state=State)
    flow.step(start=True, name="first")(_noop)
    with pytest.raises(WorkflowDefinitionError, match="both 'first' and 'second'"):
        flow.step(start=True, name="second")(_noop)
    assert flow.start is not None and flow.start.name == "first"
    assert list(flow.steps) == ["first"]


def test_workflow__no_start_step_is_refused_at_registration() -> None:
    """A workflow without a start step cannot be registered; the error says how to fix it."""
    flow = Workflow("no_start", state=State)
    flow.step(_noop)
    registry = Registry()
    with pytest.raises(WorkflowDefinitionError, match=r"no start step.*start=True"):
        registry.register(flow)
    assert registry.names() == []


@pytest.mark.parametrize("name", ["", "has space", "1starts_with_digit", "semi;colon",
                                  "x" * 129, "slash/name", "ünïcode"])
def test_workflow__bad_workflow_name_is_refused(name: str) -> None:
    """Names end up in logs, URLs and SQL filters: only a safe alphabet is accepted."""
    with pytest.raises(WorkflowDefinitionError, match="workflow name"):
        Workflow(name, state=State)


@pytest.mark.parametrize("name", ["has space", "9lives", "drop;table", "y" * 129])
def test_workflow__bad_step_name_is_refused(name: str) -> None:
    """Step names are stored in checkpoints; an invalid one is refused at definition."""
    flow = Workflow("bad_step_names", state=State)
    with pytest.raises(WorkflowDefinitionError, match="invalid step name"):
        flow.step(name=name)(_noop)
    assert flow.steps == {}


@pytest.mark.parametrize("name", ["a", "_private", "agent.v2:draft-1", "Z" * 128])
def test_workflow__good_names_are_accepted(name: str) -> None:
    """The accepted alphabet: letters, digits, '_', '.', ':' and '-', up to 128 chars."""
    flow = Workflow(name, state=State)
    step = flow.step(start=True, name=name)(_noop)
    assert flow.resolve(None) is step
    assert flow.resolve(name) is step


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": 0}, "version must be an int >= 1"),
        ({"version": "1"}, "version must be an int >= 1"),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"state": dict}, "state must be a pydantic model class"),
        ({"state": State()}, "state must be a pydantic model class"),
    ],
)
def test_workflow__bad_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    """Version, attempt budget and state model are checked when the workflow is declared."""
    options: dict[str, Any] = {"state": State, **kwargs}
    with pytest.raises(WorkflowDefinitionError, match=message):
        Workflow("options", **options)


def test_workflow__step_attempt_budget_must_be_positive() -> None:
    """A step's own ``max_attempts`` overrides the workflow's, and must be >= 1."""
    flow = Workflow("budgets", state=State, max_attempts=4)
    with pytest.raises(WorkflowDefinitionError, match="max_attempts must be >= 1"):
        flow.step(name="never", max_attempts=0)(_noop)
    own = flow.step(name="own", max_attempts=7)(_noop)
    inherited = flow.step(name="inherited")(_noop)
    assert flow.attempts_for(own) == 7
    assert flow.attempts_for(inherited) == 4


def test_workflow__unknown_step_resolves_to_none() -> None:
    """A checkpoint naming a step the code lacks resolves to None (the executor parks it)."""
    flow = Workflow("resolve", state=State)
    flow.step(start=True)(_noop)
    assert flow.resolve("no_such_step") is None


def test_registry__same_name_twice_is_refused() -> None:
    """Two different workflows under one name would make stored runs ambiguous."""
    first = Workflow("same_name", state=State)
    first.step(start=True)(_noop)
    second = Workflow("same_name", state=State)
    second.step(start=True)(_noop)
    registry = Registry()
    registry.register(first)
    registry.register(first)  # registering the same object again is harmless
    with pytest.raises(WorkflowDefinitionError, match="registered twice"):
        registry.register(second)
    assert registry.get("same_name") is first


def test_registry__module_without_workflow_is_refused() -> None:
    """ONWARD_WORKFLOWS naming a module that defines no workflow is a configuration error."""
    with pytest.raises(WorkflowDefinitionError, match="defines no Workflow"):
        Registry().load_modules(["tasks.outcomes"])


def test_registry__loads_test_workflows() -> None:
    """Every top-level Workflow of a module is registered by name."""
    registry = Registry()
    registry.load_modules(["tests.workflows"])
    assert {"test_chain", "test_poison", "test_flaky", "test_broken"} <= set(registry.names())


# -- timeouts and async steps (docs/steps.md) ----------------------------------------------

@pytest.mark.parametrize("timeout", [0, -1, "10", True, timedelta(0)])
def test_workflow__bad_step_timeout_is_refused(timeout: Any) -> None:
    """A timeout is a positive number of seconds or a timedelta; anything else is refused
    when the step is defined, naming it."""
    flow = Workflow("bad_timeout", state=State)
    with pytest.raises(WorkflowDefinitionError, match=r"bad_timeout\._noop: timeout must be"):
        flow.step(timeout=timeout)(_noop)


def test_workflow__generator_step_is_refused() -> None:
    """A step returns one outcome: a generator (sync or async) is refused at definition."""
    flow = Workflow("gen", state=State)

    def many(ctx: StepContext, state: Any) -> Any:
        yield ctx.finish()

    async def many_async(ctx: Any, state: Any) -> Any:
        yield ctx.finish()

    for body in (many, many_async):
        with pytest.raises(WorkflowDefinitionError, match="is a generator"):
            flow.step(body)


def test_registry__step_leases_cover_timeouts_and_the_margin() -> None:
    """The claim leases a step with a timeout for the timeout and the margin, by workflow
    and step name ("" for the start step, which a new run's row does not name); the
    longest over the versions this code has; steps without a timeout are left out."""
    v1 = Workflow("leased", version=1, state=State)
    v1.step(start=True, timeout=timedelta(minutes=2))(_noop)
    v1.step(name="plain")(_noop)
    v2 = Workflow("leased", version=2, state=State)
    v2.step(start=True, timeout=60)(_noop)
    registry = Registry()
    registry.register(v1)
    registry.register(v2)
    assert registry.step_leases(5.0) == {"leased": {"_noop": 125.0, "": 125.0}}
    assert registry.step_leases(0.0) == {"leased": {"_noop": 120.0, "": 120.0}}


def test_registry__async_parts_name_async_steps_tools_and_clients() -> None:
    """What of a workflow needs an event loop: its async def steps, an async model client,
    the async tools of its module (what a gevent worker refuses at start)."""
    registry = Registry()
    registry.load_modules(["tests.workflows_async"])
    parts = registry.async_parts()
    assert "async step draft" in parts["test_async v1"]
    assert "async tool test.async_offer" in parts["test_async v1"]
    flow = Workflow("plain_only", state=State)
    flow.step(start=True)(_noop)
    registry.register(flow)
    assert "plain_only v1" not in registry.async_parts()
    assert flow.start is not None and not flow.start.is_async
