"""A network that can be cut: a TCP relay between the robots and one of the learner's ports.

It forwards bytes both ways untouched (CURVE runs end to end through it). ``cut()`` is a robot's
network going away: every connection through the relay is torn down and new ones are closed as
soon as they arrive, until ``restore()``. The robots' ZeroMQ sockets reconnect by themselves once
the relay lets them through again; what they recorded meanwhile waits in their spools.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlparse

ACCEPT_POLL_S = 0.2  # how often the accept loop looks at whether it was closed
CHUNK_BYTES = 1 << 16


class CuttableRelay:
    """Listens on a free loopback port (``endpoint``) and relays each connection to ``upstream``."""

    def __init__(self, upstream: str) -> None:
        target = urlparse(upstream)
        if target.scheme != "tcp" or target.hostname is None or target.port is None:
            raise ValueError(f"CuttableRelay relays tcp://host:port endpoints, got {upstream!r}")
        self._upstream = (target.hostname, target.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(ACCEPT_POLL_S)
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.connections = 0  # relayed, over the relay's life
        self.refused_while_cut = 0
        self._acceptor = threading.Thread(target=self._accept_loop, name="relay-accept", daemon=True)
        self._acceptor.start()

    def cut(self) -> None:
        """Tear down every relayed connection and refuse new ones."""
        self._cut.set()
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            _shut(sock)

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self._acceptor.join(5)
        self.cut()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                self.refused_while_cut += 1
                _shut(downstream)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=2.0)
            except OSError:  # the learner is down (a kill): the robot's socket retries by itself
                _shut(downstream)
                continue
            for sock in (downstream, upstream):
                sock.settimeout(None)
            with self._lock:
                self._open |= {downstream, upstream}
            self.connections += 1
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, sink), name="relay-pump", daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK_BYTES):
                sink.sendall(data)
        except OSError:
            pass  # torn down (a cut, a kill, the peer went away)
        with self._lock:
            self._open -= {source, sink}
        _shut(source)
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    """Shut down (which wakes a thread blocked in recv on it) and close."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
