"""Malformed input on the learner's weights socket (its PUB) for ``robot-rl bench faults``.

A PUB reads little from its peers: the ZMTP handshake (CURVE here) and subscriptions, all inside
libzmq. What a broken or hostile peer can still put on it, round-robin over ``PUB_CLASSES``: raw TCP
connections of random bytes, a valid ZMTP greeting followed by garbage, a CURVE handshake with a key
the learner does not list, subscriptions longer than ``MAX_SUBSCRIPTION_BYTES`` (the learner
disconnects the peer), random subscriptions and subscribe/unsubscribe floods on one connection, and
messages that are no subscription at all after a valid handshake. Every ``PUB_PROBE_EVERY`` messages
a robot's subscription must still receive one of the learner's weight announcements (it re-announces
every ``ServerConfig.announce_interval_s``), else a hang.

Subscriptions stop at 64 KiB: a subscriber that sent 1 MiB crashes itself (libzmq 4.3.5) when it
closes after the learner dropped it, and this fuzzer runs in the bench's own process.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from robot_rl.bridges.zmq.weight_serving import MAX_SUBSCRIPTION_BYTES

PUB_PROBE_EVERY = 1000  # malformed messages between two checks that a robot still gets announcements
ANNOUNCE_TIMEOUT_S = 10.0  # several of the learner's re-announcements
SESSION_MESSAGES = 2000  # the long-lived connection is renewed this often (its subscriptions die with it)
BATCH = 50  # connections the learner must drop (long subscription, unknown key) waited for together
DROP_TIMEOUT_S = 5.0
# A ZMTP 3.0 greeting: signature, version, mechanism CURVE, as client, filler (64 bytes).
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00") + b"\x00" + bytes(31)

PUB_CLASSES = ("random_bytes_connection", "greeting_then_garbage", "unlisted_key", "oversize_subscription",
               "random_subscription", "subscribe_unsubscribe_flood", "garbage_after_handshake")


class PubFuzzer:
    """Sends one malformed input of a class at a time to ``endpoint`` (a PUB behind CURVE)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, apply_curve: Callable[[zmq.Socket], None],
                 server_key: bytes, seed: int) -> None:
        self.ctx, self.endpoint, self.apply_curve, self.server_key = ctx, endpoint, apply_curve, server_key
        target = urlparse(endpoint)
        assert target.hostname is not None and target.port is not None
        self.address = (target.hostname, target.port)
        self.rng = np.random.default_rng(seed)
        self._session: zmq.Socket | None = None
        self._session_sent = 0
        self._topics: list[bytes] = []
        self._dropping: list[tuple[zmq.Socket, zmq.Socket]] = []  # (socket, its monitor)
        self.dropped = 0  # connections the learner was seen to drop (disconnect or failed handshake)

    def send(self, name: str) -> None:
        getattr(self, f"_{name}")()

    def close(self) -> None:
        self._reap()
        if self._session is not None:
            self._session.close(0)
            self._session = None

    # -- raw TCP

    def _raw(self, payload: bytes) -> None:
        with contextlib.suppress(OSError), socket.create_connection(self.address, timeout=2.0) as conn:
            conn.sendall(payload)

    def _random_bytes_connection(self) -> None:
        self._raw(self.rng.bytes(int(self.rng.integers(1, 256))))

    def _greeting_then_garbage(self) -> None:
        self._raw(GREETING + self.rng.bytes(int(self.rng.integers(1, 256))))

    # -- connections the learner must drop

    def _dropped_socket(self, apply_curve: Callable[[zmq.Socket], None]) -> zmq.Socket:
        if len(self._dropping) >= BATCH:
            self._reap()
        sock = self.ctx.socket(zmq.XSUB)
        sock.linger = 0
        sock.setsockopt(zmq.RECONNECT_IVL, -1)  # dropped once, not again every 100 ms
        apply_curve(sock)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                          | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        sock.connect(self.endpoint)
        self._dropping.append((sock, monitor))
        return sock

    def _unlisted_key(self) -> None:
        public, secret = zmq.curve_keypair()

        def stranger(sock: zmq.Socket) -> None:
            sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, self.server_key

        self._dropped_socket(stranger).send(b"\x01")

    def _oversize_subscription(self) -> None:
        size = int(self.rng.integers(MAX_SUBSCRIPTION_BYTES + 1, 1 << 16))
        self._dropped_socket(self.apply_curve).send(b"\x01" + self.rng.bytes(size))

    def _reap(self) -> None:
        """Wait (bounded) until the learner has dropped each connection of the batch, then close them."""
        deadline = time.monotonic() + DROP_TIMEOUT_S
        for sock, monitor in self._dropping:
            if monitor.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                recv_monitor_message(monitor)
                self.dropped += 1
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
        self._dropping = []

    # -- one long-lived connection with a valid key

    def _on_session(self, frames: list[bytes]) -> None:
        if self._session is None or self._session_sent >= SESSION_MESSAGES:
            if self._session is not None:
                self._session.close(0)
            self._session = self.ctx.socket(zmq.XSUB)
            self._session.linger = 0
            self.apply_curve(self._session)
            self._session.connect(self.endpoint)
            self._session_sent, self._topics = 0, []
        with contextlib.suppress(zmq.Again):  # a full queue toward the learner: that message is dropped here
            self._session.send_multipart(frames, zmq.NOBLOCK)
        self._session_sent += 1

    def _random_subscription(self) -> None:
        self._on_session([b"\x01" + self.rng.bytes(int(self.rng.integers(0, 200)))])

    def _subscribe_unsubscribe_flood(self) -> None:
        if self._topics and self.rng.random() < 0.5:
            self._on_session([b"\x00" + self._topics.pop()])
        else:
            topic = self.rng.bytes(int(self.rng.integers(0, 64)))
            self._topics.append(topic)
            self._on_session([b"\x01" + topic])

    def _garbage_after_handshake(self) -> None:
        frames = [self.rng.bytes(int(self.rng.integers(1, 128))) for _ in range(int(self.rng.integers(1, 4)))]
        frames[0] = bytes([int(self.rng.integers(2, 256))]) + frames[0]  # neither subscribe (1) nor unsubscribe (0)
        self._on_session(frames)


def announcement_arrives(watcher: zmq.Socket, timeout_s: float = ANNOUNCE_TIMEOUT_S) -> bool:
    """The next weights announcement on a robot's subscription (``watcher``), within ``timeout_s``."""
    while watcher.poll(0):
        watcher.recv_multipart()
    if not watcher.poll(int(timeout_s * 1000)):
        return False
    watcher.recv_multipart()
    return True


def fuzz_pub(fuzzer: PubFuzzer, watcher: zmq.Socket, messages: int, alive: Callable[[], bool]) -> dict[str, Any]:
    """Send ``messages`` malformed inputs round-robin over ``PUB_CLASSES``; count hangs and crashes."""
    sent: Counter[str] = Counter()
    hangs = crashes = 0
    started = time.monotonic()
    if not announcement_arrives(watcher):
        raise RuntimeError("bench faults: a robot's subscription got no weights announcement before the fuzzing")
    try:
        for i in range(messages):
            name = PUB_CLASSES[i % len(PUB_CLASSES)]
            fuzzer.send(name)
            sent[name] += 1
            if (i + 1) % PUB_PROBE_EVERY == 0 or i + 1 == messages:
                if not alive():
                    crashes += 1
                    break
                hangs += int(not announcement_arrives(watcher))
    finally:
        fuzzer.close()
    return {"messages": int(sum(sent.values())), "classes": len(PUB_CLASSES), "by_class": dict(sent),
            "connections_dropped": fuzzer.dropped, "crashes": crashes + int(not alive()), "hangs": hangs,
            "seconds": round(time.monotonic() - started, 1)}
