"""HTTP client for the reference provider, and Tool declarations built on it.

The provider's URL comes from ``ONWARD_EXAMPLE_PROVIDER_URL`` at call time, so the same
worker code talks to whichever provider the demo or a test started.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ledger.schema import ToolClass
from tasks.tools import Tool, ToolError, ToolResult

TIMEOUT = httpx.Timeout(5.0, connect=2.0)


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
           *, send_key: bool = True) -> ToolResult:
    headers = {"Idempotency-Key": idempotency_key} if send_key else {}
    return _answer(_http().post(f"{provider_url()}/v1/{collection}", json=payload,
                                headers=headers))


def find_by_key(collection: str, key: str) -> ToolResult | None:
    response = _http().get(f"{provider_url()}/v1/{collection}/by-key/{key}")
    if response.status_code == 404:
        return None
    return _answer(response)


def status(collection: str, ref: str) -> ToolResult:
    return _answer(_http().get(f"{provider_url()}/v1/{collection}/{ref}"))


def provider_tool(name: str, collection: str, tool_class: ToolClass, *, lookup: bool = True,
                  honours_key: bool | None = None, send_key: bool = True,
                  recipient_field: str | None = None,
                  check_payload: dict[str, Any] | None = None) -> Tool:
    """A Tool whose call, lookup and status go to ``collection`` at the reference provider."""
    return Tool(
        name,
        tool_class,
        call=lambda payload, key: create(collection, payload, key, send_key=send_key),
        lookup=(lambda key: find_by_key(collection, key)) if lookup else None,
        status=lambda ref: status(collection, ref),
        simulate=lambda payload, key: ToolResult("completed", f"sim_{key[:12]}",
                                                 {"id": f"sim_{key[:12]}", "body": payload}),
        honours_key=honours_key,
        recipient=(lambda p: str(p.get(recipient_field))) if recipient_field else None,
        check_payload=check_payload,
    )


def stats() -> dict[str, Any]:
    response = _http().get(f"{provider_url()}/admin/stats")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
