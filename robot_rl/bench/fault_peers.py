"""Part 6 of `robot-rl bench faults`: what one robot or one peer can make the learner's wire keep.

Each check runs the wire's learner endpoint (``ZmqServer``, serving on a thread of this process, with
an ingest that stores every decoded step once) on loopback:

* ``refused_then_clean``: a robot's link sends ``bench.refused_segments`` segments with a NaN reward
  (past the edge's own check, as a robot with an older edge would), then 20 clean ones. The learner
  answers the bad ones ``refused``; the link sets them aside and its slots go to the clean ones, every
  step of which must be stored, with the link drained.
* ``subscription_flood``: a process of its own sends ``bench.flood_subscriptions`` subscriptions of
  the longest topic the weights socket takes (``FLOOD_TOPIC_BYTES``; a longer one ends the connection
  at once) on the weights socket (and again after each reconnect); the learner's resident memory must
  grow by at most ``bench.max_flood_growth_mb`` (it opens the socket anew past its bound).
* ``stale_ids``: one connection says hello ``bench.stale_hellos`` times under new ids while one robot
  streams; after the peer timeout the learner must believe only the live robot connected.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import zmq

from robot_rl.bench.config import FaultsBenchConfig
from robot_rl.bridges.zmq.client import ClientConfig, ZmqClient
from robot_rl.bridges.zmq.protocol import Ack, Hello, HelloOk, Segment, decode_message, encode_message
from robot_rl.bridges.zmq.segments import decode_segment, encode_segment
from robot_rl.bridges.zmq.server import Peer, ServerConfig, ServerHandlers, ZmqServer
from robot_rl.bridges.zmq.weight_serving import MAX_SUBSCRIPTION_BYTES
from robot_rl.bridges.zmq.weights import WeightsBlob
from robot_rl.core import Step

CLEAN_SEGMENTS = 20
STEPS_PER_SEGMENT = 3
# The longest topic the weights socket takes: a subscription travels as a SUBSCRIBE command (10 bytes).
FLOOD_TOPIC_BYTES = MAX_SUBSCRIPTION_BYTES - len(b"\x09SUBSCRIBE")
PEER_TIMEOUT_S = 1.0  # short, so the stale ids' check takes seconds
# The flooding subscriber: every subscription a distinct topic, then it stays a moment and leaves.
_FLOOD = """
import os, sys, time, zmq
sub = zmq.Context().socket(zmq.SUB)
sub.connect(sys.argv[1])
for i in range(int(sys.argv[2])):
    sub.setsockopt(zmq.SUBSCRIBE, os.urandom({size}))
    if i % 100 == 0:
        sub.poll(0)  # a SUB that is used sends all its topics again after each reconnect
deadline = time.monotonic() + 2.0
while time.monotonic() < deadline:
    sub.poll(100)
"""


class CountingIngest(ServerHandlers):
    """Stores each decoded segment once and keeps the robots it believes connected."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, int, int], int] = {}
        self.connected: set[str] = set()

    def on_hello(self, peer: Peer, msg: Hello) -> None:
        self.connected.add(msg.robot_id)

    def on_peer_lost(self, peer: Peer) -> None:
        self.connected.discard(peer.robot_id)

    def on_segment(self, peer: Peer, msg: Segment) -> Ack:
        key = (msg.robot_id, msg.episode_id, msg.seq)
        duplicate = key in self.steps
        if not duplicate:
            self.steps[key] = len(decode_segment(msg))
        return Ack(robot_id=msg.robot_id, episode_id=msg.episode_id, seq=msg.seq, duplicate=duplicate)


@contextmanager
def serving_thread(config: ServerConfig, handlers: ServerHandlers) -> Iterator[ZmqServer]:
    """A learner endpoint serving on a thread of this process until the block ends."""
    server = ZmqServer(config, handlers)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(stop, 10), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join()  # a serve_once under way ends first: the context must outlive it
        server.close()


def _until(done: Callable[[], bool], timeout_s: float, tick: Callable[[], None]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done():
        tick()
    return done()


def _steps(start_tick: int, reward: float = 0.0) -> list[Step]:
    image = np.full((24, 32, 3), 90, np.uint8)
    return [Step(tick=start_tick + i, time_s=(start_tick + i) / 30, state=np.zeros(6, np.float32),
                 action=np.zeros(6, np.float32), images={"front": image}, reward=reward)
            for i in range(STEPS_PER_SEGMENT)]


def _client(server: ZmqServer, spool: Path, robot_id: str) -> ZmqClient:
    return ZmqClient(ClientConfig(robot_id=robot_id, router_endpoint=server.router_endpoint,
                                  pub_endpoint=server.pub_endpoint, spool_dir=spool, hello_retry_s=0.05,
                                  heartbeat_interval_s=0.2, server_timeout_s=3.0))


def refused_then_clean(cfg: FaultsBenchConfig, root: Path) -> dict[str, int]:
    ingest = CountingIngest()
    with serving_thread(ServerConfig(), ingest) as server:
        client = _client(server, root / "refused-spool", "robot-nan")
        try:
            bad = [dataclasses.replace(s, reward=float("nan")) for s in _steps(0)]
            for seq in range(cfg.refused_segments):
                client.send_segment(encode_segment("robot-nan", 1, seq, bad))
            for seq in range(cfg.refused_segments, cfg.refused_segments + CLEAN_SEGMENTS):
                client.send_segment(encode_segment("robot-nan", 1, seq, _steps(seq * STEPS_PER_SEGMENT)))
            _until(lambda: client.pending == 0, 60.0, lambda: client.poll(10))
            refused = client.stats.segments_refused
        finally:
            client.close()
    return {"refused": refused, "clean_steps": CLEAN_SEGMENTS * STEPS_PER_SEGMENT,
            "clean_stored": sum(ingest.steps.values())}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def subscription_flood(cfg: FaultsBenchConfig) -> dict[str, float | int]:
    with serving_thread(ServerConfig(announce_interval_s=0.05), CountingIngest()) as server:
        # A learner with weights announces them: its socket then takes in what subscribers sent.
        server.publish_weights(WeightsBlob(version=1, data=b"w" * 1024, config_hash=""))
        time.sleep(0.5)
        before = peak = _rss_mb()
        flood = subprocess.Popen([sys.executable, "-c", _FLOOD.format(size=FLOOD_TOPIC_BYTES),
                                  server.pub_endpoint, str(cfg.flood_subscriptions)])
        while flood.poll() is None:
            peak = max(peak, _rss_mb())
            time.sleep(0.05)
        reopened = server.counters["weights_socket_reopened"]
    return {"subscriptions": cfg.flood_subscriptions, "topic_bytes": FLOOD_TOPIC_BYTES,
            "rss_growth_mb": round(peak - before, 1),
            "weights_socket_reopened": reopened}


def stale_ids(cfg: FaultsBenchConfig, root: Path) -> dict[str, int]:
    ingest = CountingIngest()
    with serving_thread(ServerConfig(peer_timeout_s=PEER_TIMEOUT_S), ingest) as server:
        live = _client(server, root / "live-spool", "robot-live")
        ctx = zmq.Context()
        hellos = ctx.socket(zmq.DEALER)
        hellos.linger = 0
        hellos.connect(server.router_endpoint)
        try:
            _until(lambda: live.connected, 10.0, lambda: live.poll(10))
            for i in range(cfg.stale_hellos):
                hellos.send_multipart(encode_message(Hello(robot_id=f"stale-{i}", config_hash="", policy_version=-1)))
            answered = 0
            while answered < cfg.stale_hellos and hellos.poll(5000):
                answered += isinstance(decode_message(hellos.recv_multipart()), HelloOk)
                live.poll(0)
            _until(lambda: False, PEER_TIMEOUT_S * 3, lambda: live.poll(20))
            listed = len(ingest.connected | {p.robot_id for p in server.peers()})
        finally:
            hellos.close()
            ctx.term()
            live.close()
    return {"said_hello": answered, "live_peers": 1, "listed_after_timeout": listed}


def peer_faults(cfg: FaultsBenchConfig) -> dict[str, dict]:
    """The three checks above, each in its own fresh learner endpoint."""
    with tempfile.TemporaryDirectory(prefix="bench-faults-peers-") as tmp:
        return {"refused_then_clean": refused_then_clean(cfg, Path(tmp)),
                "subscription_flood": subscription_flood(cfg),
                "stale_ids": stale_ids(cfg, Path(tmp))}


def peer_faults_passed(cfg: FaultsBenchConfig, report: dict[str, dict]) -> bool:
    refused, flood, stale = report["refused_then_clean"], report["subscription_flood"], report["stale_ids"]
    return (refused["refused"] == cfg.refused_segments and refused["clean_stored"] == refused["clean_steps"]
            and flood["rss_growth_mb"] <= cfg.max_flood_growth_mb
            and stale["said_hello"] == cfg.stale_hellos and stale["listed_after_timeout"] == stale["live_peers"])
