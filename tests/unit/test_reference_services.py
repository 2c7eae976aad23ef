"""The reference services in examples/ answer without Nagle's delay on kept-alive connections.

Both write an answer's headers and its body separately; with Nagle's algorithm on, the body
waited for the client's delayed acknowledgement of the headers (~40 ms on this machine, on
every answer after a connection's first), which the benches counted as onward's overhead.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.model_server import listening_socket
from examples.provider import ProviderServer


def test_model_server__connections_are_accepted_with_tcp_nodelay() -> None:
    sock = listening_socket(0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client = socket.create_connection(sock.getsockname())
        accepted, _ = sock.accept()
        try:  # Linux copies the option from the listening socket to the accepted one
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            accepted.close()
            client.close()
    finally:
        sock.close()


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[ProviderServer]:
    server = ProviderServer(0, tmp_path / "provider.db")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_provider__each_connection_has_tcp_nodelay(provider: ProviderServer) -> None:
    seen: list[int] = []
    handler = provider.RequestHandlerClass
    setup = handler.setup

    def recording_setup(self: object) -> None:
        setup(self)  # type: ignore[arg-type]
        seen.append(self.connection.getsockopt(  # type: ignore[attr-defined]
            socket.IPPROTO_TCP, socket.TCP_NODELAY))

    handler.setup = recording_setup  # type: ignore[method-assign]
    with socket.create_connection(provider.server_address) as client:
        client.sendall(b"GET /admin/objects HTTP/1.1\r\nHost: test\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
    assert seen and all(seen)
