"""LeRobot's ``RobotClient``s, unchanged, measured: the client process of ``bench serve``'s LeRobot baseline.

Each robot is one ``RobotClient`` driving a ``ReplayArm`` (``robot_rl.bench.replayarm``: no
hardware) with its two threads, as LeRobot runs them: the control loop at ``fps`` (a request when
at most half the chunk is left) and the action receiver. ``MeasuredRobotClient`` only records:

* latency, LeRobot's own measure of it: a chunk's first action carries the time its observation was
  taken (``time.time()``, one clock on loopback), read when the chunk arrives;
* whether the chunk came from this robot's own observation (``foreign_chunks``: LeRobot's server
  keeps one observation queue of one for all clients, and any client's ``GetActions`` takes the
  newest observation, whoever sent it);
* the ``GetActions`` that waited the server's ``obs_queue_timeout`` and got nothing;
* stalled seconds: the window less the actions an arm executed in it, at one a tick (a control
  loop blocked in a call to the server stalls without ticking);
* the pickled observation bytes the client sent (every camera at full resolution).

Imported only in its own process (``robot_rl.bench.serve_lerobot``): LeRobot's async-inference
modules write ``logs/`` under the working directory and reset the root logger when imported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch
from lerobot.async_inference.configs import RobotClientConfig
from lerobot.async_inference.helpers import TimedAction, TimedObservation
from lerobot.async_inference.robot_client import RobotClient

from robot_rl.bench.replayarm import ReplayArmConfig

TASK = "push the red cube to the left"
_JOIN_S = 5.0  # a client's threads after stop(): the receiver's GetActions returns within obs_queue_timeout


class _CountingStub:
    """The client's gRPC stub, counting the observation bytes it sends and the chunks it gets."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.bytes_sent = 0
        self.observations_sent = 0
        self.empty_replies: list[float] = []  # time.time() of each GetActions answered with nothing

    def SendObservations(self, messages: Iterator[Any], *args: Any, **kwargs: Any) -> Any:  # noqa: N802  # gRPC's name
        def counted() -> Iterator[Any]:
            size = 0
            for message in messages:
                size += len(message.data)
                yield message
            # counted once gRPC has drained the observation's chunks, so that a summary taken while one is
            # in flight never divides a request's count by bytes not yet sent
            self.bytes_sent += size
            self.observations_sent += 1
        return self._stub.SendObservations(counted(), *args, **kwargs)

    def GetActions(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802  # gRPC's name
        reply = self._stub.GetActions(*args, **kwargs)
        if len(reply.data) == 0:
            self.empty_replies.append(time.time())
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)


@dataclass
class _ClientLog:
    sent_timestamps: set[float] = field(default_factory=set)
    arrivals: list[tuple[float, float, bool]] = field(default_factory=list)  # (arrival, latency_s, own)
    acted: list[float] = field(default_factory=list)  # time.time() of each action sent to the arm


class MeasuredRobotClient(RobotClient):
    """LeRobot's RobotClient, its behaviour untouched; it records each chunk's arrival, its latency
    and whether it came from this robot's own observation, and each action it executes."""

    stub: Any  # LeRobot's gRPC stub (untyped there), replaced by its counting wrapper

    def __init__(self, config: RobotClientConfig) -> None:
        super().__init__(config)
        self.counted = _CountingStub(self.stub)
        self.stub = self.counted
        self.log = _ClientLog()

    def send_observation(self, obs: TimedObservation) -> bool:
        self.log.sent_timestamps.add(obs.get_timestamp())
        return bool(super().send_observation(obs))

    def _aggregate_action_queues(self, incoming_actions: list[TimedAction],
                                 aggregate_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                                 ) -> None:
        if incoming_actions:
            now, taken = time.time(), incoming_actions[0].get_timestamp()
            self.log.arrivals.append((now, now - taken, taken in self.log.sent_timestamps))
        super()._aggregate_action_queues(incoming_actions, aggregate_fn)

    def control_loop_action(self, verbose: bool = False) -> dict[str, Any]:
        action = super().control_loop_action(verbose)
        self.log.acted.append(time.time())
        return action


def _summary(clients: list[MeasuredRobotClient], since: float, until: float, fps: int) -> dict[str, Any]:
    seconds = until - since
    own = [lat for c in clients for (t, lat, mine) in c.log.arrivals if since <= t < until and mine]
    chunks = [sum(since <= t < until for (t, _, _) in c.log.arrivals) for c in clients]
    foreign = sum(since <= t < until and not mine for c in clients for (t, _, mine) in c.log.arrivals)
    acted = [sum(since <= t < until for t in c.log.acted) for c in clients]
    sent = sum(c.counted.observations_sent for c in clients)
    return {
        "latency_p50_s": float(np.percentile(own, 50)) if own else None,
        "latency_p95_s": float(np.percentile(own, 95)) if own else None,
        "chunks_per_s": sum(chunks) / seconds,
        "own_chunks_per_s": len(own) / seconds,
        "chunks_per_robot": chunks,
        "foreign_chunks": foreign,
        "empty_replies": sum(since <= t < until for c in clients for t in c.counted.empty_replies),
        "stall_s": sum(max(seconds - n / fps, 0.0) for n in acted),
        "bytes_per_request": sum(c.counted.bytes_sent for c in clients) / max(sent, 1),
    }


def _measure(address: str, checkpoint: str, arm: ReplayArmConfig, robots: int, chunk_size: int, fps: int,
             warmup_s: float, seconds: float) -> dict[str, Any]:
    clients: list[MeasuredRobotClient] = []
    threads: list[threading.Thread] = []
    try:
        for i in range(robots):  # robots joining one after another, each with LeRobot's handshake
            client = MeasuredRobotClient(RobotClientConfig(
                policy_type="act", pretrained_name_or_path=checkpoint, robot=ReplayArmConfig(
                    id=f"bench-{i}", calibration_dir=arm.calibration_dir, frames=arm.frames, joints=arm.joints),
                actions_per_chunk=chunk_size, task=TASK, server_address=address, fps=fps))
            clients.append(client)
            if not client.start():
                raise RuntimeError(f"LeRobot's RobotClient {i} could not reach its PolicyServer at {address}")
            pair = [threading.Thread(target=client.receive_actions, daemon=True),
                    threading.Thread(target=client.control_loop, args=(TASK,), daemon=True)]
            threads += pair
            for thread in pair:
                thread.start()
        since = time.time() + warmup_s
        time.sleep(warmup_s + seconds)
        return _summary(clients, since, since + seconds, fps)
    finally:
        for client in clients:
            client.stop()
        for thread in threads:
            thread.join(_JOIN_S)


def run_clients(address: str, checkpoint: str, arm: ReplayArmConfig, robot_counts: list[int], chunk_size: int,
                fps: int, warmup_s: float, seconds: float, conn: Any) -> None:
    """Each robot count in turn against the running server; sends ``(robots, measurements)`` after
    each, then ``None``."""
    torch.set_num_threads(1)  # as the server: this box's other core runs the server
    grpc.channel_ready_future(grpc.insecure_channel(address)).result(timeout=120)
    for robots in robot_counts:
        conn.send((robots, _measure(address, checkpoint, arm, robots, chunk_size, fps, warmup_s, seconds)))
    conn.send(None)
