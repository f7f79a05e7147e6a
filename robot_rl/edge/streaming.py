"""Glue between an EdgeNode and the learner link (``bridges.zmq.StreamingClient``).

Two directions, neither of which may slow the control thread:

* Steps out: ``EdgeStreamer.sink`` is the node's ``step_sink``. It appends the Step to
  the current segment and, every ``segment_steps`` steps or at the episode's end,
  hands the segment to ``StreamingClient.submit_steps``, which only enqueues. If the
  link's queue is full the segment is kept here and offered again on the next tick
  (never dropped, never waited for; the link logs the refusal loudly).
* Weights in: the link fetches and verifies announced snapshots on its own thread and
  calls ``_on_weights``; a loader thread deserialises them (safetensors, no pickle),
  checks them against the running architecture, loads them into a fresh shadow copy
  of the policy and asks the node to swap it in between two chunks.

The version in use, reported in heartbeats, is the version of the newest executed step:
that is when a swap has really happened, not when the weights arrived.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bridges.zmq.client import ClientConfig
from bridges.zmq.protocol import WeightsAnnounce
from bridges.zmq.segments import ImageEncoding
from bridges.zmq.streaming import StreamingClient
from bridges.zmq.weights import WeightsError, deserialize_tensors
from robot_rl.core.types import Step

log = logging.getLogger(__name__)


def wall_clock_episode_id() -> int:
    """Microseconds since the epoch: unique per robot across restarts, as the dedup key needs."""
    return time.time_ns() // 1000


@dataclass
class _Pending:
    episode_id: int
    steps: list[Step]
    done: bool


class EdgeStreamer:
    """Streams a node's Steps to the learner and hot-swaps the weights it publishes.

    >>> streamer = EdgeStreamer(client_config, policy)    # policy: the node's FlowVLA
    >>> node = EdgeNode(robot, policy, clock, step_sink=streamer.sink)
    >>> streamer.attach(node).start()
    >>> node.run_episode(300, instruction)                # a new episode id on every tick 0
    >>> streamer.stop()
    """

    def __init__(
        self,
        config: ClientConfig,
        policy: torch.nn.Module | None = None,
        *,
        segment_steps: int = 15,
        image_encoding: ImageEncoding = ImageEncoding(),
        queue_size: int = 256,
        episode_id_fn: Callable[[], int] = wall_clock_episode_id,
    ) -> None:
        if segment_steps < 1:
            raise ValueError(f"segment_steps must be >= 1, got {segment_steps}")
        self.link = StreamingClient(config, on_weights=self._on_weights if policy is not None else None,
                                    queue_size=queue_size, image_encoding=image_encoding)
        self.segment_steps = segment_steps
        self.episode_id_fn = episode_id_fn
        self.node = None
        # The shadow template is copied now, before the node starts using ``policy``.
        self._template = copy.deepcopy(policy).cpu().eval() if policy is not None else None
        self._device = next(policy.parameters()).device if policy is not None else torch.device("cpu")
        self._episode_id: int | None = None
        self._next_episode_id: int | None = None
        self._current: list[Step] = []
        self._unsent: deque[_Pending] = deque()
        self._drain_lock = threading.Lock()  # control thread and loader thread both drain; never waited for
        self._reported_version = config.policy_version
        self._weights: queue.Queue[tuple[WeightsAnnounce, bytes]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._loader = threading.Thread(target=self._load_loop, name=f"weights-{config.robot_id}", daemon=True)
        self.swaps_requested = 0
        self.weights_rejected = 0
        self.submit_retries = 0

    # ------------------------------------------------------------ lifecycle

    def attach(self, node) -> EdgeStreamer:  # noqa: ANN001 - EdgeNode; typed loosely to keep imports one-way
        """Become ``node``'s step sink and swap target."""
        self.node = node
        node.step_sink = self.sink
        return self

    def start(self) -> EdgeStreamer:
        self.link.start()
        self._loader.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Hand over what is still held here, then stop the link (its spool keeps anything unacked)."""
        deadline = time.monotonic() + timeout_s
        while self._unsent and time.monotonic() < deadline:
            self._drain_unsent(block=True)
            if self._unsent:
                time.sleep(0.01)  # the link thread is emptying its queue into the spool
        if self._unsent:
            log.error("robot %s: %d segment(s) could not be queued before stopping (link queue full); "
                      "they are lost with this process", self.link.config.robot_id, len(self._unsent))
        self._stop.set()
        if self._loader.is_alive():
            self._loader.join(timeout_s)
        self.link.stop(timeout_s)

    def begin_episode(self, episode_id: int) -> None:
        """Use ``episode_id`` for the next episode (default: ``episode_id_fn()`` at its tick 0)."""
        self._next_episode_id = episode_id

    @property
    def episode_id(self) -> int | None:
        return self._episode_id

    # ------------------------------------------------------------ control thread: never blocks

    def sink(self, step: Step) -> None:
        """The node's ``step_sink``: list appends and a non-blocking enqueue only."""
        if step.tick == 0 or self._episode_id is None:
            self._start_episode()
        if step.policy_version != self._reported_version:
            self._reported_version = step.policy_version
            self.link.set_policy_version(step.policy_version)
        self._current.append(step)
        if step.done or len(self._current) >= self.segment_steps:
            self._unsent.append(_Pending(self._episode_id, self._current, step.done))  # type: ignore[arg-type]
            self._current = []
        self._drain_unsent()

    def _start_episode(self) -> None:
        if self._current:  # the previous episode ended without a done step: send what it has
            self._unsent.append(_Pending(self._episode_id, self._current, True))  # type: ignore[arg-type]
            self._current = []
        self._episode_id = self._next_episode_id if self._next_episode_id is not None else self.episode_id_fn()
        self._next_episode_id = None

    def _drain_unsent(self, block: bool = False) -> None:
        """Offer held segments to the link in order. The control thread never waits for the lock:
        if the loader thread is draining right now, this tick simply leaves it to it."""
        if not self._drain_lock.acquire(blocking=block):
            return
        try:
            while self._unsent:
                pending = self._unsent[0]
                if not self.link.submit_steps(pending.episode_id, pending.steps, episode_done=pending.done):
                    self.submit_retries += 1
                    return  # kept, offered again later, in order
                self._unsent.popleft()
        finally:
            self._drain_lock.release()

    # ------------------------------------------------------------ weights: link thread -> loader thread

    def _on_weights(self, announce: WeightsAnnounce, data: bytes) -> None:
        """Called on the link thread with verified bytes; hand over to the loader (latest wins)."""
        try:
            self._weights.get_nowait()
        except queue.Empty:
            pass
        self._weights.put_nowait((announce, data))

    def _load_loop(self) -> None:
        """Loader thread: loads weights, and keeps offering held segments when the robot is idle."""
        while not self._stop.is_set():
            if self._unsent:
                self._drain_unsent(block=True)
            try:
                announce, data = self._weights.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                shadow = self._shadow_copy(announce, data)
            except (WeightsError, ValueError, RuntimeError) as exc:
                self.weights_rejected += 1
                log.error("robot %s: weights v%d refused: %s", self.link.config.robot_id, announce.version, exc)
                continue
            if self.node is None:
                log.warning("weights v%d arrived but no node is attached; ignored", announce.version)
                continue
            self.node.request_policy_swap(shadow, announce.version)
            self.swaps_requested += 1
            log.info("robot %s: weights v%d loaded into a shadow copy; swapping at the next chunk",
                     self.link.config.robot_id, announce.version)

    def _shadow_copy(self, announce: WeightsAnnounce, data: bytes) -> torch.nn.Module:
        assert self._template is not None
        tensors = deserialize_tensors(data, framework="pt", cast_to="float32")
        expected = self._template.state_dict()
        wrong = sorted(k for k in expected if k not in tensors or tensors[k].shape != expected[k].shape)
        extra = sorted(set(tensors) - set(expected))
        if wrong or extra:
            raise ValueError(f"weights do not fit the running policy (mismatched {wrong[:5]}, unexpected {extra[:5]})")
        shadow = copy.deepcopy(self._template)
        shadow.load_state_dict(tensors)
        return shadow.to(self._device).eval()
