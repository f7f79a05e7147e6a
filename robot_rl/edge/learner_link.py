"""The edge's learner link: an EdgeNode's steps out to the learner, the learner's weights in.

It sits on the wire's client (``robot_rl.bridges.zmq.StreamingClient``: sockets, spool, acks) and
knows the node: episodes, segments, the version in use. ``robot_rl.edge.runtime`` wires it. Two
directions, neither of which may slow the control thread:

* Steps out: ``EdgeStreamer.sink`` is the node's ``step_sink``. It appends the Step to
  the current segment and, every ``segment_steps`` steps or at the episode's end,
  hands the segment to ``StreamingClient.submit_steps``, which only enqueues. If the
  link's queue is full the segment is kept here and offered again on the next tick
  (never dropped, never waited for; the link logs the refusal loudly). The newest step
  is always held back until the next one (or the episode's end) comes: an episode can be
  ended after its last tick, by an operator's verdict (``end_episode``), and that verdict
  must travel on its last step. An episode thrown away (``abandon_episode``) gets no done step:
  the learner stores it as truncated once the next one starts.
* Weights in: the link fetches and verifies announced snapshots on its own thread and
  calls ``_on_weights``; a loader thread hands them on. A policy that runs here is loaded
  into the node's shadow and offered to its inference worker (``EdgeNode.swaps``, the
  double-buffer rule of ``robot_rl.edge.swap``); a policy in a process of its own
  (``robot_rl.edge.process_runner``) has its shadow, its loader and the same rule there: the
  link assembles the download straight into a file that process maps, and only the file's
  name goes down the pipe (``ProcessPolicy.stage_weights``).

The version in use, reported in heartbeats, is the version of the newest executed step
(``robot_rl.edge.swap`` traces a version's path from the link to ``Step.policy_version``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.bridges.zmq.protocol import StatsMap, WeightsAnnounce
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.bridges.zmq.weights import WeightsError
from robot_rl.core.priority import lower_thread_priority
from robot_rl.core.types import DetectorGuess, Step
from robot_rl.edge.process_runner import ProcessPolicy
from robot_rl.edge.weight_loading import load_weights_into

if TYPE_CHECKING:
    from robot_rl.edge.node import EdgeNode

log = logging.getLogger(__name__)

LOADER_NICE = 10  # the weights loader yields the CPU to the control and inference threads
LINK_NICE = 0  # the link thread (JPEG, spool, weight hashes): left as is; lowered, it starves on a loaded machine


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
        policy: torch.nn.Module | ProcessPolicy | None = None,
        *,
        segment_steps: int = 15,
        image_encoding: ImageEncoding | None = None,
        queue_size: int = 256,
        episode_id_fn: Callable[[], int] = wall_clock_episode_id,
    ) -> None:
        if segment_steps < 1:
            raise ValueError(f"segment_steps must be >= 1, got {segment_steps}")
        # A policy in its own process loads weights there (its shadow lives there too).
        self._remote = policy if isinstance(policy, ProcessPolicy) else None
        self.link = StreamingClient(config, on_weights=self._on_weights if policy is not None else None,
                                    queue_size=queue_size, image_encoding=image_encoding or ImageEncoding(),
                                    allocate_weights=self._remote.allocate_weights if self._remote else None)
        self.segment_steps = segment_steps
        self.episode_id_fn = episode_id_fn
        self.node: EdgeNode | None = None
        self._policy = None if self._remote else policy  # loaded here: the node's own swap takes it
        self._episode_id: int | None = None
        self._next_episode_id: int | None = None
        self._current: list[Step] = []
        self._unsent: deque[_Pending] = deque()
        self._drain_lock = threading.Lock()  # control thread and loader thread both drain; never waited for
        self._reported_version = config.policy_version
        self._weights: queue.Queue[tuple[WeightsAnnounce, bytes | memoryview]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._loader = threading.Thread(target=self._load_loop, name=f"weights-{config.robot_id}", daemon=True)
        self.swaps_requested = 0
        self.weights_rejected = 0
        self.submit_retries = 0

    # ------------------------------------------------------------ lifecycle

    def attach(self, node: EdgeNode) -> EdgeStreamer:
        """Become ``node``'s step sink (steps go out as they happen) and the reader of its ticks for heartbeats."""
        self.node = node
        node.step_sink = self.sink
        self.link.report = self._heartbeat_report  # read by the link's thread once it starts
        return self

    def start(self) -> EdgeStreamer:
        if self.link.config.fetch_weights:  # the shadow made now, off the control path, not with the first weights
            if self._remote is not None:
                self._remote.prepare_for_weights()  # its shadow and a download file, in its process
            elif isinstance(self._policy, torch.nn.Module) and self.node is not None:
                self.node.swaps.prepare()
        self.link.start()
        self._loader.start()
        link_thread = getattr(self.link, "_thread", None)
        if link_thread is not None:
            lower_thread_priority(link_thread, LINK_NICE)
        lower_thread_priority(self._loader, LOADER_NICE)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Hand over what is still held here, then stop the link (its spool keeps anything unacked)."""
        if self._current:  # an episode cut short by the stop: what it has, as an ended episode
            self.end_episode()
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

    def detector_guess(self) -> DetectorGuess | None:
        """The learner's success detector's newest guess on the episode this link streams now (its
        acks bring it, a segment or two behind the robot); None while there is none for it."""
        guess = self.link.detector_guess
        return guess if guess is not None and guess.episode_id == self._episode_id else None

    def _heartbeat_report(self) -> StatsMap:
        """The node's ticks and their lateness, and the episode it records, for the learner's console.
        Also the version in use for the next heartbeat: a robot between episodes (an operator choosing
        a verdict, a scene being reset) sends no segments, and the version its node swapped to must
        reach the learner's console all the same."""
        if self.node is not None:
            self._report_version(self.node.policy_version)
        report = self.node.stats.heartbeat() if self.node is not None else {}
        return {**report, "episode": self._episode_id if self._episode_id is not None else -1}

    # ------------------------------------------------------------ control thread: never blocks

    def sink(self, step: Step) -> None:
        """The node's ``step_sink``: list appends and a non-blocking enqueue only."""
        if step.tick == 0 or self._episode_id is None:
            self._start_episode()
        self._report_version(step.policy_version)
        self._current.append(step)
        if step.done:
            self._hold(self._current, done=True)
            self._current = []
        elif len(self._current) > self.segment_steps:  # a full segment, and the newest step held back
            self._hold(self._current[:-1], done=False)
            self._current = self._current[-1:]
        self._drain_unsent()

    def _report_version(self, version: int) -> None:
        if version != self._reported_version:
            self._reported_version = version
            self.link.set_policy_version(version)

    def end_episode(self) -> None:
        """The episode ended after its last tick (an operator's verdict, already written into that
        step's ``done``/``success``): send what is held, its last step marked done. Control thread."""
        if self._current:
            self._current[-1].done = True
            self._hold(self._current, done=True)
            self._current = []
        self._drain_unsent()

    def abandon_episode(self) -> None:
        """The episode goes no further and has no verdict (an attempt the operator throws away): what
        is held is sent as an ordinary segment, and the next tick starts a new episode, whereupon the
        learner stores this one as truncated (it keeps the experience, claims no outcome). Control thread."""
        if self._current:
            self._hold(self._current, done=False)
            self._current = []
        self._episode_id = None
        self._drain_unsent()

    def _hold(self, steps: list[Step], *, done: bool) -> None:
        """Queue ``steps`` of the current episode for the link (``_drain_unsent`` hands them over)."""
        if self._episode_id is None:  # sink() starts an episode before it holds any step
            raise RuntimeError("steps held outside an episode")
        self._unsent.append(_Pending(self._episode_id, steps, done))

    def _start_episode(self) -> None:
        if self._current:  # the previous episode ended without a done step: send what it has
            self._hold(self._current, done=True)
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

    def _on_weights(self, announce: WeightsAnnounce, data: bytes | memoryview) -> None:
        """Called on the link thread with verified bytes; hand over to the loader (latest wins)."""
        with contextlib.suppress(queue.Empty):
            self._weights.get_nowait()
        self._weights.put_nowait((announce, data))

    def _load_loop(self) -> None:
        """Loader thread: loads weights, and keeps offering held segments when the robot is idle."""
        item: tuple[WeightsAnnounce, bytes | memoryview] | None = None
        while not self._stop.is_set():
            if self._unsent:
                self._drain_unsent(block=True)
            try:
                item = self._weights.get(timeout=0.05 if item is None else 0.005)  # newer weights win
            except queue.Empty:
                if item is None:
                    continue
            if self.node is None:
                log.warning("weights v%d arrived but no node is attached; ignored", item[0].version)
                item = None
                continue
            if self._remote is not None:
                announce, data = item
                item = None
                self._remote.stage_weights(announce.version, data)  # a file name down a pipe
                self.swaps_requested += 1
                continue
            shadow = self.node.swaps.free_shadow()
            if shadow is None:
                continue  # the worker is swapping the shadow in for one chunk; try again in a few ms
            announce, data = item
            item = None
            try:
                load_weights_into(shadow, data)
            except (WeightsError, ValueError, RuntimeError) as exc:
                self.weights_rejected += 1
                log.error("robot %s: weights v%d refused: %s", self.link.config.robot_id, announce.version, exc)
                continue
            self.node.request_policy_swap(shadow, announce.version)
            self.swaps_requested += 1
            log.info("robot %s: weights v%d loaded into the shadow policy; swapping at the next chunk",
                     self.link.config.robot_id, announce.version)

