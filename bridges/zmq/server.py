"""Learner side of the wire: a ROUTER for requests, dispatched here, and a weights socket.

The server only moves and validates messages. What to *do* with them (store
segments exactly once, track robots) belongs to the learner, which plugs in a
``ServerHandlers`` subclass. Weights are the exception: serving chunks of a
published snapshot is pure transport, so the server keeps the last few
``WeightsBlob`` s itself (``weight_serving.py``: versions, pins, the weights socket).

Threading: every socket call happens inside ``serve_once`` (call it from one
thread in a loop, or use ``serve_forever``). ``publish_weights`` may be called
from any thread; it takes effect on the next ``serve_once``.

Bad input never stops the loop: an undecodable message gets an ``error`` reply
and is dropped; a handler exception is logged and answered with ``internal``. A peer
without an accepted hello is told only a generic code ("send hello first", "refused"):
what was wrong goes to the learner's log, never to a peer it does not know.

Every sender (a CURVE key, else a connection) is held to ``PeerLimits`` (``admission.py``): a
message rate, a number of sessions per robot and in all, and a budget of refused messages past
which it is ignored for a cool-off. Robots streaming normally never come near them.

Segments are handled in batches: ``serve_once`` collects the segments that are ready
(up to ``ServerConfig.segment_batch``) and hands them to ``ServerHandlers.on_segments``
at once, so the learner can make them durable with one fsync (group commit) before
any of their acks goes out. Other messages are answered as they come.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import zmq

from robot_rl.bridges.zmq.admission import Admission, PeerLimits
from robot_rl.bridges.zmq.codec import DEFAULT_LIMITS, BusyError, Limits
from robot_rl.bridges.zmq.keys import ServerCurve, apply_server_curve, check_endpoint_security, start_authenticator
from robot_rl.bridges.zmq.protocol import (
    Ack,
    Error,
    Heartbeat,
    Hello,
    HelloOk,
    Message,
    ProtocolError,
    Refused,
    Segment,
    Stats,
    WeightsFetch,
    decode_message,
    encode_message,
    error_for,
    segment_refusal,
)
from robot_rl.bridges.zmq.weight_serving import WeightServing
from robot_rl.bridges.zmq.weights import WeightsBlob

log = logging.getLogger(__name__)


# Replies that say nothing against the sender: the learner restarted (hello again), a weights version
# rotated out, a learner bug. Every other error reply is a refused message, counted against its sender.
_NOT_THE_SENDERS_FAULT = frozenset({"hello_required", "weights_unavailable", "internal"})


@dataclass
class ServerConfig:
    """Where to listen and how strict to be. Port ``*`` binds a free port (see ``ZmqServer.router_endpoint``)."""

    router_endpoint: str = "tcp://127.0.0.1:*"
    pub_endpoint: str = "tcp://127.0.0.1:*"
    server_id: str = "learner"
    config_hash: str = ""  # "" accepts any client config hash
    limits: Limits = DEFAULT_LIMITS
    curve: ServerCurve | None = None
    allow_insecure: bool = False  # plain TCP off loopback (logged)
    heartbeat_interval_s: float = 1.0  # told to clients in hello_ok
    peer_timeout_s: float = 15.0  # forget a robot silent for this long
    announce_interval_s: float = 2.0  # re-announce the latest weights for late subscribers
    # Versions served besides every pinned one: robots finishing a download, and what a robot can be
    # pinned or the fleet rolled back to (``pin``). Each is held in memory, at its published size.
    keep_weight_versions: int = 2
    max_batch: int = 256  # messages handled per serve_once before housekeeping
    segment_batch: int = 32  # segments handed to on_segments at once (one group commit, then their acks)
    peer_limits: PeerLimits = field(default_factory=PeerLimits)  # what one sender may cost
    # Subscriptions on the weights socket to topics no robot sends (robots subscribe to the empty one);
    # past it the socket is opened anew, dropping every subscriber (weight_serving.py says why).
    max_foreign_subscriptions: int = 64


@dataclass
class Peer:
    """One connected edge client, as the server sees it."""

    identity: bytes
    robot_id: str
    config_hash: str
    policy_version: int
    connected_s: float
    last_seen_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    key: str | None = None  # the CURVE public key its hello was authenticated with (None without CURVE)
    held_by_another_key: bool = False  # the last message on its routing id came with another key

    @property
    def sender(self) -> bytes:
        return _sender(self.identity, self.key)


class ServerHandlers:
    """Learner callbacks. Override what you need; each runs on the serving thread.

    Contract for ``on_segment``: return ``Ack`` once the segment is durably stored,
    and also for a duplicate (same robot_id, episode_id, seq) with ``duplicate=True``
    -- otherwise the edge keeps re-sending it. Return ``Error`` to refuse it (the
    edge retries later).
    """

    def on_hello(self, peer: Peer, msg: Hello) -> Error | None:
        """Return an Error to refuse the robot; None accepts it."""
        return None

    def on_segment(self, peer: Peer, msg: Segment) -> Ack | Error:
        return Error(code="rejected", message="this learner has no segment ingest configured", in_reply_to=msg.TYPE)

    def on_segments(self, items: list[tuple[Peer, Segment]]) -> list[Ack | Error | Exception]:
        """The segments received together, in arrival order; one reply (or exception) per item.

        Override to store a batch durably with one fsync before acking all of it. The
        default calls ``on_segment`` for each. An exception in the list is answered like one
        raised by ``on_segment`` (``ProtocolError``: its error; ``BusyError``: ``busy``, the robot
        sends it again later and it is not held against it; anything else: ``internal``).
        """
        replies: list[Ack | Error | Exception] = []
        for peer, msg in items:
            try:
                replies.append(self.on_segment(peer, msg))
            except Exception as exc:  # noqa: BLE001 - answered per item by the server
                replies.append(exc)
        return replies

    def on_heartbeat(self, peer: Peer, msg: Heartbeat) -> None:
        return None

    def on_stats(self, peer: Peer, msg: Stats) -> None:
        return None

    def on_peer_lost(self, peer: Peer) -> None:
        """``peer.robot_id`` holds no session any more (silent past the peer timeout, ignored, or its
        connection now speaks as another robot): forget what is kept per robot."""
        return None


class ZmqServer:
    """The learner's endpoint. ``with ZmqServer(cfg, handlers) as srv: while ...: srv.serve_once(100)``."""

    def __init__(self, config: ServerConfig, handlers: ServerHandlers | None = None) -> None:
        for endpoint in (config.router_endpoint, config.pub_endpoint):
            check_endpoint_security(endpoint, config.curve, config.allow_insecure)
        self.config = config
        self.handlers = handlers or ServerHandlers()
        self.counters: collections.Counter[str] = collections.Counter()
        self._peers: dict[bytes, Peer] = {}
        self._admission = Admission(config.peer_limits, self.counters)
        self._sessions_full_logged = False
        self._ctx = zmq.Context()
        self._auth = start_authenticator(self._ctx, config.curve.allowed_clients) if config.curve else None
        self._router = self._bind(zmq.ROUTER, config.router_endpoint)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting client keeps its routing id
        self._weights = WeightServing(self._ctx, config.pub_endpoint, self._secure, config.keep_weight_versions,
                                      config.max_foreign_subscriptions, self.counters)
        self.router_endpoint: str = cast(bytes, self._router.last_endpoint).decode()
        self.pub_endpoint: str = self._weights.endpoint
        self._poller = self._new_poller()
        log.info("learner server %s: requests on %s, weights on %s, CURVE %s", config.server_id,
                 self.router_endpoint, self.pub_endpoint, "on" if config.curve else "off")

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.limits.max_message_bytes)  # a peer past it is disconnected
        sock.setsockopt(zmq.RCVHWM, self.config.peer_limits.max_queued_messages)
        self._secure(sock)
        sock.bind(endpoint)
        return sock

    def _secure(self, sock: zmq.Socket) -> None:
        if self.config.curve:
            apply_server_curve(sock, self.config.curve)

    def _new_poller(self) -> zmq.Poller:
        """What ``serve_once`` waits on: requests, subscriptions, and wake-ups for what to publish or pin
        (built anew when the weights socket is)."""
        poller = zmq.Poller()
        for sock in (self._router, self._weights.socket, self._weights.wake_socket):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        return poller

    # ------------------------------------------------------------ public API

    def serve_once(self, timeout_ms: int = 100) -> int:
        """Wait up to ``timeout_ms`` for requests, handle all that are ready, do housekeeping.

        Returns the number of requests handled (dropped ones included: over the rate, or from an
        ignored sender).
        """
        handled = 0
        if self._poller.poll(timeout_ms):
            segments: list[_QueuedSegment] = []
            try:
                while handled < self.config.max_batch:
                    try:
                        frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    handled += 1
                    identity, body = frames[0].bytes, frames[1:]
                    key = _authenticated_key(body) if self.config.curve else None
                    sender = _sender(identity, key)
                    if not self._admission.admit(sender, time.monotonic(), partial(self._name, sender, identity)):
                        continue
                    self._handle(identity, sender, key, body, segments)
                    if len(segments) >= self.config.segment_batch:
                        self._handle_segments(segments)
                        segments = []
            finally:
                self._handle_segments(segments)
        self._housekeeping()
        return handled

    def serve_forever(self, stop: threading.Event, timeout_ms: int = 100) -> None:
        while not stop.is_set():
            self.serve_once(timeout_ms)

    def publish_weights(self, blob: WeightsBlob) -> None:
        """Serve ``blob`` and announce it (thread-safe; the serving loop wakes up and sends it at once)."""
        self._weights.publish(blob)

    @property
    def latest_weights(self) -> WeightsBlob | None:
        return self._weights.latest

    def served_versions(self) -> list[int]:
        """The versions robots can fetch now, oldest first: what a robot can be pinned to."""
        return self._weights.served_versions()

    def pin(self, version: int | None, robot_id: str | None = None) -> None:
        """Have ``robot_id`` run weights ``version`` (None: the newest again, or the fleet's pin) from
        its next chunk on, or, with ``robot_id`` None, every robot now and later (a fleet rollback;
        it clears every robot's own pin). Thread-safe; the robots are told on the serving thread,
        and a robot that says hello later is told at once. A pinned version is served until unpinned."""
        self._weights.pin(version, robot_id)

    def pinned_version(self, robot_id: str | None = None) -> int | None:
        """The version ``robot_id`` (None: the fleet) is pinned to; None: it follows the newest."""
        return self._weights.pinned_version(robot_id)

    def peers(self) -> list[Peer]:
        return list(self._peers.copy().values())  # dict.copy is atomic: safe from other threads

    def close(self) -> None:
        self._router.close(0)
        self._weights.close()
        if self._auth:
            self._auth.stop()
        self._ctx.term()

    def __enter__(self) -> ZmqServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ per-sender limits

    def _name(self, sender: bytes, identity: bytes) -> str:
        """A sender for logs: the robot its CURVE key or session belongs to, else its connection (``who``)."""
        if self.config.curve is not None and sender.startswith(b"key:"):
            return f"robot {self.config.curve.client_names.get(sender[4:], '?')!r} (its CURVE key)"
        peer = self._peers.get(identity)
        return f"robot {peer.robot_id!r} (its connection)" if peer is not None else f"connection {who(identity)}"

    def _answer(self, identity: bytes, sender: bytes, reply: Message | None) -> None:
        """Send ``reply``; an error the sender caused counts against it."""
        if reply is None:
            return
        held_against = isinstance(reply, Refused) or (isinstance(reply, Error)
                                                      and reply.code not in _NOT_THE_SENDERS_FAULT)
        if held_against and self._admission.refused(sender, time.monotonic(), partial(self._name, sender, identity)):
            for gone in [p for p in self._peers.values() if p.sender == sender]:
                self._forget(gone.identity)  # ignored for a cool-off: its sessions go now
        self._reply(identity, reply)

    # ------------------------------------------------------------ dispatch

    def _handle(self, identity: bytes, sender: bytes, key: str | None, frames: list[zmq.Frame],
                segments: list[_QueuedSegment] | None = None) -> None:
        """Decode and answer one message; a valid segment is appended to ``segments`` instead (if given)."""
        self.counters["messages"] += 1
        peer = self._peers.get(identity)
        try:
            msg = decode_message(frames, self.config.limits)
        except ProtocolError as exc:
            self._refuse_undecodable(identity, sender, peer, str(exc), exc.code, error_for(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a decoder bug must not end the serving loop
            self._refuse_undecodable(identity, sender, peer, f"the decoder failed on it: {type(exc).__name__}: {exc}",
                                     "bad_message", Error(code="bad_message",
                                                          message="the learner cannot decode this message"))
            return
        if peer is not None and self._impersonates(peer, key, msg):
            self._answer(identity, sender, Error(
                code="identity_mismatch", in_reply_to=msg.TYPE,
                message="this message was not sent with the key this session said hello with"))
            return
        if segments is not None and isinstance(msg, Segment) and peer is not None and msg.robot_id == peer.robot_id:
            peer.last_seen_s = time.monotonic()
            self.counters["segments"] += 1
            segments.append(_QueuedSegment(identity, sender, peer, msg))
            return
        try:
            if isinstance(msg, Hello) and self.config.curve is not None:
                refusal = self.config.curve.robot_id_refusal(key, msg.robot_id)
                if refusal is not None:
                    log.error("refused hello from %s: %s", who(identity), refusal)
                    self._answer(identity, sender, Error(code="identity_mismatch", message=refusal,
                                                         in_reply_to=msg.TYPE))
                    return
            reply: Message | None = self._dispatch(identity, msg, key)
        except BusyError as exc:  # nothing wrong with it: the learner cannot take it now
            self._reply(identity, Error(code="busy", message=str(exc), in_reply_to=msg.TYPE))
            return
        except ProtocolError as exc:  # e.g. decode_segment in the handler found the steps inconsistent
            self.counters["bad_messages"] += 1
            log.warning("refused %s from %s: %s", msg.TYPE, who(identity), exc)
            reply = segment_refusal(exc, msg) if isinstance(msg, Segment) else error_for(exc, msg.TYPE)
        except Exception as exc:  # a handler bug must not take the learner down
            self.counters["handler_errors"] += 1
            log.exception("handler failed on %s from %s", msg.TYPE, who(identity))
            reply = Error(code="internal", message=f"learner failed on {msg.TYPE}: {type(exc).__name__}: {exc}",
                          in_reply_to=msg.TYPE)
        self._answer(identity, sender, reply)

    def _refuse_undecodable(self, identity: bytes, sender: bytes, peer: Peer | None, reason: str, code: str,
                            detailed: Error) -> None:
        """Answer a message that does not decode: what was wrong to a robot with a session, only a
        generic code to a peer the learner does not know (its log has the details either way)."""
        self.counters["bad_messages"] += 1
        log.warning("refused a message from %s: %s", who(identity), reason)
        generic = Error(code="version_mismatch" if code == "version_mismatch" else "bad_message", message="refused")
        self._answer(identity, sender, detailed if peer is not None else generic)

    def _handle_segments(self, batch: list[_QueuedSegment]) -> None:
        if not batch:
            return
        try:
            replies = list(self.handlers.on_segments([(item.peer, item.msg) for item in batch]))
            if len(replies) != len(batch):
                raise RuntimeError(f"on_segments returned {len(replies)} replies for {len(batch)} segments")
        except Exception as exc:  # noqa: BLE001 - a handler bug must not take the learner down; every segment is retried
            replies = [exc] * len(batch)
        for item, reply in zip(batch, replies, strict=True):
            msg = item.msg
            if isinstance(reply, BusyError):  # the store's bound or its disk: not the robot's fault, and said there
                self.counters["segments_deferred"] += 1
                self._reply(item.identity, Error(code="busy", message=str(reply), in_reply_to=msg.TYPE))
                continue
            answer: Message
            if isinstance(reply, ProtocolError):
                self.counters["bad_messages"] += 1
                log.warning("refused %s from %s: %s", msg.TYPE, who(item.identity), reply)
                answer = segment_refusal(reply, msg)
            elif isinstance(reply, Exception):
                self.counters["handler_errors"] += 1
                log.error("handler failed on %s from %s", msg.TYPE, who(item.identity), exc_info=reply)
                answer = Error(code="internal", message=f"learner failed on {msg.TYPE}: {type(reply).__name__}: "
                               f"{reply}", in_reply_to=msg.TYPE)
            else:
                answer = reply
            self._answer(item.identity, item.sender, answer)

    def _impersonates(self, peer: Peer, key: str | None, msg: Message) -> bool:
        """True when a message on a robot's connection was not sent with the key its hello was.

        The routing id alone proves nothing: any client can set it, and ROUTER_HANDOVER gives the newest
        connection with that id the session. With CURVE, every message carries the key ZAP authenticated
        its connection with, so a robot holding its own valid key still cannot write as another robot,
        nor say hello on its routing id: the id stays bound to the key that first said hello on it.
        Until that key is heard on it again, the connection holding the id is not the robot's, and it
        is sent nothing but the refusal (``_reply``): the robot's replies do not go to another key.
        """
        if self.config.curve is None or key == peer.key:
            peer.held_by_another_key = False
            return False
        peer.held_by_another_key = True
        self.counters["impersonations_refused"] += 1
        log.error("refused %s on robot %s's session: sent with another key than its hello", msg.TYPE, peer.robot_id)
        return True

    def _dispatch(self, identity: bytes, msg: Message, key: str | None) -> Message | None:
        if isinstance(msg, Hello):
            return self._on_hello(identity, msg, key)
        peer = self._peers.get(identity)
        if peer is None:
            return Error(code="hello_required", message="send hello first (or again: the learner restarted "
                         "or forgot this connection)", in_reply_to=msg.TYPE)
        peer.last_seen_s = time.monotonic()
        if isinstance(msg, Segment):
            return self._on_segment(peer, msg)
        if isinstance(msg, WeightsFetch):
            return self._weights.chunk(msg)
        if isinstance(msg, Heartbeat):
            peer.policy_version, peer.stats = msg.policy_version, dict(msg.stats)
            self.handlers.on_heartbeat(peer, msg)
            latest = self.latest_weights
            return Heartbeat(sender=self.config.server_id, policy_version=latest.version if latest else -1,
                             time_s=time.monotonic(), stats={"peers": len(self._peers)})
        if isinstance(msg, Stats):
            peer.stats.update(msg.stats)
            self.handlers.on_stats(peer, msg)
            return None
        if isinstance(msg, Error):
            log.warning("robot %s reports error %s: %s", peer.robot_id, msg.code, msg.message)
            return None
        return Error(code="unexpected", message=f"the learner does not accept {msg.TYPE!r} messages",
                     in_reply_to=msg.TYPE)

    def _on_hello(self, identity: bytes, msg: Hello, key: str | None) -> Message | None:
        cfg = self.config
        if cfg.config_hash and msg.config_hash != cfg.config_hash:
            log.error("robot %s refused: config hash %s, learner has %s", msg.robot_id, msg.config_hash,
                      cfg.config_hash)
            return Error(code="config_mismatch", in_reply_to=msg.TYPE, message=(
                f"config hash {msg.config_hash!r} differs from the learner's: run the edge with the same "
                "policy/robot config as the learner (the learner's log names its hash; a client is not told it)"))
        own = sorted((p for i, p in self._peers.items() if p.robot_id == msg.robot_id and i != identity),
                     key=lambda p: p.last_seen_s)
        if identity not in self._peers and not own and len(self._peers) >= cfg.peer_limits.max_sessions:
            self.counters["hellos_refused_full"] += 1
            if not self._sessions_full_logged:
                log.error("refusing new robots: the learner holds %d sessions (learner.service.peer_limits."
                          "max_sessions); it takes new ones as others go silent", len(self._peers))
                self._sessions_full_logged = True
            raise BusyError("the learner serves as many robots as it takes; it will take this one when others go")
        now = time.monotonic()
        peer = Peer(identity, msg.robot_id, msg.config_hash, msg.policy_version, now, now, key=key)
        refusal = self.handlers.on_hello(peer, msg)
        if refusal is not None:
            return refusal
        if identity not in self._peers:
            log.info("robot %s connected (policy v%d)", msg.robot_id, msg.policy_version)
            # The robot's oldest sessions make room (an edge restarted within peer_timeout_s left one behind).
            while own and (len(own) >= cfg.peer_limits.max_sessions_per_robot
                           or len(self._peers) >= cfg.peer_limits.max_sessions):
                del self._peers[own.pop(0).identity]
                self.counters["sessions_replaced"] += 1
        replaced = self._peers.get(identity)
        self._peers[identity] = peer
        if replaced is not None and replaced.robot_id != peer.robot_id:  # the connection speaks as another robot now
            self._lost(replaced)
        latest = self.latest_weights
        self._reply(identity, HelloOk(server_id=cfg.server_id, config_hash=cfg.config_hash,
                                      latest_version=latest.version if latest else -1,
                                      heartbeat_interval_s=cfg.heartbeat_interval_s,
                                      max_message_bytes=cfg.limits.max_message_bytes))
        # What to run: its pin, or the newest (whose PUB announcement may have gone out before it subscribed).
        return self._weights.announcement_for(msg.robot_id)

    def _on_segment(self, peer: Peer, msg: Segment) -> Message:
        if msg.robot_id != peer.robot_id:
            return Error(code="unexpected", in_reply_to=msg.TYPE, message=(
                f"segment for robot {msg.robot_id!r} on the connection of robot {peer.robot_id!r}"))
        self.counters["segments"] += 1
        return self.handlers.on_segment(peer, msg)

    def _reply(self, identity: bytes, msg: Message) -> None:
        peer = self._peers.get(identity)
        if peer is not None and peer.held_by_another_key and not isinstance(msg, Error):
            self.counters["replies_withheld"] += 1  # the connection with this id now is another robot's
            return
        try:
            self._router.send_multipart([identity, *encode_message(msg)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # peer gone or its queue full: it will retry
            log.debug("reply %s to %s dropped: %s", msg.TYPE, who(identity), exc)

    # ------------------------------------------------------------ housekeeping

    def _housekeeping(self) -> None:
        now = time.monotonic()
        new, pins_changed = self._weights.take_changes()
        if pins_changed:
            for identity, peer in list(self._peers.items()):
                announcement = self._weights.announcement_for(peer.robot_id)
                if announcement is not None:
                    self._reply(identity, announcement)
        self._weights.read_subscriptions(now)
        if self._weights.reopened:
            self._weights.reopened = False
            self._poller = self._new_poller()
        self._weights.announce(now, self.config.announce_interval_s, at_once=bool(new))
        for identity, peer in list(self._peers.items()):
            if now - peer.last_seen_s > self.config.peer_timeout_s:
                log.warning("robot %s silent for %.0f s; forgetting its session", peer.robot_id, now - peer.last_seen_s)
                self._forget(identity)
        if len(self._peers) < self.config.peer_limits.max_sessions:
            self._sessions_full_logged = False
        self._admission.prune(now)

    def _forget(self, identity: bytes) -> None:
        """Drop a session; the learner hears of it when its robot holds no other."""
        peer = self._peers.pop(identity, None)
        if peer is not None:
            self._lost(peer)

    def _lost(self, peer: Peer) -> None:
        if not any(p.robot_id == peer.robot_id for p in self._peers.values()):
            self.handlers.on_peer_lost(peer)

@dataclass
class _QueuedSegment:
    """A valid segment waiting for its batch's group commit."""

    identity: bytes
    sender: bytes
    peer: Peer
    msg: Segment



def who(identity: bytes) -> str:
    """A connection's name for logs: the robot id its routing id starts with, never the random part.

    A client's routing id ends in 128 random bits (``ZmqClient``); without CURVE they are the only
    thing that keeps another client from taking over its session, so they are never printed."""
    name, slash, _ = identity.partition(b"/")
    return repr(name.decode(errors="replace")[:64]) if slash else f"<a {len(identity)}-byte id>"


def _authenticated_key(frames: list[zmq.Frame]) -> str | None:
    """The z85 public key ZAP authenticated this message's connection with (its User-Id), or None."""
    try:
        return cast(str, frames[0].get("User-Id")) if frames else None  # a string property
    except zmq.ZMQError:
        return None


def _sender(identity: bytes, key: str | None) -> bytes:
    """Whom the per-sender limits hold to account: the CURVE key, else the connection's routing id."""
    return b"key:" + key.encode() if key else b"id:" + identity
