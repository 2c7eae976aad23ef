"""HTTP client for the reference provider, and Tool declarations built on it.

The provider's URL comes from ``ONWARD_EXAMPLE_PROVIDER_URL`` at call time, so the same
worker code talks to whichever provider the demo or a test started.

Every request takes the ``timeout`` onward gives the tool's callables (the tool's
``timeout_s``, default ``ONWARD_TOOL_TIMEOUT_S``) as a TOTAL deadline: the client gives up
by then, whatever the provider does, so a call never outlives the lease onward extended to
cover it (docs/effects.md, "The contract an integrator fulfils"). httpx's own timeouts
bound each phase (connect, each write, each read), not the request: a provider that answers
one byte a second would keep a per-read timeout of 5 s waiting forever. So the connection
pool here runs on a network backend that cuts every socket operation at the request's
deadline (``_DeadlineBackend``): connect, TLS, each write and each read get at most the time
left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import typing
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from examples.settings import ExampleSettings
from tasks import (
    Limit,
    RetryPolicy,
    Tool,
    ToolClass,
    ToolError,
    ToolResult,
    credentials,
    parse_retry_after,
)

TIMEOUT = httpx.Timeout(5.0, connect=2.0)  # when no timeout is given (admin requests)

_DEADLINE: ContextVar[float | None] = ContextVar("provider_request_deadline", default=None)
"""When the request in progress must be over (``time.monotonic()``), or None."""


def _timeout(seconds: float | None) -> httpx.Timeout:
    """A request's per-phase limits: ``seconds`` for every phase, connect capped at 2 s; the
    whole request is held to ``seconds`` by ``_deadline``."""
    if seconds is None:
        return TIMEOUT
    return httpx.Timeout(seconds, connect=min(2.0, seconds))


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Hold every socket operation of the requests made inside to ``seconds`` in total."""
    token = _DEADLINE.set(time.monotonic() + seconds if seconds is not None else None)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The time a socket operation may take: its own ``timeout``, cut to what is left of
    the request's deadline; ``error`` once nothing is left."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(
            ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, every operation cut at the request's deadline."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: typing.Iterable[Any] | None = None,
                    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_tcp(
            host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
            socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[Any] | None = None,
                            ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_unix_socket(
            path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on ``_DeadlineBackend`` (httpx has no option for a backend, so the
    pool it built is replaced by an equivalent one on ours)."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=httpx.Limits().max_connections,
            max_keepalive_connections=httpx.Limits().max_keepalive_connections,
            keepalive_expiry=httpx.Limits().keepalive_expiry,
            network_backend=_DeadlineBackend())


def provider_url() -> str:
    url = ExampleSettings().example_provider_url
    if not url:
        raise RuntimeError("ONWARD_EXAMPLE_PROVIDER_URL is not set: start examples.provider")
    return url.rstrip("/")


_client: httpx.Client | None = None
_client_pid = 0


def _http() -> httpx.Client:
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():  # never share sockets across fork
        _client = httpx.Client(timeout=TIMEOUT, transport=_DeadlineTransport())
        _client_pid = os.getpid()
    return _client


class WriteOutcomeUnknown(Exception):
    """A create the provider may have committed: it answered 5xx (a provider can commit,
    then fail before it answers). Not a ``ToolError``, so onward records the call's outcome
    as unknown and reconciles it by a lookup with the idempotency key before anything is
    sent again (docs/effects.md). ``status_code`` and ``retry_after_s`` are the provider's,
    for a tool's retry policy."""

    def __init__(self, message: str, *, status_code: int,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


def _answer(response: httpx.Response, *, write: bool = False) -> ToolResult:
    """What the provider said. A refusal that proves nothing happened is a ``ToolError``:
    any 4xx (a 400, a 409 for a key reused with another body, a 429 rate limit, which the
    provider answers before it acts), or a 5xx to a read. A 5xx to a ``write`` proves
    nothing (``WriteOutcomeUnknown``)."""
    if response.status_code in (200, 201, 202):
        obj: dict[str, Any] = response.json()
        accepted = response.status_code == 202 or obj.get("status") == "processing"
        return ToolResult("accepted" if accepted else "completed", obj["id"], obj)
    message = (f"provider answered {response.status_code}: "
               f"{credentials.redact(response.text[:200])}")
    retry_after_s = parse_retry_after(response.headers.get("retry-after"))
    if write and response.status_code >= 500:
        raise WriteOutcomeUnknown(f"{message} (the write may have been committed before the "
                                  "error: its outcome is unknown)",
                                  status_code=response.status_code, retry_after_s=retry_after_s)
    retryable = response.status_code >= 500 or response.status_code == 429
    raise ToolError(message, retryable=retryable, status_code=response.status_code,
                    retry_after_s=retry_after_s)


@contextlib.contextmanager
def _unreachable_is_refusal() -> Iterator[None]:
    """A connection that could not be made (refused, or not made in time) sent nothing: a
    refusal onward may send again after. Anything later (a dropped connection, a read
    timeout) may follow a request the provider received: an unknown outcome."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise ToolError(f"provider unreachable, nothing was sent: {exc}",
                        retryable=True) from exc


CREDENTIAL = credentials.reference("example_provider_token")
"""The provider's API token, read at each request (``ONWARD_SECRET_EXAMPLE_PROVIDER_TOKEN``
or the file in ``ONWARD_SECRETS_DIR``); requests go without one when it is not configured
(the provider then asks for none)."""


def _auth(headers: dict[str, str] | None = None) -> dict[str, str]:
    token = credentials.lookup(CREDENTIAL)
    return {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}


def _request(method: str, url: str, timeout: float | None, *,
             headers: dict[str, str] | None = None, **options: Any) -> httpx.Response:
    """One request, over (answered or given up, ``httpx.TimeoutException``) within
    ``timeout`` seconds in total, body included; it carries the provider's token."""
    with _deadline(timeout):
        return _http().request(method, url, timeout=_timeout(timeout), headers=_auth(headers),
                               **options)


def create(collection: str, payload: dict[str, Any], idempotency_key: str,
           *, send_key: bool = True, timeout: float | None = None) -> ToolResult:
    headers = {"Idempotency-Key": idempotency_key} if send_key else {}
    with _unreachable_is_refusal():
        response = _request("POST", f"{provider_url()}/v1/{collection}", timeout,
                            json=payload, headers=headers)
    return _answer(response, write=True)


def find_by_key(collection: str, key: str, *, timeout: float | None = None) -> ToolResult | None:
    response = _request("GET", f"{provider_url()}/v1/{collection}/by-key/{key}", timeout)
    if response.status_code == 404:
        return None
    return _answer(response)


def status(collection: str, ref: str, *, timeout: float | None = None) -> ToolResult:
    return _answer(_request("GET", f"{provider_url()}/v1/{collection}/{ref}", timeout))


def provider_tool(name: str, collection: str, tool_class: ToolClass, *, lookup: bool = True,
                  honours_key: bool | None = None, send_key: bool = True,
                  recipient_field: str | None = None,
                  check_payload: dict[str, Any] | None = None,
                  timeout_s: float | None = None, limits: tuple[Limit, ...] = (),
                  retry: RetryPolicy | None = None) -> Tool:
    """A Tool whose call, lookup and status go to ``collection`` at the reference provider;
    each request is given the time limit onward passes (``timeout``); ``limits`` and
    ``retry`` as ``Tool`` takes them (docs/limits.md)."""

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
        limits=limits,
        retry=retry,
    )


def stats() -> dict[str, Any]:
    response = _http().get(f"{provider_url()}/admin/stats")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


# -- the same tool, async (an ``async def`` step awaits it on the worker's event loop) -------

_async_clients: dict[int, httpx.AsyncClient] = {}  # per event loop (a client is bound to one)


def _async_http() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(id(loop))
    if client is None:
        client = _async_clients[id(loop)] = httpx.AsyncClient(timeout=TIMEOUT)
    return client


async def _request_async(method: str, url: str, timeout: float | None,
                         **options: Any) -> httpx.Response:
    """``_request``, awaited: the whole request (body included) is over within ``timeout``
    (``asyncio.timeout``; cancelled at that point, or when the step's timeout passes)."""
    async with asyncio.timeout(timeout):
        return await _async_http().request(method, url, timeout=_timeout(timeout), **options)


def async_provider_tool(name: str, collection: str, tool_class: ToolClass, *,
                        timeout_s: float | None = None) -> Tool:
    """``provider_tool`` with ``async def`` call, lookup and status (httpx.AsyncClient)."""

    async def call(payload: dict[str, Any], key: str, *,
                   timeout: float | None = None) -> ToolResult:
        with _unreachable_is_refusal():
            response = await _request_async("POST", f"{provider_url()}/v1/{collection}",
                                            timeout, json=payload,
                                            headers={"Idempotency-Key": key})
        return _answer(response, write=True)

    async def find(key: str, *, timeout: float | None = None) -> ToolResult | None:
        response = await _request_async(
            "GET", f"{provider_url()}/v1/{collection}/by-key/{key}", timeout)
        return None if response.status_code == 404 else _answer(response)

    async def poll(ref: str, *, timeout: float | None = None) -> ToolResult:
        return _answer(await _request_async("GET", f"{provider_url()}/v1/{collection}/{ref}",
                                            timeout))

    return Tool(name, tool_class, call=call, lookup=find, status=poll, timeout_s=timeout_s)
