"""HTTP client for the reference provider, and Tool declarations built on it.

The provider's URL comes from ``ONWARD_EXAMPLE_PROVIDER_URL`` at call time, so the same
worker code talks to whichever provider the demo or a test started.

Every request takes the ``timeout`` onward gives the tool's callables (the tool's
``timeout_s``, default ``ONWARD_TOOL_TIMEOUT_S``): the client gives up by then, so a call
never outlives the lease onward extended to cover it (docs/effects.md).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ledger.vocabulary import ToolClass
from tasks.exceptions import ToolError
from tasks.tools import Tool, ToolResult

TIMEOUT = httpx.Timeout(5.0, connect=2.0)  # when no timeout is given (admin requests)


def _timeout(seconds: float | None) -> httpx.Timeout:
    """A request's time limit: ``seconds`` for every phase, connect capped at 2 s."""
    if seconds is None:
        return TIMEOUT
    return httpx.Timeout(seconds, connect=min(2.0, seconds))


def provider_url() -> str:
    url = os.environ.get("ONWARD_EXAMPLE_PROVIDER_URL")
    if not url:
        raise RuntimeError("ONWARD_EXAMPLE_PROVIDER_URL is not set: start examples.provider")
    return url.rstrip("/")


_client: httpx.Client | None = None
_client_pid = 0


def _http() -> httpx.Client:
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():  # never share sockets across fork
        _client = httpx.Client(timeout=TIMEOUT)
        _client_pid = os.getpid()
    return _client


def _answer(response: httpx.Response) -> ToolResult:
    if response.status_code in (200, 201, 202):
        obj: dict[str, Any] = response.json()
        accepted = response.status_code == 202 or obj.get("status") == "processing"
        return ToolResult("accepted" if accepted else "completed", obj["id"], obj)
    message = f"provider answered {response.status_code}: {response.text[:200]}"
    retryable = response.status_code >= 500 or response.status_code == 429
    raise ToolError(message, retryable=retryable, status_code=response.status_code)


def create(collection: str, payload: dict[str, Any], idempotency_key: str,
           *, send_key: bool = True, timeout: float | None = None) -> ToolResult:
    headers = {"Idempotency-Key": idempotency_key} if send_key else {}
    return _answer(_http().post(f"{provider_url()}/v1/{collection}", json=payload,
                                headers=headers, timeout=_timeout(timeout)))


def find_by_key(collection: str, key: str, *, timeout: float | None = None) -> ToolResult | None:
    response = _http().get(f"{provider_url()}/v1/{collection}/by-key/{key}",
                           timeout=_timeout(timeout))
    if response.status_code == 404:
        return None
    return _answer(response)


def status(collection: str, ref: str, *, timeout: float | None = None) -> ToolResult:
    return _answer(_http().get(f"{provider_url()}/v1/{collection}/{ref}",
                               timeout=_timeout(timeout)))


def provider_tool(name: str, collection: str, tool_class: ToolClass, *, lookup: bool = True,
                  honours_key: bool | None = None, send_key: bool = True,
                  recipient_field: str | None = None,
                  check_payload: dict[str, Any] | None = None,
                  timeout_s: float | None = None) -> Tool:
    """A Tool whose call, lookup and status go to ``collection`` at the reference provider;
    each request is given the time limit onward passes (``timeout``)."""

    def call(payload: dict[str, Any], key: str, *, timeout: float | None = None) -> ToolResult:
        return create(collection, payload, key, send_key=send_key, timeout=timeout)

    def find(key: str, *, timeout: float | None = None) -> ToolResult | None:
        return find_by_key(collection, key, timeout=timeout)

    def poll(ref: str, *, timeout: float | None = None) -> ToolResult:
        return status(collection, ref, timeout=timeout)

    return Tool(
        name,
        tool_class,
        call=call,
        lookup=find if lookup else None,
        status=poll,
        simulate=lambda payload, key: ToolResult("completed", f"sim_{key[:12]}",
                                                 {"id": f"sim_{key[:12]}", "body": payload}),
        honours_key=honours_key,
        recipient=(lambda p: str(p.get(recipient_field))) if recipient_field else None,
        check_payload=check_payload,
        timeout_s=timeout_s,
    )


def stats() -> dict[str, Any]:
    response = _http().get(f"{provider_url()}/admin/stats")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
