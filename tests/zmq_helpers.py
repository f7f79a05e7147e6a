"""What the wire's tests share: a learner serving on a thread, a memory ingest that stores each
segment once, fast client timers, and steps to stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import zmq

from robot_rl.bench.fault_peers import serving_thread
from robot_rl.bridges.zmq import (
    Ack,
    ClientConfig,
    Peer,
    Segment,
    ServerConfig,
    ServerHandlers,
    ZmqServer,
    decode_segment,
)
from robot_rl.bridges.zmq.keys import ClientCurve, apply_client_curve
from robot_rl.core import Step

FAST = dict(hello_retry_s=0.05, heartbeat_interval_s=0.2, ack_timeout_s=1.0, server_timeout_s=3.0,
            weights_chunk_timeout_s=1.0)


class MemoryIngest(ServerHandlers):
    """Stores each (robot, episode, seq) once, like the learner's ingest must."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, int, int], list[Step]] = {}
        self.received = 0
        self.lock = threading.Lock()

    def on_segment(self, peer: Peer, msg: Segment) -> Ack:
        key = (msg.robot_id, msg.episode_id, msg.seq)
        with self.lock:
            self.received += 1
            duplicate = key in self.stored
            if not duplicate:
                self.stored[key] = decode_segment(msg)
        return Ack(robot_id=msg.robot_id, episode_id=msg.episode_id, seq=msg.seq, duplicate=duplicate)


def serving(config: ServerConfig | None = None, handlers: ServerHandlers | None = None) -> Iterator[ZmqServer]:
    return serving_thread(config or ServerConfig(), handlers if handlers is not None else MemoryIngest())


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, tick: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if predicate():
            return True
        if tick is None:
            time.sleep(0.01)
    return predicate()


def client_config(server: ZmqServer, spool_dir, robot_id: str = "so101-a", **overrides) -> ClientConfig:
    return ClientConfig(robot_id=robot_id, router_endpoint=server.router_endpoint, pub_endpoint=server.pub_endpoint,
                        spool_dir=spool_dir, **{**FAST, **overrides})


def make_steps(n: int, start_tick: int = 0) -> list[Step]:
    img = np.full((24, 32, 3), 90, np.uint8)
    return [Step(tick=start_tick + i, time_s=(start_tick + i) / 30, state=np.full(6, i, np.float32),
                 action=np.full(6, -i, np.float32), images={"front": img}, reward=float(i)) for i in range(n)]


def dealer_on_routing_id(ctx: zmq.Context, routing_id: bytes, secret_key: Path, learner_key: Path,
                         endpoint: str) -> zmq.Socket:
    """A DEALER that connects under another robot's ``routing_id`` with its own CURVE keys (a taker)."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    apply_client_curve(sock, ClientCurve.from_files(secret_key, learner_key))
    sock.connect(endpoint)
    return sock
