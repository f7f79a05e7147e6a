"""Edge side of the wire: a DEALER for requests and a SUB for weight announcements.

``ZmqClient`` is synchronous and owned by one thread (ZeroMQ sockets are not
thread-safe). It is driven by ``poll(timeout_ms)``, which does all the I/O and
timers: hello handshake and re-handshake, heartbeats, sending spooled segments
with a bounded in-flight window, re-sending unacked ones, resetting a silent
link, and fetching + verifying announced weights. The robot's control thread
should use ``StreamingClient`` (streaming.py), which runs this on a background
thread.

Delivery: ``send_segment`` writes to the on-disk spool *before* sending; only an
ack removes it, or a ``refused`` (the segment is malformed as sent: it is moved to the
spool's ``refused/`` folder with the reason, and its sending slot goes to the next).
Anything unacked is re-sent after an ack timeout, a reconnect or a process restart,
so the learner sees each segment at least once and drops duplicates by
(robot_id, episode_id, seq): each step is stored exactly once.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from robot_rl.bridges.zmq.codec import DEFAULT_LIMITS, Limits
from robot_rl.bridges.zmq.keys import ClientCurve, apply_client_curve, check_endpoint_security
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
    StatsMap,
    WeightsAnnounce,
    WeightsChunk,
    WeightsFetch,
    check_robot_id,
    decode_message,
    encode_message,
    guess_of,
)
from robot_rl.bridges.zmq.spool import DEFAULT_SPOOL_MAX_BYTES, Spool
from robot_rl.bridges.zmq.weights import BufferAllocator, ChunkAssembler, WeightsError
from robot_rl.core.priority import lower_own_priority
from robot_rl.core.types import DetectorGuess

log = logging.getLogger(__name__)

WeightsCallback = Callable[[WeightsAnnounce, bytes | memoryview], None]  # verified payload (see ChunkAssembler.result)
# Threads that hash a download's chunks: every core an edge computer has, up to four (sha256 runs
# at ~1.7 GB/s per core, so four keep up with a 10 Gb/s link), at a raised nice value, behind the
# control loop; they hold the interpreter lock only between chunks.
VERIFY_THREADS = max(1, min(4, os.cpu_count() or 1))
VERIFY_NICE = 5


@dataclass
class ClientConfig:
    """Everything an edge node needs to reach its learner."""

    robot_id: str
    router_endpoint: str  # learner's ROUTER, e.g. "tcp://learner.lab:5555"
    pub_endpoint: str | None  # learner's PUB for weight announcements; None: announcements only after hello
    spool_dir: str | Path
    spool_max_bytes: int | None = DEFAULT_SPOOL_MAX_BYTES  # None: bounded by the disk only
    config_hash: str = ""
    features: dict[str, Any] = field(default_factory=dict)  # what this robot records (Hello.features)
    policy_version: int = -1  # weights version in use at start
    curve: ClientCurve | None = None
    allow_insecure: bool = False
    limits: Limits = DEFAULT_LIMITS
    max_in_flight: int = 8  # segments sent but not yet acked
    ack_timeout_s: float = 5.0  # re-send a segment not acked within this
    hello_retry_s: float = 1.0
    refused_retry_s: float = 10.0  # after config/version mismatch: an operator must fix something
    heartbeat_interval_s: float = 1.0
    server_timeout_s: float = 5.0  # silence from the learner before the link is reset
    fetch_weights: bool = True
    weights_window: int = 16  # chunk requests in flight (1 MB each: fewer leave the link waiting on round trips)
    weights_chunk_timeout_s: float = 5.0
    weights_chunk_retries: int = 3  # per chunk, for timeouts and corrupt chunks
    weights_download_attempts: int = 3  # per version, across re-announcements
    max_weights_bytes: int = 16 << 30

    def __post_init__(self) -> None:
        try:
            check_robot_id(self.robot_id)
        except ProtocolError as exc:
            raise ValueError(f"{exc}: choose a shorter link.robot_id") from exc


@dataclass
class ClientStats:
    """Counters, reported in heartbeats. Monotonic except the gauges at the end."""

    segments_spooled: int = 0
    segments_sent: int = 0
    segments_resent: int = 0
    segments_acked: int = 0
    duplicate_acks: int = 0
    errors_received: int = 0
    busy_replies: int = 0  # segments the learner could not take yet (re-sent later)
    segments_refused: int = 0  # malformed segments set aside in the spool's refused/ (never re-sent)
    bad_messages: int = 0
    link_resets: int = 0
    weights_received: int = 0
    weights_rejected: int = 0
    corrupt_chunks: int = 0
    connected: bool = False  # gauge
    pending: int = 0  # gauge: segments in the spool

    def as_map(self) -> dict[str, int | bool]:
        return dict(self.__dict__)


@dataclass
class _WeightsFetch:
    """State of one in-progress weights download."""

    assembler: ChunkAssembler
    requested: dict[int, float] = field(default_factory=dict)  # chunk -> time requested
    attempts: collections.Counter[int] = field(default_factory=collections.Counter)


class ZmqClient:
    """One edge node's connection to the learner. Single-threaded; drive it with ``poll``."""

    def __init__(self, config: ClientConfig, on_weights: WeightsCallback | None = None,
                 spool: Spool | None = None, allocate_weights: BufferAllocator | None = None) -> None:
        for endpoint in (config.router_endpoint, config.pub_endpoint):
            if endpoint:
                check_endpoint_security(endpoint, config.curve, config.allow_insecure)
        self.config = config
        self.on_weights = on_weights
        self.allocate_weights = allocate_weights  # where downloads are assembled (None: this process's memory)
        self.policy_version = config.policy_version
        self.stats = ClientStats()
        self.server: HelloOk | None = None  # set while the handshake holds
        self.refusal: str | None = None  # why the learner refused us last (config, key), until it accepts us
        self.latest_announce: WeightsAnnounce | None = None
        self.pinned: int | None = None  # the version the learner pins this robot to (None: the newest)
        self._pin: WeightsAnnounce | None = None  # the learner's announcement of that pin
        self._learner_busy = False  # said once: the learner answered busy and has acked nothing since
        # The learner's success detector on this robot's newest judged episode, as its acks bring it (None: none yet).
        self.detector_guess: DetectorGuess | None = None
        self._refusal_said = False  # the first segment set aside is logged; the rest are counted
        # More of this robot's state for its heartbeats (the edge's tick lateness, its episode), read on
        # the link's thread; None: the link's own counters only.
        self.report: Callable[[], StatsMap] | None = None
        self._report_failed = False
        self._spool = spool if spool is not None else Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
        self._own_spool = spool is None
        # 128 random bits: without CURVE, knowing this id is what it takes to speak on this robot's session.
        self._routing_id = f"{config.robot_id}/{secrets.token_hex(16)}".encode()
        self._in_flight: dict[str, float] = {}  # spool key -> time sent
        self._fetch: _WeightsFetch | None = None
        self._verifiers: ThreadPoolExecutor | None = None  # hash chunks; started with the first download
        self._delivered_version = -1
        self._failed_downloads: collections.Counter[int] = collections.Counter()  # version -> failures
        now = time.monotonic()
        self._last_hello_s = self._last_heartbeat_s = -1e9
        self._last_heard_s = now
        self._ctx = zmq.Context()
        self._monitor: zmq.Socket | None = None
        self._wake_fd: int | None = None
        self._dealer = self._new_dealer()
        self._sub = self._new_sub(config.pub_endpoint) if config.pub_endpoint else None
        self._poller = self._new_poller()
        self.stats.pending = len(self._spool)

    # ------------------------------------------------------------ sockets

    def _new_dealer(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.linger = 0  # the spool, not the socket queue, is what survives
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing into a connection that does not exist yet
        sock.setsockopt(zmq.ROUTING_ID, self._routing_id)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.limits.max_message_bytes)
        if self.config.curve:
            apply_client_curve(sock, self.config.curve)
            # A learner that does not know our key drops the CURVE handshake without a word on the
            # socket; ZeroMQ's monitor is where that shows (HANDSHAKE_FAILED_AUTH).
            if self._monitor is not None:
                self._monitor.close(0)
            self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        sock.connect(self.config.router_endpoint)
        return sock

    def _new_sub(self, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.SUB)
        sock.linger = 0
        sock.setsockopt(zmq.CONFLATE, 1)  # only the newest announcement matters
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.limits.max_envelope_bytes)
        if self.config.curve:
            apply_client_curve(sock, self.config.curve)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        return sock

    def _new_poller(self) -> zmq.Poller:
        """What ``poll`` waits on: built once per dealer socket, not at every poll (the link polls for
        every ack and every submitted segment)."""
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        if self._sub is not None:
            poller.register(self._sub, zmq.POLLIN)
        if self._wake_fd is not None:
            poller.register(self._wake_fd, zmq.POLLIN)
        return poller

    def wake_on(self, fd: int) -> None:
        """Also end ``poll``'s wait when ``fd`` is readable (another thread's wake-up: new segments to
        send, a stop). Reading it is the caller's business; ``poll`` only wakes up for it."""
        self._wake_fd = fd
        self._poller = self._new_poller()

    def _send(self, msg: Message | list) -> bool:
        """Non-blocking send; False if the link cannot take it now (it will be retried)."""
        frames = msg if isinstance(msg, list) else encode_message(msg)
        try:
            self._dealer.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    # ------------------------------------------------------------ public API

    @property
    def connected(self) -> bool:
        """True once the learner accepted our hello (and has not gone silent since)."""
        return self.server is not None

    @property
    def pending(self) -> int:
        """Segments in the spool, not yet acked."""
        return len(self._spool)

    def send_segment(self, segment: Segment) -> None:
        """Spool ``segment`` durably, then send it when the window allows (on ``poll``)."""
        key = f"{segment.episode_id}:{segment.seq}"
        if segment.robot_id != self.config.robot_id:
            raise ValueError(f"segment robot_id {segment.robot_id!r} != client robot_id {self.config.robot_id!r}")
        self._spool.append(key, encode_message(segment))
        self.stats.segments_spooled += 1
        self.stats.pending = len(self._spool)
        self._pump_segments(time.monotonic())

    def set_aside(self, segment: Segment, reason: str) -> None:
        """Keep a segment that must not be sent (the edge's own checks refused it) in the spool's
        ``refused/`` folder with ``reason``, counted like one the learner refused."""
        key = f"{segment.episode_id}:{segment.seq}"
        self._refuse(key, reason, encode_message(segment))

    def poll(self, timeout_ms: int = 10) -> None:
        """Wait up to ``timeout_ms`` for messages, handle them, run timers and sends."""
        ready = dict(self._poller.poll(timeout_ms))
        if self._dealer in ready:
            self._drain(self._dealer)
        if self._sub is not None and self._sub in ready:
            self._drain(self._sub)
        self._store_chunks(time.monotonic())
        self._read_monitor()
        self._timers(time.monotonic())

    def _read_monitor(self) -> None:
        """Note a CURVE handshake the learner refused (``refusal``): an unknown or wrong key."""
        if self._monitor is None:
            return
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                reason = (f"CURVE handshake refused (ZeroMQ error {event['value']}): the learner does not know "
                          f"robot {self.config.robot_id!r}'s key (its robot_keys_dir needs "
                          f"{self.config.robot_id}.key), or link.learner_key is not the learner's public key")
                if reason != self.refusal:
                    log.error("robot %s: %s", self.config.robot_id, reason)
                self.refusal = reason

    def close(self) -> None:
        if self._monitor is not None:
            self._dealer.disable_monitor()
            self._monitor.close(0)
        self._dealer.close(0)
        if self._sub is not None:
            self._sub.close(0)
        self._ctx.term()
        if self._verifiers is not None:
            self._verifiers.shutdown(wait=True)  # a poll in progress finished its batch; nothing waits
        if self._own_spool:
            self._spool.close()

    def __enter__(self) -> ZmqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ receiving

    def _drain(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = decode_message(frames, self.config.limits)
            except ProtocolError as exc:
                self.stats.bad_messages += 1
                log.warning("robot %s: refused a message from the learner: %s", self.config.robot_id, exc)
                continue
            direct = sock is self._dealer
            if direct:
                self._last_heard_s = time.monotonic()
            if isinstance(msg, WeightsAnnounce):
                self._on_announce(msg, direct=direct)
            else:
                self._on_message(msg)

    def _on_message(self, msg: Message) -> None:
        if isinstance(msg, HelloOk):
            self._on_hello_ok(msg)
        elif isinstance(msg, Ack):
            self._on_ack(msg)
        elif isinstance(msg, Refused):
            self._on_refused(msg)
        elif isinstance(msg, Error):
            self._on_error(msg)
        elif isinstance(msg, WeightsChunk):
            self._on_chunk(msg)
        elif isinstance(msg, Heartbeat):
            pass  # liveness is tracked for every message
        else:
            log.warning("robot %s: ignoring unexpected %s from the learner", self.config.robot_id, msg.TYPE)

    def _on_hello_ok(self, msg: HelloOk) -> None:
        if self.server is None:
            log.info("robot %s: connected to learner %s (%d segments to re-send)",
                     self.config.robot_id, msg.server_id, len(self._spool))
        self.server = msg
        self.refusal = None
        self.stats.connected = True
        self._in_flight.clear()  # everything unacked goes again, in spool order

    def _on_ack(self, msg: Ack) -> None:
        if self._learner_busy:
            log.info("robot %s: the learner takes segments again", self.config.robot_id)
            self._learner_busy = False
        key = f"{msg.episode_id}:{msg.seq}"
        self._in_flight.pop(key, None)
        if msg.robot_id == self.config.robot_id and self._spool.ack(key):
            self.stats.segments_acked += 1
            self.stats.duplicate_acks += int(msg.duplicate)
        guess = guess_of(msg) if msg.robot_id == self.config.robot_id else None
        if guess is not None:
            self.detector_guess = guess
        self.stats.pending = len(self._spool)

    def _on_refused(self, msg: Refused) -> None:
        """The learner will never store this segment as sent: out of the spool, into ``refused/``."""
        key = f"{msg.episode_id}:{msg.seq}"
        self._in_flight.pop(key, None)
        if msg.robot_id == self.config.robot_id and key in self._spool:
            self._refuse(key, f"refused by the learner ({msg.code}): {msg.message}")

    def _refuse(self, key: str, reason: str, frames: list | None = None) -> None:
        path = self._spool.set_aside(key, reason, frames)
        self.stats.segments_refused += 1
        self.stats.pending = len(self._spool)
        if not self._refusal_said:
            log.error("robot %s: segment %s set aside in %s, never to be sent: %s (further ones go there too, "
                      "counted as segments_refused)", self.config.robot_id, key, path.parent, reason)
            self._refusal_said = True

    def _on_error(self, msg: Error) -> None:
        self.stats.errors_received += 1
        if msg.code == "hello_required":
            log.info("robot %s: learner asks for hello again", self.config.robot_id)
            self._drop_session(reset_socket=False)
            self._last_hello_s = -1e9  # say hello right away
        elif msg.code in ("config_mismatch", "version_mismatch", "identity_mismatch"):
            log.error("robot %s: learner refused us (%s): %s", self.config.robot_id, msg.code, msg.message)
            self.refusal = msg.message
            self._drop_session(reset_socket=False)
            self._last_hello_s = time.monotonic() + self.config.refused_retry_s - self.config.hello_retry_s
        elif msg.code == "busy":
            # The learner cannot take a segment now (its bound for this robot, a full disk): it stays in
            # the spool and goes again at its ack timeout. Said once until an ack comes, never per re-send.
            self.stats.busy_replies += 1
            if not self._learner_busy:
                log.warning("robot %s: the learner is busy (%s); segments wait in the spool and are re-sent",
                            self.config.robot_id, msg.message)
            self._learner_busy = True
        elif msg.code == "weights_unavailable" and self._fetch is not None:
            log.warning("robot %s: abandoning weights v%d: %s", self.config.robot_id,
                        self._fetch.assembler.announce.version, msg.message)
            self._fetch = None
        else:
            log.warning("robot %s: learner error %s on %s: %s", self.config.robot_id, msg.code,
                        msg.in_reply_to or "?", msg.message)

    # ------------------------------------------------------------ weights

    def _on_announce(self, msg: WeightsAnnounce, *, direct: bool = False) -> None:
        """``direct``: sent to this robot on its request socket, which says whether it is pinned (the
        learner's answer to a hello, or a pin from its console); else the newest version, to everyone."""
        cfg = self.config
        if direct:
            self._on_pin(msg)
        elif self.pinned is not None:
            return  # pinned: the newest version is not this robot's to load
        self.latest_announce = msg
        if not cfg.fetch_weights or self.on_weights is None:
            return
        if cfg.config_hash and msg.config_hash != cfg.config_hash:
            log.warning("robot %s: ignoring weights v%d built for config %s (ours: %s)",
                        cfg.robot_id, msg.version, msg.config_hash, cfg.config_hash)
            return
        busy = self._fetch.assembler.announce.version if self._fetch else -1
        if msg.pinned:
            if msg.version in (self.policy_version, self._delivered_version, busy):
                return  # in use, delivered to the loader, or on its way
        elif msg.version <= max(self.policy_version, self._delivered_version, busy):
            return
        if self._failed_downloads[msg.version] >= cfg.weights_download_attempts:
            return  # already reported; wait for a newer version
        try:
            self._fetch = _WeightsFetch(ChunkAssembler(msg, cfg.max_weights_bytes, self.allocate_weights))
        except WeightsError as exc:
            self._download_failed(msg.version, str(exc))
            return
        log.info("robot %s: fetching weights v%d (%d bytes, %d chunks)", cfg.robot_id, msg.version, msg.size,
                 msg.num_chunks)

    def _on_pin(self, msg: WeightsAnnounce) -> None:
        """Pinned to ``msg.version``, or released (``msg.pinned`` false): a change forgets the download
        under way and what was last delivered, so the version wanted now is fetched whatever it is."""
        pinned = msg.version if msg.pinned else None
        self._pin = msg if msg.pinned else None
        if pinned == self.pinned:
            return
        log.info("robot %s: %s", self.config.robot_id,
                 f"pinned to weights v{pinned} by the learner" if pinned is not None else
                 "released by the learner: following the newest weights again")
        self.pinned = pinned
        self._fetch = None
        self._delivered_version = -1

    def _on_chunk(self, msg: WeightsChunk) -> None:
        """Held for ``_store_chunks``, which verifies every chunk that came in one ``poll`` at once."""
        fetch = self._fetch
        if fetch is None or msg.version != fetch.assembler.announce.version:
            return  # a late chunk of an abandoned download
        fetch.requested.pop(msg.chunk, None)
        try:
            fetch.assembler.receive(msg)
        except WeightsError as exc:
            self._chunk_refused(exc)

    def _store_chunks(self, now: float) -> None:
        """Ask for the next chunks, then verify and store the ones received (the learner sends the
        next while these are hashed); hand the payload on once the last is in."""
        fetch = self._fetch
        if fetch is None or not fetch.assembler.received:
            return
        self._pump_weights(now)
        if self._verifiers is None:
            self._verifiers = ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="weights-verify",
                                                 initializer=lower_own_priority, initargs=(VERIFY_NICE,))
        for error in fetch.assembler.store_received(self._verifiers):
            self._chunk_refused(error)  # re-requested by _pump_weights unless out of attempts
        if fetch.assembler.complete and fetch is self._fetch:
            self._finish_fetch(fetch)

    def _chunk_refused(self, error: WeightsError) -> None:
        self.stats.corrupt_chunks += 1
        log.warning("robot %s: %s", self.config.robot_id, error)

    def _finish_fetch(self, fetch: _WeightsFetch) -> None:
        self._fetch = None
        announce = fetch.assembler.announce
        try:
            data = fetch.assembler.result()
        except WeightsError as exc:
            self._download_failed(announce.version, str(exc))
            return
        self._delivered_version = announce.version
        self.stats.weights_received += 1
        if self.on_weights is None:  # a fetch starts only with a callback (_on_announce)
            return
        try:
            self.on_weights(announce, data)
        except Exception:
            log.exception("robot %s: weights callback failed on v%d", self.config.robot_id, announce.version)

    def _pump_weights(self, now: float) -> None:
        fetch = self._fetch
        if fetch is None and self.connected:
            self._back_to_the_pin()
            fetch = self._fetch
        if fetch is None or not self.connected:
            return
        cfg = self.config
        for chunk, sent in list(fetch.requested.items()):
            if now - sent > cfg.weights_chunk_timeout_s:
                del fetch.requested[chunk]
        for chunk in fetch.assembler.missing():
            if len(fetch.requested) >= cfg.weights_window:
                break
            if chunk in fetch.requested:
                continue
            if fetch.attempts[chunk] >= cfg.weights_chunk_retries + 1:
                self._fetch = None
                self._download_failed(fetch.assembler.announce.version,
                                      f"chunk {chunk} failed {fetch.attempts[chunk]} times")
                return
            if not self._send(WeightsFetch(version=fetch.assembler.announce.version, chunk=chunk)):
                return
            fetch.requested[chunk] = now
            fetch.attempts[chunk] += 1

    def _back_to_the_pin(self) -> None:
        """A version delivered to the loader before a pin came can be swapped in after it: the robot
        then runs a version it is not pinned to, and no announcement would tell it again. Fetch the
        pinned version once more (bounded by ``weights_download_attempts`` like any download)."""
        pin = self._pin
        if pin is None or pin.version in (self.policy_version, self._delivered_version):
            return
        self._on_announce(pin, direct=True)
        if self._fetch is not None:
            log.info("robot %s: running v%d while pinned to v%d; fetching v%d again", self.config.robot_id,
                     self.policy_version, pin.version, pin.version)

    def _download_failed(self, version: int, reason: str) -> None:
        self.stats.weights_rejected += 1
        self._failed_downloads[version] += 1
        final = self._failed_downloads[version] >= self.config.weights_download_attempts
        log.error("robot %s: weights v%d refused (%s)%s", self.config.robot_id, version, reason,
                  "; not trying this version again" if final else "; will retry on the next announcement")

    # ------------------------------------------------------------ timers and sending

    def _timers(self, now: float) -> None:
        cfg = self.config
        if self.connected and now - self._last_heard_s > cfg.server_timeout_s:
            log.warning("robot %s: learner silent for %.1f s; resetting the link", cfg.robot_id,
                        now - self._last_heard_s)
            self.stats.link_resets += 1
            self._drop_session(reset_socket=True)
        if not self.connected:
            if now - self._last_hello_s >= cfg.hello_retry_s:
                self._last_hello_s = now
                self._send(Hello(robot_id=cfg.robot_id, config_hash=cfg.config_hash, features=cfg.features,
                                 policy_version=self.policy_version))
            return
        if now - self._last_heartbeat_s >= cfg.heartbeat_interval_s:
            self._last_heartbeat_s = now
            self.stats.pending = len(self._spool)
            self._send(Heartbeat(sender=cfg.robot_id, policy_version=self.policy_version, time_s=now,
                                 stats=self._heartbeat_stats()))
        self._pump_segments(now)
        self._pump_weights(now)

    def _heartbeat_stats(self) -> StatsMap:
        stats: StatsMap = dict(self.stats.as_map())
        if self.report is not None:
            try:
                stats.update(self.report())
            except Exception:  # a broken report must not end the link; said once
                if not self._report_failed:
                    log.exception("robot %s: the heartbeat report failed; sending the link's counters only",
                                  self.config.robot_id)
                self._report_failed = True
        return stats

    def _pump_segments(self, now: float) -> None:
        """Send spooled segments, oldest first, keeping at most max_in_flight unacked."""
        if not self.connected:
            return
        for key, sent in list(self._in_flight.items()):
            if now - sent > self.config.ack_timeout_s:
                del self._in_flight[key]  # sent again below
                self.stats.segments_resent += 1
        if len(self._in_flight) >= self.config.max_in_flight:
            return  # the common case while streaming: nothing to send until an ack
        # Oldest first, and only as far as the window reaches: after an outage the spool holds hours of
        # segments, and this runs at every ack and every poll.
        for key in self._spool.iter_keys():
            if len(self._in_flight) >= self.config.max_in_flight:
                return
            if key in self._in_flight:
                continue
            frames = self._spool.get(key)
            if frames is None or not self._send(frames):
                return
            self._in_flight[key] = now
            self.stats.segments_sent += 1

    def _drop_session(self, *, reset_socket: bool) -> None:
        self.server = None
        self.stats.connected = False
        self._in_flight.clear()
        self._fetch = None
        if reset_socket:  # Lazy-Pirate style: a fresh socket drops whatever was queued in the old one
            if self._monitor is not None:
                self._dealer.disable_monitor()
            self._dealer.close(0)
            self._dealer = self._new_dealer()
            self._poller = self._new_poller()
            self._last_hello_s = -1e9
