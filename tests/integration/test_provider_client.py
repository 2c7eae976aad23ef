"""What the reference client (examples/provider_client.py) makes of each answer of the
reference provider (a real HTTP service, in a thread of the test): a refusal only when the
answer proves nothing happened; a write the provider may have committed is an unknown
outcome (docs/effects.md, "The contract an integrator fulfils")."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.provider_client import (
    WriteOutcomeUnknown,
    async_provider_tool,
    create,
    find_by_key,
    status,
)
from ledger.vocabulary import ToolClass
from tasks.exceptions import ToolError
from tests.support.provider import Provider, provider_in_thread

KEY = "k" * 64


@pytest.fixture()
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    with provider_in_thread(tmp_path) as running:
        monkeypatch.setenv("ONWARD_EXAMPLE_PROVIDER_URL", running.url)
        yield running


def test_a_500_after_the_commit_is_an_unknown_outcome_not_a_refusal(
        provider: Provider) -> None:
    """Invariant: a create the provider committed and then answered 500 for raises
    ``WriteOutcomeUnknown`` (not a ``ToolError``, which onward would read as "nothing
    happened" and resend blind), with the status code for the retry policy; the object it
    made is there for the lookup to find. Fails before 76fb27a (a retryable ToolError)."""
    provider.arm("offers", commit_error_500=1)
    with pytest.raises(WriteOutcomeUnknown) as raised:
        create("offers", {"amount": 1}, KEY, timeout=5.0)
    assert not isinstance(raised.value, ToolError)
    assert raised.value.status_code == 500
    found = find_by_key("offers", KEY, timeout=5.0)
    assert found is not None and found.status == "completed"
    assert provider.stats()["objects"] == 1


def test_the_async_call_reads_a_500_the_same_way(provider: Provider) -> None:
    provider.arm("offers", commit_error_500=1)
    tool = async_provider_tool("async.offer", "offers", ToolClass.IRREVERSIBLE)
    with pytest.raises(WriteOutcomeUnknown):
        asyncio.run(tool.call({"amount": 1}, KEY, timeout=5.0))
    assert provider.stats()["committed_errors_500"] == 1


def test_refusals_are_answers_that_prove_nothing_happened(provider: Provider) -> None:
    """Invariant: a 429 (answered before acting) and a 409 (a key reused with another body)
    are refusals, retryable or not; a 5xx to a read is a retryable refusal (a read changes
    nothing)."""
    provider.arm("offers", error_429=1)
    with pytest.raises(ToolError) as limited:
        create("offers", {"amount": 1}, KEY, timeout=5.0)
    assert (limited.value.retryable, limited.value.status_code) == (True, 429)
    made = create("offers", {"amount": 1}, KEY, timeout=5.0)
    with pytest.raises(ToolError) as conflict:
        create("offers", {"amount": 2}, KEY, timeout=5.0)
    assert (conflict.value.retryable, conflict.value.status_code) == (False, 409)
    provider.arm("offers", lookup_error_500=1, status_error_500=1)
    for read in (lambda: find_by_key("offers", KEY, timeout=5.0),
                 lambda: status("offers", made.provider_ref or "", timeout=5.0)):
        with pytest.raises(ToolError) as failed:
            read()
        assert (failed.value.retryable, failed.value.status_code) == (True, 500)
    assert provider.stats()["objects"] == 1


def test_a_connection_never_made_is_a_retryable_refusal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a provider nobody listens for (connection refused) received nothing: a
    retryable ``ToolError``, which onward may answer by sending again, no lookup needed."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("ONWARD_EXAMPLE_PROVIDER_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(ToolError, match="nothing was sent") as refused:
        create("offers", {"amount": 1}, KEY, timeout=2.0)
    assert refused.value.retryable is True
