"""Glue between an EdgeNode and the learner link (``robot_rl.bridges.zmq.StreamingClient``).

Two directions, neither of which may slow the control thread:

* Steps out: ``EdgeStreamer.sink`` is the node's ``step_sink``. It appends the Step to
  the current segment and, every ``segment_steps`` steps or at the episode's end,
  hands the segment to ``StreamingClient.submit_steps``, which only enqueues. If the
  link's queue is full the segment is kept here and offered again on the next tick
  (never dropped, never waited for; the link logs the refusal loudly). The newest step
  is always held back until the next one (or the episode's end) comes: an episode can be
  ended after its last tick, by an operator's verdict (``end_episode``), and that verdict
  must travel on its last step.
* Weights in: the link fetches and verifies announced snapshots on its own thread and
  calls ``_on_weights``; a loader thread parses them (safetensors header, no pickle),
  checks them against the running architecture, copies them into the *shadow* policy
  and asks the node to swap it in between two chunks.

Why this shape (measured: a 100 MB model used to cost ~45 late ticks per swap). The
control thread shares the process, hence the GIL, with the loader, so the loader must never
run a long Python-level operation. There are exactly two policy objects: the one the node
runs and one shadow, allocated once at construction (never per swap: no ``deepcopy``, no
fresh allocations for the GC or the allocator to chew on). New weights go straight from the
received buffer into the shadow's tensors: ``torch.frombuffer`` views of the safetensors
bytes (no deserialised copy, no float32 cast copy), copied with ``Tensor.copy_`` in slices
of a few MB (a tensor of at most one slice and of the shadow's own dtype by numpy, on one
thread), both with the GIL released. The swap itself is a pointer assignment in the inference
worker. Once the worker runs the shadow, the policy it dropped
becomes the next shadow. If the previous shadow's swap is still pending when newer weights
arrive, the request is withdrawn first (the latest version wins anyway); if the worker has
already taken it but not applied it yet, the loader waits for that one chunk.

A policy that runs in a process of its own (``robot_rl.edge.process_runner``) has its shadow and
loader there: the link assembles the download straight into a file that process maps, and this
streamer only sends the file's name (``ProcessPolicy.stage_weights``); nothing of the load runs
in the control process.

The version in use, reported in heartbeats, is the version of the newest executed step:
that is when a swap has really happened, not when the weights arrived.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from robot_rl.bridges.zmq.client import ClientConfig
from robot_rl.bridges.zmq.protocol import StatsMap, WeightsAnnounce
from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.bridges.zmq.weights import TensorView, WeightsError, tensor_views
from robot_rl.core.priority import lower_thread_priority
from robot_rl.core.types import Step
from robot_rl.edge.process_runner import ProcessPolicy
from robot_rl.policies.trainable import published_state

if TYPE_CHECKING:
    from robot_rl.edge.node import EdgeNode

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool}
LOAD_SLICE_BYTES = 4 << 20  # per copy_ call: the GIL is taken back (and offered to the control thread) between slices
LOADER_NICE = 10  # the weights loader yields the CPU to the control and inference threads
LINK_NICE = 0  # the link thread (JPEG, spool, weight hashes): left as is; lowered, it starves on a loaded machine


def load_weights_into(module: torch.nn.Module, data: bytes | bytearray | memoryview,
                      slice_bytes: int = LOAD_SLICE_BYTES) -> int:
    """Copy safetensors ``data`` into ``module``'s own tensors, in place; return the bytes read.

    Zero-copy on the input side: each tensor is a ``torch.frombuffer`` view of ``data``
    (writable buffers only, like the link's assembly buffer; a read-only one is copied once),
    cast to the parameter's dtype by ``copy_`` itself (fp16/bf16 transfers need no extra
    buffer). Names and shapes must match what ``module`` publishes (``published_state``: its state
    dict, or a trainable policy's published part) exactly (``ValueError``
    otherwise, before anything is written); malformed bytes raise ``WeightsError``.
    """
    views = tensor_views(data)
    target = published_state(module)
    wrong = sorted(k for k in target if k not in views or views[k].shape != tuple(target[k].shape))
    extra = sorted(set(views) - set(target))
    if wrong or extra:
        raise ValueError(f"weights do not fit the running policy (mismatched {wrong[:5]}, unexpected {extra[:5]})")
    if memoryview(data).readonly:
        data = bytearray(data)  # torch.frombuffer wants a writable buffer (it never writes here)
    copied = 0
    with torch.no_grad():
        for name, view in views.items():
            _copy_slices(target[name], data, view, slice_bytes)
            copied += view.nbytes
    return copied


def _copy_slices(dst: torch.Tensor, data: bytes | bytearray | memoryview, view: TensorView, slice_bytes: int) -> None:
    if view.numel == 0:
        return
    dtype = _TORCH_DTYPES[view.dtype]
    if view.nbytes <= slice_bytes and dst.dtype == dtype and dst.device.type == "cpu" and dst.is_contiguous():
        # A plain memcpy on this thread, the GIL released as by copy_. torch's copy_ of a tensor above
        # 32K elements is a parallel region that waits for its slowest worker thread, and after an idle
        # second its first one took 12 ms on 2 cores against 1.2 ms on one thread (outside the bench):
        # hundreds of small tensors per LoRA adapter, each waiting for threads, when one suffices.
        raw = np.frombuffer(data, np.uint8, view.nbytes, view.offset)
        np.copyto(dst.detach().view(-1).view(torch.uint8).numpy(), raw)
        return
    src = torch.frombuffer(data, dtype=dtype, count=view.numel, offset=view.offset)
    if not dst.is_contiguous():
        dst.copy_(src.view(view.shape))
        return
    flat = dst.view(-1)
    step = max(1, slice_bytes // src.element_size())
    for start in range(0, view.numel, step):
        flat[start : start + step].copy_(src[start : start + step])


def shadow_of(policy: torch.nn.Module) -> Any:
    """The second policy object weights are loaded into: its published tensors are its own, and
    every tensor that never travels (a frozen VLM, a LoRA adapter's base) is the live policy's,
    shared, because no swap ever writes it: a 0.9 GB SmolVLM is held once, not twice."""
    published = {t.data_ptr() for t in published_state(policy).values() if t.numel()}
    memo: dict[int, Any] = {}
    for tensor in (*policy.parameters(), *policy.buffers()):
        if tensor.numel() and tensor.data_ptr() not in published:
            memo[id(tensor)] = tensor
    return copy.deepcopy(policy, memo).eval()


def receives_weights(policy: object) -> bool:
    """True where published weights can be swapped into ``policy`` (a torch module, here or in its own process)."""
    return isinstance(policy, torch.nn.Module) or (isinstance(policy, ProcessPolicy) and policy.swappable)


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
        # The one shadow, allocated now (off the control path), on the policy's device. ``policy``
        # itself becomes the shadow after the first swap: its weights are overwritten then.
        self._live = None if self._remote else policy
        # Any: a torch module that is also the node's ChunkPolicy (FlowVLA).
        self._shadow: Any = shadow_of(self._live) if isinstance(self._live, torch.nn.Module) else None
        self._requested: tuple[torch.nn.Module, int] | None = None  # shadow handed to the node, not yet seen in use
        self._failures_at_request = 0
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
        self.shadow_recycled = 0  # swaps completed: the dropped policy became the next shadow
        self.swaps_withdrawn = 0  # pending swaps superseded by newer weights before the worker took them

    # ------------------------------------------------------------ lifecycle

    def attach(self, node: EdgeNode, *, stream_steps: bool = True) -> EdgeStreamer:
        """Become ``node``'s swap target and, with ``stream_steps``, its step sink (steps go out
        as they happen). Without it the caller hands over whole episodes (``send_episode``): an
        operator session, which streams an episode only once its verdict says it is kept."""
        self.node = node
        if stream_steps:
            node.step_sink = self.sink
        self.link.report = self._heartbeat_report  # read by the link's thread once it starts
        return self

    def start(self) -> EdgeStreamer:
        if self._remote is not None and self.link.config.fetch_weights:
            self._remote.prepare_for_weights()  # its shadow and a download file, as ours are made up front
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

    def _heartbeat_report(self) -> StatsMap:
        """The node's ticks and their lateness, and the episode it records, for the learner's console.
        Also the version in use for the next heartbeat: a session hands its steps over only once the
        episode ends, and the version they carry would reach the learner a whole episode late."""
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

    def send_episode(self, steps: list[Step]) -> None:
        """Stream one whole, ended episode (a new episode id; its last step carries done).
        Never blocks: what the link's queue cannot take yet is offered again later, in order."""
        self._start_episode()
        for start in range(0, len(steps), self.segment_steps):
            part = steps[start:start + self.segment_steps]
            done = start + self.segment_steps >= len(steps)
            if done:
                part[-1].done = True
            self._hold(part, done=done)
        self._report_version(steps[-1].policy_version if steps else self._reported_version)
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
            if not self._free_shadow():
                continue  # the worker holds the shadow's swap for one chunk; try again in a few ms
            announce, data = item
            item = None
            try:
                self._load_shadow(data)
            except (WeightsError, ValueError, RuntimeError) as exc:
                self.weights_rejected += 1
                log.error("robot %s: weights v%d refused: %s", self.link.config.robot_id, announce.version, exc)
                continue
            assert self._shadow is not None
            self._requested = (self._shadow, announce.version)
            self._failures_at_request = self._swap_failures()
            self.node.request_policy_swap(self._shadow, announce.version)
            self.swaps_requested += 1
            log.info("robot %s: weights v%d loaded into the shadow policy; swapping at the next chunk",
                     self.link.config.robot_id, announce.version)

    def _load_shadow(self, data: bytes | memoryview) -> None:
        assert self._shadow is not None
        load_weights_into(self._shadow, data)

    def _free_shadow(self) -> bool:
        """True when nothing but this thread can touch ``self._shadow``.

        After a swap request the shadow is (a) running in the worker: the policy it replaced is
        free and becomes the shadow; (b) still pending in the node: withdrawn (newer weights are
        about to supersede it); (c) taken by the control thread but not yet applied by the
        worker: not free for the length of one chunk (False; the caller retries).
        """
        if self._requested is None:
            return True
        assert self.node is not None
        shadow, _version = self._requested
        if self.node.running_policy is shadow:
            self._live, self._shadow = shadow, self._live
            self._requested = None
            self.shadow_recycled += 1
            return True
        if self.node.withdraw_policy_swap(shadow):
            self._requested = None
            self.swaps_withdrawn += 1
            return True
        if self._swap_failures() > self._failures_at_request:
            self._requested = None  # the worker refused it and kept the old policy: the shadow is unused
            return True
        return False

    def _swap_failures(self) -> int:
        return self.node.stats.swap_failures if self.node is not None else 0
