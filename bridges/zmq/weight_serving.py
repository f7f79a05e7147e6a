"""The learner's weight serving: the versions it serves, the pins, and the weights socket.

Serving chunks of a published snapshot is pure transport, so the wire keeps the last few
``WeightsBlob`` s itself (``keep_weight_versions``) plus every pinned version. ``publish`` and
``pin`` may be called from any thread: they queue the change under a lock and wake the serving
loop (``wake_socket``), which applies it in ``take_changes`` and says it on the weights socket.

The weights socket is an XPUB, so the learner sees what peers subscribe to. A robot subscribes to
the empty topic (every announcement) and to nothing else. libzmq keeps every topic a peer subscribes
to, ~45 bytes of its topic tree per byte of topic, until that peer's connection ends, and a peer may
send any number. Three bounds keep it small:

* a topic is at most ``MAX_SUBSCRIPTION_BYTES`` long (libzmq disconnects a peer past it), as short as
  a robot's CURVE handshake allows, so one topic costs at most ~17 KB;
* libzmq moves a peer's subscriptions into the tree on the learner's thread, in one pass that lasts
  while the connection's queue keeps filling; a queue of two messages (``SUBSCRIPTION_QUEUE``) makes
  the I/O thread wait for that thread every message or two, so a pass ends soon and the count is read;
* past ``max_foreign_subscriptions`` topics no robot sends, the learner opens the socket anew on the
  same address (it cannot end one connection of an XPUB), which ends every connection and frees every
  topic (said once a minute, counted as ``weights_socket_reopened``). The robots' SUB sockets reconnect
  and subscribe again by themselves within their reconnect interval; the next announcement (every
  ``announce_interval_s``, and after each hello on the request socket) reaches them.

``XPUB_MANUAL`` would not help: libzmq 4.3 still keeps every topic of a manual XPUB's peers, to send
their unsubscriptions when they leave.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import cast

import zmq

from robot_rl.bridges.zmq.protocol import Error, Message, WeightsAnnounce, WeightsFetch, encode_message
from robot_rl.bridges.zmq.weights import WeightsBlob

log = logging.getLogger(__name__)

# The largest inbound message the weights socket takes. It receives only subscriptions (robots send an
# empty one) and the handshake's commands, which count too: a SUB's CURVE INITIATE is 276 bytes.
MAX_SUBSCRIPTION_BYTES = 384
# Subscriptions queued from one peer for the learner's thread (RCVHWM; see above). Not 1: with one, a
# CURVE robot's subscription did not get through and it heard no announcement.
SUBSCRIPTION_QUEUE = 2
REOPEN_SAID_EVERY_S = 60.0  # the weights socket's re-opening is said at most this often


class WeightServing:
    """Versions served, pins, and the weights socket of one server (``ZmqServer`` holds one)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, configure: Callable[[zmq.Socket], None],
                 keep_versions: int, max_foreign_subscriptions: int, counters: collections.Counter[str]) -> None:
        self._ctx, self._configure = ctx, configure  # configure: CURVE, on every weights socket opened
        self.keep_versions = keep_versions
        self.max_foreign_subscriptions = max_foreign_subscriptions
        self.counters = counters  # the server's: weight_chunks_sent, subscriptions_refused, weights_socket_reopened
        self._blobs: collections.OrderedDict[int, WeightsBlob] = collections.OrderedDict()
        self._to_publish: list[WeightsBlob] = []
        self._lock = threading.Lock()
        self._fleet_pin: int | None = None  # every robot's version (None: the newest), under _lock
        self._robot_pins: dict[str, int] = {}  # robots pinned apart from the fleet, under _lock
        self._pins_changed = False
        self._last_announce_s = 0.0
        self._foreign = 0  # topics no robot sends that the socket holds
        self._reopen_said_s = -REOPEN_SAID_EVERY_S
        self.socket: zmq.Socket | None = self._open(endpoint)  # None: closed, its address not free yet
        self.endpoint: str = cast(bytes, self.socket.last_endpoint).decode()
        self.reopened = False  # set when ``socket`` is another object (the server's poller follows)
        # publish and pin (any thread) wake the serving loop, so a change waits for no poll timeout.
        wake = f"inproc://wake-{id(self)}"
        self.wake_socket = ctx.socket(zmq.PAIR)
        self.wake_socket.bind(wake)
        self._wake_tx = ctx.socket(zmq.PAIR)  # used under _lock only: one thread at a time
        self._wake_tx.connect(wake)

    def _open(self, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.XPUB)
        sock.linger = 0
        # Inbound bytes per message, enforced by libzmq (a peer past it is disconnected): a long
        # subscription is only memory in the topic tree (a 1 MiB one cost the learner ~88 MB).
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES)
        sock.setsockopt(zmq.RCVHWM, SUBSCRIPTION_QUEUE)
        self._configure(sock)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
        return sock

    # ------------------------------------------------------------ any thread

    def publish(self, blob: WeightsBlob) -> None:
        with self._lock:
            self._to_publish.append(blob)
            self._wake()

    @property
    def latest(self) -> WeightsBlob | None:
        return next(reversed(self._blobs.values()), None)

    def served_versions(self) -> list[int]:
        return list(self._blobs.copy())  # OrderedDict.copy is atomic: safe from other threads

    def pin(self, version: int | None, robot_id: str | None = None) -> None:
        with self._lock:
            if version is not None and version not in self._blobs:
                raise ValueError(f"weights v{version} are not served any more: pin one of {self.served_versions()} "
                                 f"(the learner keeps its last learner.service.keep_weight_versions versions and "
                                 f"every pinned one)")
            if robot_id is None:
                self._fleet_pin = version
                self._robot_pins.clear()
            elif version is None:
                self._robot_pins.pop(robot_id, None)
            else:
                self._robot_pins[robot_id] = version
            self._pins_changed = True
            self._wake()
        log.info("weights pinned: %s -> %s", robot_id or "every robot", f"v{version}" if version is not None
                 else "the newest")

    def pinned_version(self, robot_id: str | None = None) -> int | None:
        with self._lock:
            return self._robot_pins.get(robot_id, self._fleet_pin) if robot_id is not None else self._fleet_pin

    def _wake(self) -> None:
        with contextlib.suppress(zmq.Again):
            self._wake_tx.send(b"", zmq.NOBLOCK)  # one pending wake-up is enough

    # ------------------------------------------------------------ serving thread

    def take_changes(self) -> tuple[list[WeightsBlob], bool]:
        """Serve what was published since the last call (the oldest unpinned versions beyond
        ``keep_versions`` are dropped and retired); returns the new versions and whether pins changed."""
        with self._lock:
            new, self._to_publish = self._to_publish, []
            with contextlib.suppress(zmq.Again):
                while True:
                    self.wake_socket.recv(zmq.NOBLOCK)
            pins_changed, self._pins_changed = self._pins_changed, False
            # Under the lock ``pin`` checks against: a pin lands before a version is dropped (and keeps
            # it) or after (and is refused), never between the two.
            pinned = {*self._robot_pins.values(), self._fleet_pin}
            dropped = []
            for blob in new:
                self._blobs[blob.version] = blob
                unpinned = [v for v in self._blobs if v not in pinned]
                while len(unpinned) > self.keep_versions:
                    dropped.append(self._blobs.pop(unpinned.pop(0)))
        for blob in dropped:
            blob.retire()
        for blob in new:
            log.info("publishing weights v%d (%d bytes, %d chunks)", blob.version, len(blob.data), blob.num_chunks)
        return new, pins_changed

    def announce(self, now: float, interval_s: float, *, at_once: bool) -> None:
        """Announce the newest version to every subscriber, ``at_once`` or every ``interval_s``."""
        latest = self.latest
        if self.socket is not None and latest and (at_once or now - self._last_announce_s >= interval_s):
            self.socket.send_multipart(encode_message(latest.announce()), copy=False)
            self._last_announce_s = now

    def announcement_for(self, robot_id: str) -> WeightsAnnounce | None:
        """What ``robot_id`` is to run, said to it alone: its pinned version, else the newest."""
        version = self.pinned_version(robot_id)
        blob = self._blobs.get(version) if version is not None else None
        if blob is not None:
            return blob.announce(pinned=True)
        latest = self.latest
        return latest.announce() if latest is not None else None

    def chunk(self, msg: WeightsFetch) -> Message:
        blob = self._blobs.get(msg.version)
        if blob is None or msg.chunk >= blob.num_chunks:
            return Error(code="weights_unavailable", in_reply_to=msg.TYPE, message=(
                f"weights v{msg.version} chunk {msg.chunk} is not served (versions served: {list(self._blobs)})"))
        self.counters["weight_chunks_sent"] += 1
        return blob.chunk_message(msg.chunk)

    def read_subscriptions(self, now: float) -> None:
        """Count what peers subscribed to; past ``max_foreign_subscriptions`` topics no robot sends,
        close the socket (every subscriber and its topics go) and bind it anew (``reopened``)."""
        if self.socket is None:  # closed; its address not free yet
            self._rebind()
            return
        while self._foreign <= self.max_foreign_subscriptions:
            try:
                message = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == b"\x01" and len(message) > 1:
                self._foreign += 1
                self.counters["subscriptions_refused"] += 1
        if now - self._reopen_said_s >= REOPEN_SAID_EVERY_S:
            log.warning("the weights socket holds %d subscriptions no robot sends (a broken or hostile peer); "
                        "opening it anew: every subscriber is dropped, robots subscribe again by themselves "
                        "(said at most once a minute; counted as weights_socket_reopened)", self._foreign)
            self._reopen_said_s = now
        self.counters["weights_socket_reopened"] += 1
        self.socket.close(0)
        self.socket, self._foreign = None, 0
        self.reopened = True  # the poller forgets the closed socket
        self._rebind()

    def _rebind(self) -> None:
        """Bind the weights socket again; while the closed one's listener still holds the address
        (libzmq closes it on its own thread, a moment later), the next housekeeping tries again."""
        try:
            self.socket = self._open(self.endpoint)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
            return
        self.reopened = True

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(0)
        self._wake_tx.close(0)
        self.wake_socket.close(0)
