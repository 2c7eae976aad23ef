"""A TCP gate in front of the test's PostgreSQL: until ``open()`` nothing listens on its
port (a client gets "connection refused", as from a server that is down); once open, every
connection is forwarded to the real server. Processes pointed at the gate see PostgreSQL
come up while they run, without stopping the server every other test shares."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

from sqlalchemy.engine import make_url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Gate:
    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        self.target = (url.host or "127.0.0.1", url.port or 5432)
        self.port = free_port()
        self.url = url.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)
        self.accepted = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """Stop listening and cut every forwarded connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
