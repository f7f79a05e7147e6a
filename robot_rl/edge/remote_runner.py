"""Inference on a policy server (``robot_rl.learner.serving``) instead of on the robot's machine.

``RemotePolicy`` stands where a local policy stands: the edge node reads its description
(``action_dim``, ``chunk_size``, ``cameras``), calls it once before the robot moves, and runs it
through its worker, ``RemoteRunner`` (the ``InferenceWorker`` interface of the local runners), so
the node's timing contract is unchanged: requests go out on the node's schedule, and the delay
estimate, measured from request tick to arrival tick, now includes the network.

The control thread only hands a request over (``submit``) and takes finished ones (``poll``); one
background thread resizes the frames to the policy's input, JPEG-encodes them (a few ms per camera,
never on the control thread), sends, and receives. Every request has a deadline: a request with no
answer by then is given up, its slot freed, and the server is reported silent once; the node's plan
runs out and the arm holds (an empty queue is a hold, as with a slow local policy), and when a chunk
comes again the runner says so once and the node resumes. A late answer to a given-up request is
ignored. Weights are the server's business: ``swappable`` is False, so the edge downloads none.

A served policy that reads past observations (Diffusion's ``n_obs_steps``) says so in its
``policy_info``; ``RemotePolicy.observation_history`` passes it on, so the node keeps that many, and
each request carries them, resized and JPEG-encoded on the same thread as the current frames.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from robot_rl.bridges.zmq.codec import ProtocolError, decode_frames
from robot_rl.bridges.zmq.inference_wire import (
    CHUNK,
    HELLO_ID,
    POLICY_INFO,
    ChunkReply,
    ChunkRequest,
    PastJpeg,
    PolicyInfo,
    decode_info,
    decode_reply,
    encode_hello,
    encode_request,
)
from robot_rl.bridges.zmq.keys import ClientCurve, apply_client_curve, check_endpoint_security
from robot_rl.bridges.zmq.link import LinkConfig
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_image
from robot_rl.core.errors import ConfigError
from robot_rl.core.types import ActionChunk
from robot_rl.edge.inference import InferenceRequest, InferenceResult, PolicySwap
from robot_rl.policies.base import ChunkPolicy, InvalidChunkError, ObservationHistory, PastObservation, validate_chunk
from robot_rl.policies.trainable import InputFrames

log = logging.getLogger(__name__)

_IDLE_POLL_MS = 50  # the I/O thread's wake-up when nothing is due (to notice close())


@dataclass(frozen=True)
class RemoteInferenceConfig:
    """Where the policy server is and how long a chunk may take (``edge.inference_runner=remote``)."""

    endpoint: str  # the server's ROUTER, link.policy_server
    robot_id: str  # the id this robot asks as (its CURVE key is bound to it)
    curve: ClientCurve | None = None  # this robot's keys and the server's public key; required off loopback
    # A chunk not here this long after it was asked for is given up: the edge's plan (a chunk of 20
    # actions lasts 0.67 s at 30 Hz) has run on, and the server drops it too rather than answer late.
    deadline_s: float = 1.0
    connect_timeout_s: float = 10.0  # the server's answer to the hello (building a VLA takes it a while)
    jpeg_quality: int = 90  # frames at 224x224: ~10 KB each at 90
    pinned_version: int | None = None  # ask for this version (the server keeps it resident), not the newest
    allow_insecure: bool = False  # plain TCP off loopback (an isolated network only)

    @classmethod
    def from_link(cls, link: LinkConfig, robot_name: str) -> RemoteInferenceConfig:
        """Where a robot called ``robot_name`` asks for its chunks (``link.policy_server``); CURVE keys
        loaded here, and an address off loopback without them refused here, before anything moves."""
        if link.policy_server is None:
            raise ValueError("edge.inference_runner=remote needs the server's address: "
                             "link.policy_server=tcp://HOST:5557 (robot-rl serve prints it)")
        server_key = link.policy_server_key or link.learner_key
        curve = None
        if link.secret_key is not None and server_key is not None:
            curve = ClientCurve.from_files(link.secret_key, server_key)
        return cls(link.policy_server, link.robot_id or robot_name, curve=curve)


@dataclass
class _Pending:
    request: InferenceRequest | None  # None: the hello
    deadline_s: float  # the request's budget, on the wire and here
    answer: queue.SimpleQueue[ChunkReply] | None = None  # where a synchronous call waits
    given_up_at: float = 0.0  # time.monotonic(), set when sent


class RemoteRunner:
    """``InferenceWorker`` whose chunks come from a policy server (see the module doc)."""

    def __init__(self, policy: RemotePolicy, clock_now: Callable[[], float], action_dim: int,
                 max_inflight: int) -> None:
        self.policy = policy
        self.max_inflight = max_inflight
        self.action_dim = action_dim
        self._now = clock_now
        self._outstanding: set[int] = set()  # the control thread's: submitted, not polled back
        self.given_up = 0  # requests with no answer by their deadline

    @property
    def running_policy(self) -> ChunkPolicy:
        return self.policy

    @property
    def in_flight(self) -> int:
        return len(self._outstanding)

    @property
    def busy(self) -> bool:
        return bool(self._outstanding)

    def submit(self, request: InferenceRequest) -> None:
        if len(self._outstanding) >= self.max_inflight:
            raise RuntimeError(f"{len(self._outstanding)} inferences already in flight (max {self.max_inflight}); "
                               "poll first")
        self._outstanding.add(request.chunk_id)
        self.policy.link.send(request.chunk_id, _Pending(request, self.policy.config.deadline_s))

    def poll(self, now: float) -> InferenceResult | None:
        while True:
            try:
                request, reply = self.policy.link.results.get_nowait()
            except queue.Empty:
                return None
            self._outstanding.discard(request.chunk_id)
            if reply is None:  # given up at its deadline: the slot is free, nothing to splice
                self.given_up += 1
                continue
            return self._result(request, reply)

    def _result(self, request: InferenceRequest, reply: ChunkReply) -> InferenceResult:
        ready = self._now()
        version, error = reply.version, reply.error
        chunk = None
        if reply.chunk is not None:
            try:
                actions = validate_chunk(reply.chunk, self.policy.chunk_size, self.action_dim)
                chunk = ActionChunk(actions=actions, chunk_id=request.chunk_id, policy_version=version,
                                    request_tick=request.request_tick, delay_ticks=request.delay_ticks,
                                    rolled_state=request.rolled_state, inference_s=reply.compute_s)
            except InvalidChunkError as exc:
                error = f"invalid chunk from the policy server's v{version}: {exc}"
        if version != self.policy.version and chunk is not None:  # the node counts a swap by its request
            request = dataclasses.replace(request, swap=PolicySwap(version=version))
            self.policy.version = version
        # The robot's share of the server's forward: what edge.replan=auto budgets.
        device_s = reply.compute_s / max(reply.batch, 1)
        return InferenceResult(request, chunk, version, reply.compute_s, error=error, ready_time_s=ready,
                               latency_s=ready - request.request_time_s, device_s=device_s)

    def close(self) -> None:
        self._outstanding.clear()


class _ServerLink:
    """The I/O thread and its DEALER: encodes and sends requests, receives chunks, gives up at deadlines."""

    def __init__(self, config: RemoteInferenceConfig) -> None:
        check_endpoint_security(config.endpoint, config.curve, config.allow_insecure)
        self.config = config
        self.fits: dict[str, InputFrames] = {}  # per camera, from the server's policy_info before any request
        self.encoding = ImageEncoding(format="jpeg", jpeg_quality=config.jpeg_quality)
        self.results: queue.SimpleQueue[tuple[InferenceRequest, ChunkReply | None]] = queue.SimpleQueue()
        self.silent = False  # the server has let a request reach its deadline; reset by the next answer
        self.bytes_sent = 0
        self.requests_sent = 0
        self._jobs: queue.SimpleQueue[tuple[int, _Pending]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()  # any thread may wake the I/O thread
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.ROUTING_ID, f"{config.robot_id}/".encode()[:128] + uuid.uuid4().hex.encode())
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)  # no queue for a server that is not there: nothing goes stale
        self._socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, 500)  # a server gone without a FIN is noticed in ~2 s
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 2000)
        if config.curve is not None:
            apply_client_curve(self._socket, config.curve)
        self._socket.connect(config.endpoint)
        self._info: queue.SimpleQueue[PolicyInfo | str] = queue.SimpleQueue()
        self._pending: dict[int, _Pending] = {}  # the I/O thread's
        self._thread = threading.Thread(target=self._loop, name="edge-remote-inference", daemon=True)
        self._thread.start()

    def hello(self, timeout_s: float) -> PolicyInfo:
        """The served policy's description; ``ConnectionError`` if the server refuses or does not answer."""
        deadline = time.monotonic() + timeout_s
        self.send(HELLO_ID, None)
        while (left := deadline - time.monotonic()) > 0:
            try:
                answer = self._info.get(timeout=min(left, 1.0))
            except queue.Empty:
                self.send(HELLO_ID, None)  # sent again: a hello is dropped while the connection is not up
                continue
            if isinstance(answer, str):
                raise ConnectionError(f"the policy server at {self.config.endpoint} refused robot "
                                      f"{self.config.robot_id!r}: {answer}")
            try:
                self.fits = {cam: InputFrames(size.height, size.width, size.fit) for cam, size in answer.frames.items()}
            except ValueError as exc:
                raise ConnectionError(f"the policy server at {self.config.endpoint} asks for frames this edge cannot "
                                      f"make ({exc}): update robot_rl on the edge or the server") from exc
            return answer
        raise ConnectionError(
            f"the policy server at {self.config.endpoint} did not answer within {timeout_s:.0f} s: is `robot-rl "
            "serve` (or a serving learner) running there, and do link.policy_server_key and link.secret_key "
            "hold its public key and a key it accepts?")

    def send(self, request_id: int, pending: _Pending | None) -> None:
        self._jobs.put((request_id, pending) if pending is not None else (HELLO_ID, _Pending(None, 0.0)))
        os.write(self._wake_write, b"\0")

    def close(self) -> None:
        self._stop.set()
        os.write(self._wake_write, b"\0")
        self._thread.join(timeout=5.0)
        self._socket.close(linger=0)
        self._ctx.term()
        os.close(self._wake_read)
        os.close(self._wake_write)

    # ------------------------------------------------------------ the I/O thread

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        while not self._stop.is_set():
            due = min((p.given_up_at for p in self._pending.values()), default=None)
            # At least 1 ms: ZeroMQ's poll takes whole milliseconds, and 0 would spin until the deadline.
            left_ms = _IDLE_POLL_MS if due is None else math.ceil((due - time.monotonic()) * 1e3)
            timeout = max(1, min(_IDLE_POLL_MS, left_ms))
            ready = dict(poller.poll(timeout))
            if self._wake_read in ready:
                os.read(self._wake_read, 4096)
            while True:
                try:
                    request_id, pending = self._jobs.get_nowait()
                except queue.Empty:
                    break
                self._send(request_id, pending)
            if self._socket in ready:
                self._receive()
            self._give_up(time.monotonic())

    def _send(self, request_id: int, pending: _Pending) -> None:
        if request_id == HELLO_ID:
            frames = encode_hello(self.config.robot_id)
        else:
            frames = encode_request(self._wire_request(request_id, pending))
            pending.given_up_at = time.monotonic() + pending.deadline_s
            self._pending[request_id] = pending
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return  # no connection now: the request waits out its deadline like one the server lost
        self.bytes_sent += sum(len(memoryview(f)) for f in frames)
        self.requests_sent += request_id != HELLO_ID

    def _wire_request(self, request_id: int, pending: _Pending) -> ChunkRequest:
        request = pending.request
        assert request is not None  # a synchronous call builds its InferenceRequest too
        past = tuple(PastJpeg(self._jpeg(seen.images), np.asarray(seen.state, dtype=np.float32))
                     for seen in request.history)
        return ChunkRequest(robot_id=self.config.robot_id, request_id=request_id, tick=request.request_tick,
                            state=np.asarray(request.state, dtype=np.float32), instruction=request.instruction,
                            jpeg=self._jpeg(request.images), deadline_s=pending.deadline_s,
                            pinned_version=self.config.pinned_version, past=past)

    def _jpeg(self, images: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The frames the policy reads (each camera fitted as the policy itself would: ``InputFrames``),
        JPEG-encoded. A camera the served policy does not read is not sent."""
        return {cam: encode_image(self.fits[cam].apply(np.ascontiguousarray(frame)[None])[0], self.encoding)
                for cam, frame in images.items() if cam in self.fits}

    def _receive(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = decode_frames(frames)
                if msg.type == POLICY_INFO:
                    self._info.put(decode_info(msg))
                    continue
                if msg.type != CHUNK:
                    raise ProtocolError(f"a policy server answers {POLICY_INFO!r} and {CHUNK!r}, not {msg.type!r}")
                reply = decode_reply(msg)
            except ProtocolError as exc:
                log.error("unreadable answer from the policy server at %s, ignored: %s", self.config.endpoint, exc)
                continue
            if reply.request_id == HELLO_ID:
                self._info.put(reply.error or "refused")
                continue
            pending = self._pending.pop(reply.request_id, None)
            if pending is None:
                continue  # an answer after its deadline: that request was given up
            if self.silent:
                self.silent = False
                log.warning("the policy server at %s answers again; chunks resume", self.config.endpoint)
            if pending.answer is not None:
                pending.answer.put(reply)
            elif pending.request is not None:
                self.results.put((pending.request, reply))

    def _give_up(self, now: float) -> None:
        late = [rid for rid, p in self._pending.items() if p.given_up_at <= now]
        for request_id in late:
            pending = self._pending.pop(request_id)
            if pending.answer is not None:
                pending.answer.put(ChunkReply(request_id, None, -1, 0.0, 0.0, 0, error="no answer by the deadline"))
            elif pending.request is not None:
                self.results.put((pending.request, None))
        if late and not self.silent:
            self.silent = True
            log.error("the policy server at %s gave no chunk within %.2f s; the arm holds once its plan runs out, "
                      "until the server answers again", self.config.endpoint, self.config.deadline_s)


class RemotePolicy:
    """A policy served by ``robot-rl serve`` or a serving learner, as the edge sees it (a ``SelfServingPolicy``).

    >>> policy = RemotePolicy(RemoteInferenceConfig("tcp://gpu-box:5557", robot_id="so101-a", curve=curve))
    >>> node = EdgeNode(robot, policy, WallClock(), EdgeConfig())   # the node takes its RemoteRunner
    """

    swappable = False  # the server takes published weights itself; the edge downloads none

    def __init__(self, config: RemoteInferenceConfig) -> None:
        self.config = config
        self.link = _ServerLink(config)
        try:
            self.info = self.link.hello(config.connect_timeout_s)
        except ConnectionError:
            self.link.close()
            raise
        self.version = self.info.version
        self._runner: RemoteRunner | None = None
        self._sync_ids = itertools.count(-2, -1)  # below HELLO_ID: never a chunk id
        log.info("policy served by %s (v%d, frames %s)", config.endpoint, self.version,
                 ", ".join(f"{cam} {s.height}x{s.width} {s.fit}" for cam, s in self.info.frames.items()))

    @property
    def action_dim(self) -> int:
        return self.info.action_dim

    @property
    def state_dim(self) -> int:
        return self.info.state_dim

    @property
    def chunk_size(self) -> int:
        return self.info.chunk_size

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.info.cameras

    @property
    def observation_history(self) -> ObservationHistory:
        """The observations the served policy reads a request: how many the edge node keeps and sends. (Where
        a training target starts, ``past_actions``, is the learner's business and not announced.)"""
        return ObservationHistory(steps=self.info.observation_steps)

    def config_hash(self) -> str:
        return self.info.config_hash

    def __repr__(self) -> str:
        return f"RemotePolicy({self.config.endpoint}, v{self.version})"

    def bind_joints(self, names: tuple[str, ...] | list[str]) -> None:
        if len(names) != self.action_dim:
            raise ConfigError(f"the served policy drives {self.action_dim} joints, this robot has {len(names)}")

    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray:
        """One chunk, waited for (before the robot moves: the warm-up, whose first forward on the server may
        be cold, so it has ``connect_timeout_s``); ``RuntimeError`` if none comes."""
        return self.predict_chunk_with_history((), observation, state, instruction)

    def predict_chunk_with_history(self, history: Sequence[PastObservation], observation: dict[str, np.ndarray],
                                   state: np.ndarray, instruction: str) -> np.ndarray:
        """``predict_chunk`` with the observations of the ticks before (oldest first, at most
        ``observation_history.steps - 1``: the server refuses more)."""
        request = InferenceRequest(chunk_id=next(self._sync_ids), request_tick=0, request_time_s=0.0,
                                   images=observation, state=np.asarray(state, np.float32), instruction=instruction,
                                   executed_index=-1, delay_ticks=0, delay_estimate=0, start_tick=None,
                                   rolled_state=None, generation=0, history=tuple(history))
        answer: queue.SimpleQueue[ChunkReply] = queue.SimpleQueue()
        self.link.send(request.chunk_id, _Pending(request, self.config.connect_timeout_s, answer))
        reply = answer.get()  # the I/O thread answers by the deadline at the latest
        if reply.chunk is None:
            raise RuntimeError(f"the policy server at {self.config.endpoint} gave no chunk: {reply.error}")
        return np.asarray(reply.chunk)

    def save_pretrained(self, directory: str | Path) -> None:
        raise ConfigError(f"the served policy's weights are on the policy server at {self.config.endpoint}; "
                          "save them there (its checkpoint, or the learner's)")

    def runner(self, clock_now: Callable[[], float], action_dim: int, max_inflight: int = 1) -> RemoteRunner:
        if self._runner is None:
            self._runner = RemoteRunner(self, clock_now, action_dim, max_inflight)
        return self._runner

    def close(self) -> None:
        self.link.close()

