"""A TCP gate in front of the test's PostgreSQL: until ``open()`` nothing listens on its
port (a client gets "connection refused", as from a server that is down); once open, every
connection is forwarded to the real server, over TCP or over its Unix socket (the embedded
PostgreSQL listens on a socket named by the URL's ``host`` query parameter). Processes
pointed at the gate see PostgreSQL come up while they run, without stopping the server
every other test shares."""

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
        socket_dir = url.query.get("host")
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            port = url.query.get("port") or url.port or 5432
            self.target: tuple[str, int] | str = f"{socket_dir}/.s.PGSQL.{port}"
        else:
            self.target = (url.host or "127.0.0.1", url.port or 5432)
        self.port = free_port()
        self.url = url.set(host="127.0.0.1", port=self.port).difference_update_query(
            ["host", "port"]).render_as_string(hide_password=False)
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
                server = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.target)
            except OSError:
                server.close()
                raise
            return server
        return socket.create_connection(self.target)

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
