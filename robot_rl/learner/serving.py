"""A policy server: one batched forward for every robot that asked, new weights taken in place.

Most robot PCs have no GPU, and a VLA of a few hundred million parameters or more needs one to
produce a chunk in time. So an edge may send its request (``bridges/zmq/inference_wire``: what the
policy reads, JPEG at its input size) to this server instead of running the policy.

* **Batching.** The first request of an idle server opens a window of ``batch_window_ms``; every
  robot that asks within it joins the same forward, up to ``max_batch`` robots (a forward of 16
  costs little more than one of 1 on a GPU, and the window costs each request at most its length).
  A full batch, or every known robot present, closes the window early.
* **Fair.** Each robot has its own queue (``max_queued_per_robot`` deep) and a forward takes at most
  one request per robot, oldest robot first: a robot that asks often cannot push the others out.
* **Noise per robot.** A flow policy's chunk starts from Gaussian noise. Each robot's rows come from
  its own ``torch.Generator`` seeded from ``noise_seed`` and its id (``robot_noise_seed``), drawn in
  the order of its own requests, so a robot's chunk is the one it would get alone, whoever else asked.
  A policy served one request at a time (a LeRobot policy) draws its noise from torch's RNG, which is
  seeded for each forward from the robot's generator (``torch_rng_from``).
* **Observation history.** A policy that reads the observations of the ticks before (Diffusion's
  ``n_obs_steps``) is announced as such in ``policy_info``; each edge keeps that many and sends them
  with every request, and a request with more is refused.
* **Deadlines.** Every request carries a budget from its receipt; a request still queued when its
  budget is spent, or whose forward ends past it, is dropped and never answered late: the edge has
  moved on by then, and its own timer frees its slot.
* **Weights in place.** ``load_published(state_dict, version)`` copies a published version's tensors
  into the serving copy (``Tensor.copy_``: device to device beside a trainer, no serialization),
  between two forwards, so every robot acts with the new weights from the next forward on. The
  versions it replaces stay resident (``resident_versions`` of them, their memory reused), so a
  robot pinned to one of them is still served it.

Threads: one owns the socket (receives, authenticates, queues, sends replies); one forms batches
and runs the forwards. Replies cross between them over an inproc socket, as ZeroMQ sockets are
never shared between threads.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import zmq

from robot_rl.bridges.zmq.codec import ProtocolError, decode_frames
from robot_rl.bridges.zmq.inference_wire import (
    HELLO_ID,
    INFER,
    INFER_HELLO,
    ChunkReply,
    ChunkRequest,
    FrameSize,
    PastJpeg,
    PolicyInfo,
    decode_hello,
    decode_request,
    encode_info,
    encode_reply,
)
from robot_rl.bridges.zmq.keys import apply_server_curve, check_endpoint_security, start_authenticator
from robot_rl.bridges.zmq.segments import decode_image
from robot_rl.learner.serving_config import ServeConfig
from robot_rl.policies.base import HistoryChunkPolicy, PastObservation
from robot_rl.policies.trainable import published_state

if TYPE_CHECKING:
    from robot_rl.learner.service import LearnerService

log = logging.getLogger(__name__)

_POLL_MS = 50  # the socket thread's wake-up when nothing arrives (to notice stop())


def serve_from_learner(service: LearnerService, config: ServeConfig) -> PolicyServer:
    """A policy server beside the learner's trainer, on its device: a copy of the deployed weights
    that takes every published version in place as it is published (the trainer's lock is held, so
    the copy is of exactly the published tensors; it waits for at most one forward)."""
    trainer = service.trainer
    server = PolicyServer(copy.deepcopy(trainer.deployed).eval(), config, version=trainer.version)
    service.publish_listeners.append(
        lambda blob: server.load_published(trainer.deployed.published_state_dict(), blob.version))
    return server.start()


def robot_noise_seed(noise_seed: int, robot_id: str) -> int:
    """The seed of a robot's noise generator: stable across runs and machines (not Python's ``hash``)."""
    return (int(noise_seed) * 1_000_003 + zlib.crc32(robot_id.encode())) % (2**63)


@contextlib.contextmanager
def torch_rng_from(generator: torch.Generator, device: torch.device | None = None) -> Iterator[None]:
    """Torch's RNG (the CPU's and ``device``'s), within the block, seeded by the next draw from ``generator``
    and restored after it: a policy that draws its noise from torch's RNG (LeRobot's: Diffusion draws
    at every denoising step) samples from the robot's own stream. Reproducible where nothing else in
    the process draws from torch's RNG meanwhile (a trainer beside the server does)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[device] if device is not None and device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def input_frame_sizes(policy: Any, default_side: int) -> dict[str, FrameSize]:
    """Per camera, the frame the policy reads and its fit: what a trainable policy declares
    (``input_frames``: FlowVLA's square, ACT's config shape, SmolVLA's and pi0's resize with bars), else
    ``default_side`` square, stretched. An edge that sent a square to a policy that pads would hand it
    a stretched scene without its bars: not what it was trained on."""
    declared = getattr(policy, "input_frames", None) or {}
    return {cam: FrameSize(declared[cam].height, declared[cam].width, declared[cam].fit) if cam in declared
            else FrameSize(default_side, default_side) for cam in getattr(policy, "cameras", ())}


@dataclass
class _Queued:
    request: ChunkRequest
    frames: dict[str, np.ndarray]  # the decoded JPEGs (decoded at receipt, while a forward runs)
    history: tuple[PastObservation, ...]  # the ticks before, decoded likewise (a policy that reads them)
    identity: bytes
    received_s: float  # time.monotonic() at receipt

    def expired(self, now: float) -> bool:
        return now - self.received_s > self.request.deadline_s


@dataclass
class ServeStats:
    forwards: int = 0
    chunks: int = 0
    chunks_by_robot: dict[str, int] = field(default_factory=dict)  # the chunks each robot was answered
    dropped_late: int = 0  # requests past their deadline: never answered
    refused: int = 0  # bad messages, unknown robots for a key, full queues, versions not resident
    batch_sizes: list[int] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)  # each forward's compute, beside its batch size

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0


class PolicyServer:
    """Serves ``policy`` (a ``ChunkPolicy``; batched where it has ``predict_chunks(..., noise=)``).

    >>> server = PolicyServer(policy, ServeConfig(endpoint="tcp://*:5557"), version=3).start()
    >>> server.load_published(trainer.policy.published_state_dict(), version=4)   # between two forwards
    >>> server.close()
    """

    def __init__(self, policy: Any, config: ServeConfig, version: int = 0) -> None:
        self.policy = policy
        # Observations read a request (the current one last); edges learn it from policy_info.
        self.observation_steps = policy.observation_history.steps if isinstance(policy, HistoryChunkPolicy) else 1
        self.config = config
        self._frame_sizes = input_frame_sizes(policy, config.image_size)  # what edges send, per camera
        self.version = version
        self.stats = ServeStats()
        self._curve = config.curve()
        check_endpoint_security(config.endpoint, self._curve, config.allow_insecure)
        self._weights = threading.Lock()  # held by a forward and by a load: weights never change mid-forward
        self._resident: OrderedDict[int, Any] = OrderedDict()  # replaced versions, oldest first
        self._generators: dict[str, torch.Generator] = {}  # touched by the batch thread only
        self._queues: OrderedDict[str, deque[_Queued]] = OrderedDict()  # robot -> its requests, oldest first
        self._queued = threading.Condition()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._auth = start_authenticator(self._ctx, self._curve.allowed_clients) if self._curve else None
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting edge keeps its routing id
        if self._curve is not None:
            apply_server_curve(self._router, self._curve)
        self._router.bind(config.endpoint)
        self.endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replies_address = f"inproc://serve-replies-{id(self)}"
        self._replies_in = self._ctx.socket(zmq.PULL)
        self._replies_in.bind(self._replies_address)
        self._threads = [threading.Thread(target=self._socket_loop, name="serve-socket", daemon=True),
                         threading.Thread(target=self._batch_loop, name="serve-batches", daemon=True)]

    def start(self) -> PolicyServer:
        for thread in self._threads:
            thread.start()
        log.info("serving %s v%d on %s (batches of up to %d within %.1f ms)", type(self.policy).__name__,
                 self.version, self.endpoint, self.config.max_batch, self.config.batch_window_ms)
        return self

    def close(self) -> None:
        self._stop.set()
        with self._queued:
            self._queued.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=10.0)
        self._router.close(linger=0)
        self._replies_in.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    # ------------------------------------------------------------ weights

    def info(self) -> PolicyInfo:
        return PolicyInfo(action_dim=int(self.policy.action_dim), state_dim=int(getattr(self.policy, "state_dim", 0)),
                          chunk_size=int(self.policy.chunk_size), cameras=tuple(getattr(self.policy, "cameras", ())),
                          frames=self._frame_sizes,
                          config_hash=self.policy.config_hash() if hasattr(self.policy, "config_hash") else "",
                          version=self.version, observation_steps=self.observation_steps)

    def load_published(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy a published version's tensors into the serving copy, in place, between two forwards.

        The version it replaces is kept resident (in the memory of the oldest resident one, once
        ``resident_versions`` are held), so robots pinned to it are still served. Raises ``KeyError``
        / ``RuntimeError`` (shapes) before any tensor is changed when ``state_dict`` does not fit."""
        target = published_state(self.policy)
        missing = sorted(set(target) - set(state_dict))
        if missing:
            raise KeyError(f"published v{version} lacks {len(missing)} tensors of the served policy, e.g. {missing[0]}")
        for name, tensor in target.items():
            if tuple(state_dict[name].shape) != tuple(tensor.shape):
                raise RuntimeError(f"published v{version}: {name} has shape {tuple(state_dict[name].shape)}, "
                                   f"the served policy {tuple(tensor.shape)}")
        with self._weights:
            if self.config.resident_versions > 0 and version != self.version:
                self._keep_resident(self.version, target)
            with torch.no_grad():
                for name, tensor in target.items():
                    tensor.copy_(state_dict[name], non_blocking=True)
            self.version = version
        log.info("serving v%d from the next forward on", version)

    def _keep_resident(self, version: int, serving: dict[str, torch.Tensor]) -> None:
        if len(self._resident) >= self.config.resident_versions:
            _, holder = self._resident.popitem(last=False)  # its memory takes the version now replaced
        else:
            holder = copy.deepcopy(self.policy)
        with torch.no_grad():
            for name, tensor in published_state(holder).items():
                tensor.copy_(serving[name])
        self._resident[version] = holder

    @property
    def resident_versions(self) -> list[int]:
        return [self.version, *self._resident]

    # ------------------------------------------------------------ the socket thread

    def _socket_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._replies_in, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(_POLL_MS))
            if self._replies_in in ready:
                while True:
                    try:
                        frames = self._replies_in.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._router.send_multipart(frames, copy=False)
            if self._router in ready:
                while True:
                    try:
                        frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._receive(frames)

    def _receive(self, frames: list[zmq.Frame]) -> None:
        identity, payload = frames[0].bytes, frames[1:]
        answer_to: int | None = None  # the request a refusal answers (HELLO_ID for a hello), once known
        try:
            msg = decode_frames(payload)
            if msg.type == INFER_HELLO:
                answer_to = HELLO_ID
                robot_id = decode_hello(msg)
                self._check_identity(payload, robot_id)
                with self._queued:  # a known robot: a window closes early once every known robot asked
                    self._queues.setdefault(robot_id, deque())
                self._router.send_multipart([identity, *encode_info(self.info())], copy=False)
            elif msg.type == INFER:
                received = time.monotonic()
                answer_to = _request_id_of(msg.body)
                request = decode_request(msg, max_past=self.observation_steps - 1)
                self._check_identity(payload, request.robot_id)
                self._enqueue(_Queued(request, self._frames(request.jpeg),
                                      tuple(self._past(past) for past in request.past), identity, received))
            else:
                raise ProtocolError(f"a policy server takes {INFER_HELLO!r} and {INFER!r}, not {msg.type!r}")
        except ProtocolError as exc:
            self.stats.refused += 1
            log.warning("refused a message: %s", exc)
            if answer_to is not None:  # the edge learns why at once, and frees its slot
                self._router.send_multipart([identity, *encode_reply(ChunkReply(
                    answer_to, None, self.version, 0.0, 0.0, 0, error=str(exc)))], copy=False)

    def _check_identity(self, payload: list[zmq.Frame], robot_id: str) -> None:
        if self._curve is None:
            return
        key = cast(str, payload[0].get("User-Id")) if payload else None  # the z85 key ZAP authenticated
        refusal = self._curve.robot_id_refusal(key, robot_id)
        if refusal is not None:
            raise ProtocolError(refusal, code="identity_mismatch")

    def _enqueue(self, item: _Queued) -> None:
        with self._queued:
            queue = self._queues.setdefault(item.request.robot_id, deque())
            if len(queue) >= self.config.max_queued_per_robot:
                raise ProtocolError(f"robot {item.request.robot_id!r} already has {len(queue)} requests queued "
                                    f"(serve.max_queued_per_robot); wait for their chunks", code="busy")
            queue.append(item)
            self._queued.notify()

    # ------------------------------------------------------------ the batch thread

    def _batch_loop(self) -> None:
        sender = self._ctx.socket(zmq.PUSH)
        sender.connect(self._replies_address)
        try:
            while not self._stop.is_set():
                batch = self._next_batch()
                if batch:
                    for frames in self._serve(batch):
                        sender.send_multipart(frames, copy=False)
        finally:
            sender.close(linger=1000)

    def _next_batch(self) -> list[_Queued]:
        """Wait for a request, hold the window open for others, take one per robot (oldest robot first)."""
        with self._queued:
            while not self._stop.is_set() and not any(self._queues.values()):
                self._queued.wait(timeout=_POLL_MS / 1000.0)
            window_ends = time.monotonic() + self.config.batch_window_ms / 1000.0
            while not self._stop.is_set():
                waiting = sum(1 for q in self._queues.values() if q)
                left = window_ends - time.monotonic()
                if waiting >= min(self.config.max_batch, len(self._queues)) or left <= 0:
                    break
                self._queued.wait(timeout=left)
            batch: list[_Queued] = []
            for robot in list(self._queues):
                queue = self._queues[robot]
                if queue and len(batch) < self.config.max_batch:
                    batch.append(queue.popleft())
                    self._queues.move_to_end(robot)  # served now: last in line for the next forward
            return batch

    def _serve(self, batch: list[_Queued]) -> list[list[Any]]:
        """The replies (frames with their routing ids) of one batch: one forward per version asked for."""
        now = time.monotonic()
        live = [item for item in batch if not item.expired(now)]
        self.stats.dropped_late += len(batch) - len(live)
        replies: list[list[Any]] = []
        with self._weights:
            groups: dict[int, list[_Queued]] = {}
            for item in live:
                version = item.request.pinned_version
                version = self.version if version is None else version
                if version == self.version or version in self._resident:
                    groups.setdefault(version, []).append(item)
                else:
                    self.stats.refused += 1
                    replies.append(self._reply(item, ChunkReply(
                        item.request.request_id, None, self.version, now - item.received_s, 0.0, 0,
                        error=f"v{version} is not resident on this policy server (resident: "
                              f"{self.resident_versions}); unpin the robot or pin a resident version")))
            for version, items in groups.items():
                policy = self.policy if version == self.version else self._resident[version]
                replies.extend(self._forward(policy, version, items))
        return replies

    def _forward(self, policy: Any, version: int, items: list[_Queued]) -> list[list[Any]]:
        started = time.monotonic()
        try:
            chunks = self._predict(policy, items)
            error = None
        except Exception as exc:  # a policy bug is answered to its robots, never kills the server
            log.exception("v%d failed on a batch of %d", version, len(items))
            chunks, error = None, f"policy v{version} raised {type(exc).__name__}: {exc}"
        done = time.monotonic()
        self.stats.forwards += 1
        self.stats.batch_sizes.append(len(items))
        self.stats.forward_s.append(done - started)
        replies = []
        for i, item in enumerate(items):
            if item.expired(done):
                self.stats.dropped_late += 1
                continue
            chunk = None if chunks is None else chunks[i]
            if chunk is not None:
                self.stats.chunks += 1
                robot = item.request.robot_id
                self.stats.chunks_by_robot[robot] = self.stats.chunks_by_robot.get(robot, 0) + 1
            replies.append(self._reply(item, ChunkReply(item.request.request_id, chunk, version,
                                                        started - item.received_s, done - started, len(items),
                                                        error=error)))
        return replies

    def _predict(self, policy: Any, items: list[_Queued]) -> np.ndarray:
        """[B, H, A]: each robot's initial noise from its own generator; one forward where the policy batches."""
        if hasattr(policy, "predict_chunks") and not isinstance(policy, HistoryChunkPolicy):
            requests = [item.request for item in items]
            noise = torch.stack([torch.randn((policy.chunk_size, policy.action_dim),
                                             generator=self._generator(r.robot_id)) for r in requests])
            return np.asarray(policy.predict_chunks([item.frames for item in items],
                                                    np.stack([r.state for r in requests]),
                                                    [r.instruction for r in requests], noise=noise), np.float32)
        # A policy that computes one chunk at a time is served one robot after another, its history with it.
        # LeRobot's are: their samplers draw noise from torch's RNG for a whole batch at once (Diffusion's
        # DDPM at every denoising step), so a robot's rows in a shared forward would depend on who else
        # asked. Each forward runs on torch's RNG seeded from its robot's generator instead.
        return np.stack([self._predict_one(policy, item) for item in items])

    def _predict_one(self, policy: Any, item: _Queued) -> np.ndarray:
        request = item.request
        state = np.array(request.state)  # a writable copy: the received one is a view of the message
        device = getattr(policy, "device", None)  # a torch policy's; a policy without one draws on the CPU
        with torch_rng_from(self._generator(request.robot_id), device if isinstance(device, torch.device) else None):
            if item.history and isinstance(policy, HistoryChunkPolicy):
                chunk = policy.predict_chunk_with_history(item.history, item.frames, state, request.instruction)
            else:
                chunk = policy.predict_chunk(item.frames, state, request.instruction)
        return np.asarray(chunk, np.float32)

    def _frames(self, jpeg: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each camera's JPEG decoded, refused unless it is the frame ``policy_info`` asked for."""
        sizes = self._frame_sizes
        unknown = sorted(set(jpeg) - set(sizes))
        if unknown:
            raise ProtocolError(f"infer: cameras {unknown} are not read by the served policy ({sorted(sizes)})")
        return {cam: decode_image(buf, "jpeg", (sizes[cam].height, sizes[cam].width, 3)) for cam, buf in jpeg.items()}

    def _past(self, past: PastJpeg) -> PastObservation:
        return PastObservation(self._frames(past.jpeg), np.array(past.state))

    def _generator(self, robot_id: str) -> torch.Generator:
        generator = self._generators.get(robot_id)
        if generator is None:
            generator = torch.Generator().manual_seed(robot_noise_seed(self.config.noise_seed, robot_id))
            self._generators[robot_id] = generator
        return generator

    @staticmethod
    def _reply(item: _Queued, reply: ChunkReply) -> list[Any]:
        return [item.identity, *encode_reply(reply)]


def _request_id_of(body: dict[str, Any]) -> int | None:
    request_id = body.get("request_id")
    return request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else None
