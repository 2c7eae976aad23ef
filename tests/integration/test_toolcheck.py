"""``onward tools check`` and its pytest helper against the real reference provider (an HTTP
service, in a thread of the test): the reference tools keep every promise they declare, and each
broken variant fails naming the promise it breaks, with the objects the provider holds
counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from console.cli import app
from examples import provider_client
from examples.provider_client import create, find_by_key, provider_tool, status
from examples.sales import create_offer, send_email
from ledger.vocabulary import ToolClass
from tasks.exceptions import ToolPromiseBroken
from tasks.toolcheck import assert_tool_keeps_promises, check_tool
from tasks.tools import Tool, ToolResult
from tests.support.provider import Provider, provider_in_thread

SAMPLE = {"customer_id": "c-check", "amount": 100}


def _oldest(collection: str) -> ToolResult | None:
    """A lookup bug seen in the wild: it finds the customer's first object, whatever the key."""
    objects = httpx.get(f"{provider_client.provider_url()}/admin/objects").json()
    mine = [o for o in objects if o["collection"] == collection]
    return ToolResult("completed", mine[0]["id"], mine[0]) if mine else None


never_finds = Tool("check.never_finds", ToolClass.IRREVERSIBLE,
                   call=lambda p, k: create("never", p, k), lookup=lambda k: None,
                   status=lambda ref: status("never", ref), check_payload=SAMPLE)
finds_wrong = Tool("check.finds_wrong", ToolClass.IRREVERSIBLE,
                   call=lambda p, k: create("wrong", p, k), lookup=lambda k: _oldest("wrong"),
                   status=lambda ref: status("wrong", ref), check_payload=SAMPLE)
ignores_key = provider_tool("check.ignores_key", "ignored", ToolClass.IDEMPOTENT_WRITE,
                            send_key=False, check_payload=SAMPLE)
no_status = Tool("check.no_status", ToolClass.IRREVERSIBLE,
                 call=lambda p, k: create("nostatus", p, k),
                 lookup=lambda k: find_by_key("nostatus", k), check_payload=SAMPLE)
unsampled = provider_tool("check.unsampled", "unsampled", ToolClass.IRREVERSIBLE)


@pytest.fixture()
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    with provider_in_thread(tmp_path) as running:
        monkeypatch.setenv("ONWARD_EXAMPLE_PROVIDER_URL", running.url)
        yield running


def _broken(tool: Tool, **kwargs: Any) -> dict[str, str]:
    report = check_tool(tool, **kwargs)
    assert not report.passed
    return {c.promise: c.detail for c in report.broken}


def test_toolcheck__reference_tools_keep_their_promises(provider: Provider) -> None:
    """The reference provider's tools (the sales agent's CRM and mail tools) pass; the check
    made exactly one object per tool and the provider refused the reused key once."""
    offer = check_tool(create_offer)
    email = check_tool(send_email)
    assert offer.passed and email.passed, (offer.summary(), email.summary())
    verdicts = {c.promise: c.verdict.value for c in email.checks}
    assert verdicts == {p: "passed" for p in verdicts}  # idempotent_write: every promise
    assert len(verdicts) == 7
    stats = provider.stats()
    assert stats["objects"] == 2 and stats["duplicate_objects"] == 0
    assert stats["dedupe_hits"] == 1 and stats["conflicts_409"] == 1
    assert offer.objects == [provider.objects()[0]["id"]]


def test_toolcheck__lookup_that_never_finds_fails_naming_it(provider: Provider) -> None:
    """A lookup that never finds what the call created fails exactly that promise, and says
    what onward would do with it (send again: a duplicate)."""
    broken = _broken(never_finds)
    assert list(broken) == ["lookup_finds_created"]
    assert "broken promise 'lookup finds what the call created with its key'" in \
        broken["lookup_finds_created"]
    assert "duplicate" in broken["lookup_finds_created"]
    assert provider.stats()["objects"] == 1


def test_toolcheck__lookup_that_finds_the_wrong_object_fails(provider: Provider) -> None:
    """A lookup that answers with another object (the oldest in the collection) fails both
    lookup promises: it names the object it returned and the one the call created."""
    decoy = create("wrong", {"customer_id": "c-check", "amount": 1}, "decoy-key")
    broken = _broken(finds_wrong)
    assert set(broken) == {"lookup_finds_created", "lookup_unknown_missing"}
    assert f"returned object {decoy.provider_ref}, but the call created" in \
        broken["lookup_finds_created"]
    assert "broken promise 'lookup of an unknown key says missing'" in \
        broken["lookup_unknown_missing"]


def test_toolcheck__provider_that_ignores_the_key_fails(provider: Provider) -> None:
    """A client that never sends the key to a provider that would honour it: the same key
    twice makes a second object, lookup finds none, and key reuse is not refused. The
    provider holds the three objects the check made, each listed in the report."""
    report = check_tool(ignores_key)
    broken = {c.promise: c.detail for c in report.broken}
    assert set(broken) == {"same_key_one_object", "lookup_finds_created", "key_reuse_refused"}
    assert "broken promise 'the same key twice gives one object'" in \
        broken["same_key_one_object"]
    assert "does not deduplicate by this key" in broken["same_key_one_object"]
    assert provider.stats()["objects"] == 3 == len(report.objects)


def test_toolcheck__accepted_jobs_are_polled_and_a_missing_status_fails(
        provider: Provider) -> None:
    """With a provider that only accepts jobs (202, completed later), a tool with a status
    passes after polling; one without a status fails the status promise."""
    provider.configure(async_complete_s=0.5)
    offer = check_tool(create_offer)
    assert offer.passed, offer.summary()
    polled = next(c for c in offer.checks if c.promise == "status_settles")
    assert polled.verdict.value == "passed" and "after 1 poll" not in polled.detail
    broken = _broken(no_status)
    assert list(broken) == ["status_settles"]
    assert "declares no status" in broken["status_settles"]


def test_toolcheck__pytest_helper_raises_an_assertion_naming_the_promise(
        provider: Provider) -> None:
    """The helper an integrator calls from their own suite passes for a good tool and raises
    an AssertionError that names the broken promise for a bad one."""
    assert assert_tool_keeps_promises(send_email).passed
    with pytest.raises(AssertionError) as raised:
        assert_tool_keeps_promises(never_finds)
    assert isinstance(raised.value, ToolPromiseBroken)
    assert "lookup_finds_created" in str(raised.value)


def onward(*args: str, code: int, input: str | None = None, stdout: bool = False) -> str:
    result = CliRunner().invoke(app, ["tools", "check", *args], input=input,
                                env={"COLUMNS": "200"})
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.stdout if stdout else result.output


def test_cli_tools_check__exit_codes_json_and_messages(provider: Provider) -> None:
    """0 when every declared promise holds (--json has each check), 1 naming the broken
    promise, 2 for a target or payload it cannot use, and declining calls nothing."""
    shown = json.loads(onward("examples.sales:send_email", "--yes", "--json", code=0,
                             stdout=True))
    assert shown["passed"] and len(shown["checks"]) == 7
    assert shown["objects_created"] == [provider.objects()[0]["id"]]
    text = onward("tests.integration.test_toolcheck:never_finds", "--yes", code=1)
    assert "lookup_finds_created" in text and "BREAKS 1 promise(s)" in text
    assert "CALLS THE TOOL FOR REAL" in text
    payload = json.dumps({"customer_id": "c-cli", "amount": 7})
    assert json.loads(onward("examples.sales:create_offer", "--payload", payload, "--yes",
                             "--json", code=0, stdout=True))["passed"]
    assert provider.objects()[-1]["body"] == {"customer_id": "c-cli", "amount": 7}
    requests = provider.stats()["requests"]
    assert "nothing done" in onward("examples.sales:create_offer", input="n\n", code=1)
    assert "not a Tool" in onward("examples.sales:offer", "--yes", code=2)
    assert "MODULE:TOOL" in onward("examples.sales", "--yes", code=2)
    assert "--payload" in onward("tests.integration.test_toolcheck:unsampled", "--yes", code=2)
    assert "not JSON" in onward("examples.sales:create_offer", "--payload", "{", "--yes",
                                code=2)
    assert provider.stats()["requests"] == requests  # nothing was sent after declining
