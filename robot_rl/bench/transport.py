"""`robot-rl bench transport`: our ZeroMQ wire vs LeRobot's gRPC transport, side by side, on loopback.

Two measurements, each for both transports in one run (the machine is shared and noisy:
compare the ratios, not numbers from different runs):

* **Ingest** (steps/s, MB/s on the wire) from 1 and 4 robots, each a separate process,
  each step two 96x96 camera frames plus joint state and action. The bytes are the kernel's
  count of what the learner's TCP connections received in the window (``received_bytes``:
  every byte of the real traffic, framing included), the same way for both transports; the
  frames travel JPEG-encoded on ours and as raw pixels on gRPC's (``frame_encoding``).
  - ZeroMQ: ``StreamingClient`` (JPEG, segments of 15 steps, fsynced spool, acks) ->
    the full ``LearnerService`` (no training): dedup, fsynced staging, acks, and
    LeRobotDataset episode commits on the store's background thread. Each robot submits as
    fast as its acks come back (at most ``INGEST_BACKLOG`` segments unacked), as gRPC's
    stream is held back by its HTTP/2 flow control.
  - gRPC: LeRobot's HIL-SERL path: ``transitions_to_bytes`` (torch.save) ->
    ``send_bytes_in_chunks`` -> ``SendTransitions`` -> lerobot's own ``LearnerService``
    servicer -> ``bytes_to_transitions`` (torch.load) on the learner. Same frames, sent as
    uint8 tensors, 15 transitions per message; nothing is written to disk (kinder to it).
  Counted on the learner over a fixed window after every robot is streaming.
* **Hot-swap latency**, publish -> in use, for ~10 MB and ~100 MB weights.
  - ZeroMQ: an ``EdgeNode`` on the wall clock (kinematic arm, 30 fps, two cameras) with
    an ``EdgeStreamer``, in its own process. The clock starts before the learner
    serialises the snapshot (``publisher.snapshot``: safetensors + sha256) and stops at the
    first executed control tick whose action came from the new weights (chunked fetch,
    hash checks, shadow copy, swap between chunks). Late ticks (> the edge's
    ``late_threshold_ms``) are counted inside each swap window; those outside the windows
    are reported too, as this machine's background.
  - gRPC: lerobot's ``StreamParameters`` (``state_to_bytes``: torch.save, chunked) to an
    actor process that ``bytes_to_state_dict`` + ``load_state_dict``; the clock stops when
    the weights are loaded (it has no control loop, so no late ticks). Its push period is
    set to 0 here; HIL-SERL's default period adds seconds on top.
  The payload is the project's FlowVLA (two cameras, 96 px) plus a ballast buffer that
  brings its state dict to the target size: the bytes take the whole path, while the
  edge's inference cost stays that of the small network (a real 100 MB VLA would not
  keep up at 30 fps on this CPU, which is not what this measures).

The baseline is measured only; nothing of it is used by the product (it pickles).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing as mp
import os
import queue
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from robot_rl.bench.config import SYNTHETIC_EPISODE_STEPS as EPISODE_STEPS
from robot_rl.bench.config import TransportBenchConfig
from robot_rl.bench.cpu import process_cpu_seconds
from robot_rl.bench.progress import timed_run
from robot_rl.core.robot_io import Observation

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.synchronize import Event

    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # lerobot's writer would print a bar per episode

SEGMENT_STEPS = 15  # 0.5 s at 30 fps, the edge's default
INGEST_IN_FLIGHT = 16  # segments each robot keeps sent and unacked
# Segments a robot holds unacked (in flight, spooled, queued) before it waits for acks: its window plus
# as many queued behind it, so the learner never waits for a robot.
INGEST_BACKLOG = 2 * INGEST_IN_FLIGHT
CAMERAS = ("front", "wrist")
IMAGE = 96
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")  # the SO-101's
TEXT_DIM = 384


# ============================================================== payloads shared by both transports


def synthetic_frames(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Camera-like frames (smooth gradients that move, plus sensor noise): JPEG sizes like real ones."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:IMAGE, 0:IMAGE].astype(np.float32)
    frames = []
    for t in range(n):
        frame = {}
        for c, cam in enumerate(CAMERAS):
            base = np.stack([(xx + 2 * t) % 256, (yy + 3 * t + 40 * c) % 256, (xx + yy + t) % 256], axis=-1)
            frame[cam] = np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)
        frames.append(frame)
    return frames


def synthetic_steps(n: int, episode: int, seed: int) -> list[Any]:
    from robot_rl.core.types import Step

    frames = synthetic_frames(min(n, 60), seed)
    steps = []
    for t in range(n):
        state = np.sin(np.arange(6, dtype=np.float32) + t / 30).astype(np.float32)
        steps.append(Step(tick=t, time_s=t / 30, state=state, action=state + 0.01, images=frames[t % len(frames)],
                          instruction="pick up the cube", done=t == n - 1, policy_version=0))
    return steps


def hashed_text(texts: list[str]) -> np.ndarray:
    """Offline instruction embeddings (the benchmark is about bytes, not language)."""
    import hashlib

    out = []
    for s in texts:
        v = np.random.default_rng(int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")).standard_normal(
            TEXT_DIM)
        out.append(v / np.linalg.norm(v))
    return np.stack(out).astype(np.float32)


def ballast_policy(size_mb: float, frozen_mb: float = 0.0) -> Any:
    """The project's FlowVLA plus a ballast buffer so that what it publishes weighs ``size_mb`` MB.

    ``frozen_mb`` adds a frozen base that never travels (a non-persistent buffer: outside the state
    dict, so outside what is published, as a VLM under LoRA is): the adapter case, where a swap
    moves a few MB of a model of a GB, and the edge's shadow shares the base with the live policy.
    """
    import torch

    from robot_rl.policies.flow_vla import FlowVLA, FlowVLAConfig
    from robot_rl.policies.text_encoder import InstructionEncoder

    torch.manual_seed(0)
    policy = FlowVLA(FlowVLAConfig(cameras=CAMERAS, image_size=IMAGE, num_integration_steps=4),
                     text_encoder=InstructionEncoder(backend=hashed_text))
    own = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
    extra = max(0, int(size_mb * 1e6 - own) // 4)
    policy.register_buffer("ballast", torch.randn(extra))
    if frozen_mb > 0:
        policy.register_buffer("frozen_base", torch.randn(int(frozen_mb * 1e6) // 4), persistent=False)
    return policy.eval()


# ============================================================== ingest: ZeroMQ


def _zmq_edge_ingest(robot_id: str, router: str, spool: str, config_hash: str, stop: Any, out: mp.Queue) -> None:
    """Edge process: submit segments as fast as the learner acks them until ``stop`` is set.

    One long episode per robot: the store stages and indexes every segment (fsynced, acked)
    and commits episodes to the LeRobotDataset only when they end, which is outside the
    window measured here (that writer's own speed is lerobot's, not the wire's).

    A robot keeps at most ``INGEST_BACKLOG`` segments unacked. The link's queue alone is no bound:
    the link empties it into its spool whatever the learner takes, so a robot submitting as fast
    as the queue drains JPEG-encodes and fsyncs segments into an ever longer spool (~85 MB each
    in 30 s with 16 robots) that the learner never sees within the window; on a shared CPU that
    work is taken from the learner being measured (16 robots on 2 cores: 673 steps/s unbounded,
    1,389 bounded). A real robot produces at its frame rate, and in steady state no faster than
    its acks come back.
    """
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.streaming import StreamingClient

    logging.getLogger("robot_rl.bridges.zmq.streaming").setLevel(logging.CRITICAL)  # saturating the queue is the point
    config = ClientConfig(robot_id=robot_id, router_endpoint=router, pub_endpoint=None, spool_dir=spool,
                          config_hash=config_hash, fetch_weights=False, max_in_flight=INGEST_IN_FLIGHT)
    steps = synthetic_steps(EPISODE_STEPS, 0, seed=int(robot_id.rsplit("-", 1)[-1]))
    submitted = 0
    with StreamingClient(config, queue_size=64) as link:
        link.wait_connected(30)
        while not stop.is_set():
            for start in range(0, EPISODE_STEPS, SEGMENT_STEPS):
                chunk = steps[start:start + SEGMENT_STEPS]
                while _unacked(link) >= INGEST_BACKLOG or not link.submit_steps(1, chunk):
                    if stop.is_set():
                        break
                    time.sleep(0.005)  # a segment takes ~120 ms to be acked at 2,000 steps/s from 16 robots
                else:
                    submitted += len(chunk)
        link.flush(30)
    out.put(("zmq", robot_id, submitted))


def _unacked(link: Any) -> int:
    """Segments submitted to ``link`` that the learner has not acked yet (queued or spooled)."""
    stats = link.stats()
    return int(stats["queue_depth"]) + int(stats.get("pending", 0))


def zmq_ingest(robots: int, window_s: float, workdir: Path) -> dict[str, Any]:
    from robot_rl.bridges.zmq.segments import ImageEncoding
    from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig
    from robot_rl.learner.service import LearnerService

    policy = ballast_policy(0)
    config = LearnerConfig(
        store=StoreConfig(root=str(workdir / "store"), fps=30, joint_names=JOINTS, cameras=CAMERAS,
                          image_height=IMAGE, image_width=IMAGE),
        trainer=TrainerConfig(device="cpu", log_dir="", checkpoint_dir=str(workdir / "ckpt")),
        service=ServiceConfig(router_endpoint="tcp://127.0.0.1:*", pub_endpoint="tcp://127.0.0.1:*",
                              status_every_s=1e9))
    with LearnerService(config, policy, train=False) as learner:  # leaving the block stops it
        learner.start()
        window = _measure_with_processes(
            robots, window_s, lambda: learner.store.stats()["steps_ingested"], port_of(learner.router_endpoint),
            lambda i, stop, out: mp.get_context("spawn").Process(
                target=_zmq_edge_ingest, args=(f"robot-{i}", learner.router_endpoint, str(workdir / f"spool-{i}"),
                                               policy.config_hash(), stop, out)))
    return window.row(f"JPEG q{ImageEncoding().jpeg_quality}")


TCP_INFO_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in Linux's struct tcp_info (since 4.1)


def received_bytes(port: int) -> int:
    """Bytes this process's TCP connections on local ``port`` have received so far: the kernel's count
    (``TCP_INFO``) of every payload byte on the wire, the transport's framing included."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:  # a duplicate of the descriptor
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) not in (socket.AF_INET, socket.AF_INET6) \
                        or sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) != socket.SOCK_STREAM \
                        or sock.getsockname()[1] != port:
                    continue
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES_RECEIVED + 8)
        except OSError:  # closed meanwhile, or not a socket this call can read
            continue
        if len(info) >= TCP_INFO_BYTES_RECEIVED + 8:
            total += struct.unpack_from("=Q", info, TCP_INFO_BYTES_RECEIVED)[0]
    return total


def port_of(endpoint: str) -> int:
    """The port of ``tcp://host:port`` or ``host:port``."""
    return int(endpoint.rsplit(":", 1)[1])


@dataclass(frozen=True)
class IngestWindow:
    """What the learner received over the measured window."""

    steps: int
    wire_bytes: int
    seconds: float

    def row(self, frame_encoding: str) -> dict[str, Any]:
        return {"steps_per_s": self.steps / self.seconds, "mb_per_s": self.wire_bytes / self.seconds / 1e6,
                "wire_bytes_per_step": self.wire_bytes / self.steps if self.steps else float("nan"),
                "steps_in_window": self.steps, "window_s": self.seconds, "frame_encoding": frame_encoding}


def _measure_with_processes(robots: int, window_s: float, counter: Callable[[], int], port: int,
                            make: Callable[[int, Event, mp.Queue], BaseProcess]) -> IngestWindow:
    """Start ``robots`` edge processes, wait until all stream, count learner-side steps and the bytes
    received on ``port`` over ``window_s``."""
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    warmup_s = 30.0 + 5.0 * robots  # spawning imports numpy/zmq/torch in every process
    procs = [make(i, stop, out) for i in range(robots)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + warmup_s
        previous = counter()
        while time.monotonic() < deadline:  # streaming has started when the count grows steadily
            time.sleep(1.0)
            now = counter()
            if now > previous + 100 * robots:
                break
            previous = now
        time.sleep(1.0)  # every process past its start-up
        t0, c0, b0 = time.monotonic(), counter(), received_bytes(port)
        time.sleep(window_s)
        t1, c1, b1 = time.monotonic(), counter(), received_bytes(port)
    finally:
        stop_processes(stop, procs, 40)
    return IngestWindow(c1 - c0, b1 - b0, t1 - t0)


def stop_processes(stop: Any, processes: Sequence[BaseProcess], timeout_s: float) -> None:
    """Tell benchmark processes to stop (``stop``: an event they watch), then end any that do not."""
    stop.set()
    for process in processes:
        process.join(timeout_s)
        if process.is_alive():
            process.terminate()


# ============================================================== ingest: gRPC baseline (LeRobot HIL-SERL)


def _transitions(steps: list[Any]) -> list[dict]:
    """HIL-SERL transitions of ``steps`` (next_state shares the next step's tensors, as in its actor)."""
    import torch

    states = [{f"observation.images.{cam}": torch.from_numpy(s.images[cam]).permute(2, 0, 1).contiguous()
               for cam in CAMERAS} | {"observation.state": torch.from_numpy(s.state)} for s in steps]
    return [{"state": states[i], "action": torch.from_numpy(s.action), "reward": 0.0,
             "next_state": states[min(i + 1, len(steps) - 1)], "done": s.done, "truncated": False,
             "complementary_info": None} for i, s in enumerate(steps)]


def _grpc_edge_ingest(robot_id: str, address: str, stop: Any, out: mp.Queue) -> None:
    import grpc
    from lerobot.transport import services_pb2, services_pb2_grpc
    from lerobot.transport.utils import grpc_channel_options, send_bytes_in_chunks, transitions_to_bytes

    steps = synthetic_steps(EPISODE_STEPS, 0, seed=int(robot_id.rsplit("-", 1)[-1]))
    segments = [_transitions(steps[i:i + SEGMENT_STEPS]) for i in range(0, EPISODE_STEPS, SEGMENT_STEPS)]
    sent = [0]

    def messages():
        while not stop.is_set():
            for segment in segments:
                yield from send_bytes_in_chunks(transitions_to_bytes(segment), services_pb2.Transition)
                sent[0] += len(segment)
                if stop.is_set():
                    return

    channel = grpc.insecure_channel(address, options=grpc_channel_options())
    services_pb2_grpc.LearnerServiceStub(channel).SendTransitions(messages())
    channel.close()
    out.put(("grpc", robot_id, sent[0]))


def grpc_ingest(robots: int, window_s: float) -> dict[str, Any]:
    import grpc
    from lerobot.rl.learner_service import LearnerService as GrpcLearnerService
    from lerobot.transport import services_pb2_grpc
    from lerobot.transport.utils import bytes_to_transitions

    # Bounded, as each ZeroMQ robot's backlog is: LeRobot's servicer blocks on a full queue, which holds
    # the robots back through gRPC's flow control. Unbounded, 16 robots outran the deserialising
    # consumer and filled this process's memory (19 GB, killed by the kernel).
    transitions: queue.Queue[bytes] = queue.Queue(maxsize=2 * robots)
    shutdown = threading.Event()
    counts = {"steps": 0}

    def consume() -> None:  # the HIL-SERL learner's side: deserialise every message
        while not shutdown.is_set():
            try:
                data = transitions.get(timeout=0.1)
            except queue.Empty:
                continue
            counts["steps"] += len(bytes_to_transitions(data))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=robots + 2),
                         options=[("grpc.max_receive_message_length", 4 << 20),
                                  ("grpc.max_send_message_length", 4 << 20)])
    servicer = GrpcLearnerService(shutdown, queue.Queue(), 1e9, transitions, queue.Queue())
    services_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        window = _measure_with_processes(
            robots, window_s, lambda: counts["steps"], port,
            lambda i, stop, out: mp.get_context("spawn").Process(
                target=_grpc_edge_ingest, args=(f"robot-{i}", f"127.0.0.1:{port}", stop, out)))
    finally:
        shutdown.set()
        stopped = server.stop(5)
        while not stopped.wait(0.05):  # free receivers blocked on the full queue, so the server can stop
            _drain(transitions)
        _drain(transitions)
    return window.row("raw uint8")


def _drain(messages: queue.Queue) -> None:
    while True:
        try:
            messages.get_nowait()
        except queue.Empty:
            return


# ============================================================== hot swap: ZeroMQ, EdgeNode on the wall clock


class BenchArm:
    """A kinematic 6-joint arm with two 96x96 cameras: reaches each target in one tick, costs no CPU."""

    name = "bench-arm"
    camera_names: tuple[str, ...] = CAMERAS
    fps = 30

    def __init__(self) -> None:
        self.joint_names = tuple(f"joint{i}" for i in range(6))
        self.state: np.ndarray = np.zeros(6, dtype=np.float32)
        self._frames = synthetic_frames(30, 0)
        self._t = 0
        self.is_connected = True

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        return np.full(6, -1e6, dtype=np.float32), np.full(6, 1e6, dtype=np.float32)

    @property
    def observation_features(self) -> dict:
        from robot_rl.hardware.robot import features_for

        return features_for(self.joint_names, {c: (IMAGE, IMAGE) for c in CAMERAS})[0]

    @property
    def action_features(self) -> dict:
        from robot_rl.hardware.robot import features_for

        return features_for(self.joint_names, {c: (IMAGE, IMAGE) for c in CAMERAS})[1]

    def connect(self) -> None:
        self.is_connected = True

    def disconnect(self) -> None:
        self.is_connected = False

    def get_observation(self) -> Observation:
        self._t += 1
        return {"images": self._frames[self._t % len(self._frames)], "state": self.state.copy()}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self.state = np.asarray(action, dtype=np.float32).copy()
        return self.state


def _zmq_edge_swap(router: str, pub: str, spool: str, payload: SwapPayload, runner: str, stop_at: float,
                   out: mp.Queue) -> None:
    """Edge process: run episodes on the wall clock; report when each version is loaded and first in
    use, and late ticks. ``runner``: where inference and the weights loader run ("thread": threads of
    this process; "process": the policy's own process, the default of a session on the wall clock)."""
    import torch

    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.segments import ImageEncoding
    from robot_rl.core.clock import WallClock
    from robot_rl.edge.config import EdgeConfig
    from robot_rl.edge.learner_link import EdgeStreamer
    from robot_rl.edge.node import EdgeNode
    from robot_rl.edge.process_runner import spawn_policy

    torch.set_num_threads(1)
    factory = functools.partial(ballast_policy, payload.size_mb, payload.frozen_mb)
    policy = spawn_policy(factory) if runner == "process" else factory()
    config = ClientConfig(robot_id="swap-edge", router_endpoint=router, pub_endpoint=pub, spool_dir=spool,
                          config_hash=policy.config_hash(), policy_version=0, heartbeat_interval_s=0.5)
    streamer = EdgeStreamer(config, policy, image_encoding=ImageEncoding())
    node = EdgeNode(BenchArm(), policy, WallClock(), EdgeConfig(fps=30, inference_runner=runner),
                    robot_id="swap-edge", policy_version=0)
    streamer.attach(node).start()
    seen: set[int] = set()
    late = [0]
    forward = node.step_sink
    if forward is None:
        raise RuntimeError("the streamer attached no step sink to the edge node")
    loaded_in_child: dict[int, float] = getattr(node.worker, "loaded_at", {})
    reported: set[int] = set()

    def sink(step: Any) -> None:  # control thread: a few compares and a non-blocking put
        if step.policy_version not in seen:
            seen.add(step.policy_version)
            out.put(("in_use", step.policy_version, time.time()))
        if node.stats.late_ticks > late[0]:
            late[0] = node.stats.late_ticks
            out.put(("late_tick", late[0], time.time()))
        for version in loaded_in_child.keys() - reported:  # the policy process's own time stamp
            reported.add(version)
            out.put(("loaded", version, loaded_in_child[version]))
        forward(step)

    node.step_sink = sink
    if runner == "thread":
        request_swap = node.request_policy_swap

        def timed_request(new: Any, version: int) -> None:  # loader thread: weights verified, in the shadow
            out.put(("loaded", version, time.time()))
            request_swap(new, version)

        node.request_policy_swap = timed_request  # type: ignore[method-assign]  # bench: time each swap request
    streamer.link.wait_connected(30)
    out.put(("ready", 0, time.time()))
    try:
        episode = 0
        while time.time() < stop_at:
            node.run_episode(300, "pick up the cube", episode_id=episode)
            episode += 1
    finally:
        streamer.stop()
        node.close()


class _AckOnly:
    """Learner handlers for the swap run: segments are acked, not stored (only the weights path matters)."""

    def __new__(cls) -> Any:  # built lazily so importing this module does not import the bridge
        from robot_rl.bridges.zmq.protocol import Ack
        from robot_rl.bridges.zmq.server import ServerHandlers

        class AckOnly(ServerHandlers):
            def on_segment(self, peer: Any, msg: Any) -> Any:
                return Ack(robot_id=msg.robot_id, episode_id=msg.episode_id, seq=msg.seq, duplicate=False)

        return AckOnly()


@dataclass(frozen=True)
class SwapPayload:
    """What one swap row moves: ``size_mb`` published (on the wire), ``frozen_mb`` that stays home."""

    name: str  # the row's key in the report: the size in MB, or "adapter"
    size_mb: float
    frozen_mb: float = 0.0


def swap_payloads(cfg: TransportBenchConfig) -> list[SwapPayload]:
    payloads = [SwapPayload(str(size), float(size)) for size in cfg.sizes_mb]
    if cfg.adapter_mb > 0:
        payloads.append(SwapPayload("adapter", cfg.adapter_mb, cfg.adapter_base_mb))
    return payloads


def zmq_swap(payload: SwapPayload, runner: str, cfg: TransportBenchConfig, workdir: Path) -> dict[str, Any]:
    from robot_rl.bridges.zmq.server import ServerConfig, ZmqServer
    from robot_rl.bridges.zmq.weights import SnapshotBuffers
    from robot_rl.learner.publisher import snapshot

    policy = ballast_policy(payload.size_mb, payload.frozen_mb)
    buffers = SnapshotBuffers()  # as the trainer publishes: a dropped version's buffer holds a later one
    server = ZmqServer(ServerConfig(config_hash=policy.config_hash(), announce_interval_s=2.0), _AckOnly())
    publish_initial_weights(server, policy, buffers)
    stop = threading.Event()
    serving = threading.Thread(target=server.serve_forever, args=(stop,), daemon=True)
    serving.start()
    out = mp.get_context("spawn").Queue()
    stop_at = time.time() + 60 + cfg.swaps * (cfg.swap_gap_s + cfg.swap_timeout_s / 4)
    edge = mp.get_context("spawn").Process(target=_zmq_edge_swap, args=(
        server.router_endpoint, server.pub_endpoint, str(workdir / "swap-spool"), payload, runner, stop_at, out))
    edge.start()
    reports = EdgeReports(out)
    windows: list[tuple[float, float]] = []
    loaded: list[float] = []
    wire: list[int] = []
    try:
        reports.wait("ready", 300)
        reports.wait("in_use", 60, version=0)
        time.sleep(1.0)
        for version in range(1, cfg.swaps + 1):
            t0 = time.time()  # before serialisation: the learner's whole publish is in the latency
            blob = snapshot(policy, version, policy.config_hash(), buffers=buffers)
            server.publish_weights(blob)
            wire.append(len(blob.data))
            windows.append((t0, reports.wait("in_use", cfg.swap_timeout_s, version=version)))
            loaded.append(reports.wait("loaded", 1.0, version=version) - t0)
            del blob
            time.sleep(cfg.swap_gap_s)
    finally:
        reports.drain()
        edge.terminate()  # it only acts and streams; nothing of it needs a clean stop here
        edge.join(10)
        stop.set()
        serving.join(5)
        server.close()
    latencies = [b - a for a, b in windows]
    late = reports.late_tick_times
    in_swaps = sum(any(a <= t <= b + 1 / 30 for a, b in windows) for t in late)
    loaded_pct, in_use = _percentiles(loaded), _percentiles(latencies)
    return {"loaded_p50_s": loaded_pct["p50_s"], "loaded_p95_s": loaded_pct["p95_s"],
            "loaded_s": [round(t, 4) for t in loaded],  # in publish order: the first ones touch fresh buffers
            "in_use_p50_s": in_use["p50_s"], "in_use_p95_s": in_use["p95_s"],
            "late_ticks": in_swaps, "late_ticks_outside_swaps": len(late) - in_swaps,
            "bytes_on_wire": float(np.mean(wire)) if wire else float("nan"), "swaps": len(latencies),
            "payload_mb": _state_mb(policy), "model_mb": _state_mb(policy) + payload.frozen_mb, "runner": runner}


def publish_initial_weights(server: Any, policy: Any, buffers: Any) -> None:
    """Version 0, before any robot connects, as ``LearnerService.start`` publishes the weights it starts
    from: the robots start on them too (``policy_version`` 0), and the versions measured are the trained
    ones that follow."""
    from robot_rl.learner.publisher import snapshot

    server.publish_weights(snapshot(policy, 0, policy.config_hash(), buffers=buffers))


class EdgeReports:
    """Messages from an edge process: ("ready"|"in_use"|"late_tick"|"loaded", n, wall time)."""

    def __init__(self, out: mp.Queue) -> None:
        self.out = out
        self.late_tick_times: list[float] = []
        self._seen: dict[tuple[str, int], float] = {}
        self.counts: Counter[tuple[str, int]] = Counter()  # every message (kind, version), repeats included

    def wait(self, kind: str, timeout_s: float, version: int = 0) -> float:
        """Wall time of message (kind, version); bounded by ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (kind, version) not in self._seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind!r} v{version} from the edge process within {timeout_s:.0f} s")
            try:
                self._take(self.out.get(timeout=min(remaining, 1.0)))
            except queue.Empty:
                continue
        return self._seen[(kind, version)]

    def drain(self) -> None:
        while True:
            try:
                self._take(self.out.get(timeout=0.2))
            except queue.Empty:
                return

    def _take(self, message: tuple) -> None:
        kind, n, t = message
        if kind == "late_tick":
            self.late_tick_times.append(t)
        else:
            self._seen.setdefault((kind, n), t)
            self.counts[(kind, n)] += 1


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_s": float("nan"), "p95_s": float("nan")}
    return {"p50_s": float(np.percentile(values, 50)), "p95_s": float(np.percentile(values, 95))}


def _state_mb(policy: Any) -> float:
    return sum(t.numel() * t.element_size() for t in policy.state_dict().values()) / 1e6


# ============================================================== hot swap: gRPC baseline (LeRobot HIL-SERL)


def _grpc_actor_swap(address: str, payload: SwapPayload, out: mp.Queue) -> None:
    """Actor process: receive parameter streams, torch.load them and load them into the policy."""
    import grpc
    import torch
    from lerobot.transport import services_pb2, services_pb2_grpc
    from lerobot.transport.utils import bytes_to_state_dict, grpc_channel_options, receive_bytes_in_chunks

    torch.set_num_threads(1)
    policy = ballast_policy(payload.size_mb, payload.frozen_mb)
    channel = grpc.insecure_channel(address, options=grpc_channel_options())
    stream = services_pb2_grpc.LearnerServiceStub(channel).StreamParameters(services_pb2.Empty())
    out.put(("ready", 0, time.time()))
    never = threading.Event()
    while True:
        data = receive_bytes_in_chunks(stream, None, never)
        if data is None:
            return
        state = bytes_to_state_dict(data)
        version = int(state.pop("_bench_version").item())
        policy.load_state_dict(state)
        out.put(("loaded", version, time.time()))


def grpc_swap(payload: SwapPayload, cfg: TransportBenchConfig) -> dict[str, Any]:
    import grpc
    import torch
    from lerobot.rl.learner_service import LearnerService as GrpcLearnerService
    from lerobot.transport import services_pb2_grpc
    from lerobot.transport.utils import MAX_MESSAGE_SIZE, state_to_bytes

    policy = ballast_policy(payload.size_mb, payload.frozen_mb)  # the same published bytes as ours
    parameters: queue.Queue[bytes] = queue.Queue()
    shutdown = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=3),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_SIZE)])
    services_pb2_grpc.add_LearnerServiceServicer_to_server(
        GrpcLearnerService(shutdown, parameters, 0.0, queue.Queue(), queue.Queue()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    out = mp.get_context("spawn").Queue()
    actor = mp.get_context("spawn").Process(target=_grpc_actor_swap, args=(f"127.0.0.1:{port}", payload, out))
    actor.start()
    reports = EdgeReports(out)
    latencies, wire = [], []
    try:
        reports.wait("ready", 300)
        time.sleep(1.0)
        for version in range(1, cfg.swaps + 1):
            t0 = time.time()
            state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
            data = state_to_bytes({**state, "_bench_version": torch.tensor(version)})
            wire.append(len(data))
            parameters.put(data)
            del data, state
            latencies.append(reports.wait("loaded", cfg.swap_timeout_s, version=version) - t0)
            time.sleep(cfg.swap_gap_s)
    finally:
        shutdown.set()
        actor.terminate()
        actor.join(10)
        server.stop(2)
    loaded = _percentiles(latencies)
    return {"loaded_p50_s": loaded["p50_s"], "loaded_p95_s": loaded["p95_s"], "swaps": len(latencies),
            "loaded_s": [round(t, 4) for t in latencies],
            "bytes_on_wire": float(np.mean(wire)) if wire else float("nan"), "payload_mb": _state_mb(policy)}


# ============================================================== weight fan-out: one learner, N robots


def _fanout_edge(robot_id: str, router: str, pub: str, spool: str, size_mb: float, out: mp.Queue,
                 stop: Any) -> None:
    """Edge process without a control loop: fetch, verify and load every published version into a
    shadow policy (the product's link and loader), report when each is loaded."""
    import torch

    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from robot_rl.edge.weight_loading import load_weights_into, shadow_of

    torch.set_num_threads(1)
    policy = ballast_policy(size_mb)
    shadow = shadow_of(policy)

    def on_weights(announce: Any, data: Any) -> None:  # link thread
        load_weights_into(shadow, data)
        out.put((f"loaded:{robot_id}", announce.version, time.time()))

    config = ClientConfig(robot_id=robot_id, router_endpoint=router, pub_endpoint=pub, spool_dir=spool,
                          config_hash=policy.config_hash(), policy_version=0, heartbeat_interval_s=0.5)
    with StreamingClient(config, on_weights=on_weights) as link:
        link.wait_connected(120)
        out.put((f"ready:{robot_id}", 0, time.time()))
        stop.wait()


def zmq_fanout(robots: int, cfg: TransportBenchConfig, workdir: Path) -> dict[str, Any]:
    from robot_rl.bridges.zmq.server import ServerConfig, ZmqServer
    from robot_rl.bridges.zmq.weights import SnapshotBuffers
    from robot_rl.learner.publisher import snapshot

    policy = ballast_policy(cfg.fanout_mb)
    buffers = SnapshotBuffers()
    server = ZmqServer(ServerConfig(config_hash=policy.config_hash(), announce_interval_s=2.0), _AckOnly())
    publish_initial_weights(server, policy, buffers)
    stop_serving = threading.Event()
    serving = threading.Thread(target=server.serve_forever, args=(stop_serving,), daemon=True)
    serving.start()
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    ids = [f"fanout-{i}" for i in range(robots)]
    edges = [ctx.Process(target=_fanout_edge, args=(rid, server.router_endpoint, server.pub_endpoint,
                                                    str(workdir / f"spool-{rid}"), cfg.fanout_mb, out, stop))
             for rid in ids]
    for edge in edges:
        edge.start()
    reports = EdgeReports(out)
    latencies: list[float] = []
    try:
        for rid in ids:
            reports.wait(f"ready:{rid}", 120 + 10 * robots)
        time.sleep(1.0)
        edge_cpu = learner_cpu = 0.0  # spent from each publish until every robot has loaded it
        for version in range(1, cfg.swaps + 1):
            edge_cpu -= sum(process_cpu_seconds(edge.pid) for edge in edges)
            learner_cpu -= process_cpu_seconds()
            t0 = time.time()
            server.publish_weights(snapshot(policy, version, policy.config_hash(), buffers=buffers))
            latencies += [reports.wait(f"loaded:{rid}", cfg.swap_timeout_s, version=version) - t0 for rid in ids]
            edge_cpu += sum(process_cpu_seconds(edge.pid) for edge in edges)
            learner_cpu += process_cpu_seconds()
            time.sleep(cfg.swap_gap_s)
    finally:
        stop_processes(stop, edges, 10)
        reports.drain()
        stop_serving.set()
        serving.join(5)
        server.close()
    loaded = _percentiles(latencies)
    # Each robot's computer does its own share in a fleet; here all share this machine's cores, and a
    # version cannot reach every robot sooner than that work takes spread over them (cpu_floor_s).
    cores = os.cpu_count() or 1
    loads = {(kind.removeprefix("loaded:"), version): n for (kind, version), n in reports.counts.items()
             if kind.startswith("loaded:") and version >= 1}
    swaps = sum(all((rid, version) in loads for rid in ids) for version in range(1, cfg.swaps + 1))
    return {"loaded_p50_s": loaded["p50_s"], "loaded_p95_s": loaded["p95_s"],
            "swaps": swaps,  # versions every robot reported loaded
            "repeated_loads": sum(n - 1 for n in loads.values()),  # a version loaded twice by one robot
            "versions_published": cfg.swaps,
            "payload_mb": _state_mb(policy), "edge_cpu_s_per_version": edge_cpu / cfg.swaps,
            "learner_cpu_s_per_version": learner_cpu / cfg.swaps,
            "cpu_floor_s": (edge_cpu + learner_cpu) / cfg.swaps / cores, "cores": cores}


# ============================================================== the run, the table


def run_transport_bench(cfg: TransportBenchConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    payloads = swap_payloads(cfg)
    report: dict[str, Any] = {"ingest": {}, "swap": {}, "swap_by_runner": {r: {} for r in cfg.runners},
                              "fanout": {}, "baseline_grpc": {"ingest": {}, "swap": {}},
                              "config": {"robots": list(cfg.robots), "sizes_mb": list(cfg.sizes_mb),
                                         "adapter_mb": cfg.adapter_mb, "adapter_base_mb": cfg.adapter_base_mb,
                                         "runners": list(cfg.runners), "fanout_robots": list(cfg.fanout_robots),
                                         "fanout_mb": cfg.fanout_mb,
                                         "ingest_window_s": cfg.ingest_window_s, "swaps": cfg.swaps,
                                         "cameras": f"{len(CAMERAS)} x {IMAGE}x{IMAGE}",
                                         "segment_steps": SEGMENT_STEPS},
                              "notes": {"ingest_zmq": "StreamingClient (JPEG q90, spool) -> LearnerService "
                                                      "(ReplayStore: fsynced staging + LeRobotDataset commits)",
                                        "ingest_grpc": "lerobot.transport SendTransitions (torch.save of uint8 "
                                                       "transitions) -> lerobot LearnerService -> torch.load; "
                                                       "no disk writes",
                                        "swap_zmq": "publish (serialise+sha256) -> verified and in the shadow "
                                                    "(loaded) -> first control tick on the new weights at a 30 fps "
                                                    "EdgeNode (in use); swap = the first runner's rows",
                                        "swap_grpc": "state_to_bytes -> StreamParameters (push period 0) -> "
                                                     "torch.load -> load_state_dict at the actor",
                                        "adapter": "a frozen base of adapter_base_mb that never travels plus "
                                                   "adapter_mb published",
                                        "fanout": "N edge processes fetch, verify and load each version"}}
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        work = Path(tmp)
        for robots in cfg.robots:
            progress(f"ingest, {robots} robot(s): ZeroMQ")
            report["ingest"][str(robots)] = zmq_ingest(robots, cfg.ingest_window_s, work / f"zmq-{robots}")
            shutil.rmtree(work / f"zmq-{robots}", ignore_errors=True)
            progress(f"ingest, {robots} robot(s): gRPC baseline")
            report["baseline_grpc"]["ingest"][str(robots)] = grpc_ingest(robots, cfg.ingest_window_s)
        for payload in payloads:
            for runner in cfg.runners:
                progress(f"hot swap, {payload.name}: ZeroMQ, inference and loader in a {runner}")
                row = zmq_swap(payload, runner, cfg, work / f"swap-{payload.name}-{runner}")
                report["swap_by_runner"][runner][payload.name] = row
            report["swap"][payload.name] = report["swap_by_runner"][cfg.runners[0]][payload.name]
            progress(f"hot swap, {payload.name}: gRPC baseline")
            report["baseline_grpc"]["swap"][payload.name] = grpc_swap(payload, cfg)
        for robots in cfg.fanout_robots:
            progress(f"weight fan-out, {robots} robot(s), {cfg.fanout_mb} MB")
            report["fanout"][str(robots)] = zmq_fanout(robots, cfg, work / f"fanout-{robots}")
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ingest = Table(title="Ingest on loopback (learner-side count of steps; MB/s: bytes its TCP connections "
                         "received; 2 cameras 96x96 per step)")
    for col in ("robots", "ZeroMQ frames", "ZeroMQ steps/s", "ZeroMQ MB/s", "gRPC frames", "gRPC steps/s",
                "gRPC MB/s", "ZeroMQ / gRPC"):
        ingest.add_column(col, justify="right")
    for robots, ours in report["ingest"].items():
        base = report["baseline_grpc"]["ingest"].get(robots, {})
        ratio = ours["steps_per_s"] / base["steps_per_s"] if base.get("steps_per_s") else float("nan")
        ingest.add_row(robots, ours["frame_encoding"], f"{ours['steps_per_s']:.0f}", f"{ours['mb_per_s']:.2f}",
                       base.get("frame_encoding", "-"), f"{base.get('steps_per_s', float('nan')):.0f}",
                       f"{base.get('mb_per_s', float('nan')):.2f}", f"{ratio:.2f}x")
    console.print(ingest)
    swap = Table(title="Weight hot-swap (s). Ours: publish -> verified in the shadow (loaded) -> first tick on it "
                       "(in use), late ticks inside / outside swap windows; gRPC: publish -> load_state_dict done")
    for col in ("MB", "runner", "wire MB", "loaded p50", "loaded p95", "in use p95", "late", "late else",
                "gRPC p95", "gRPC/ours"):
        swap.add_column(col, justify="right")
    for runner, rows in report["swap_by_runner"].items():
        for name, ours in rows.items():
            base = report["baseline_grpc"]["swap"].get(name, {})
            ratio = base.get("loaded_p95_s", float("nan")) / ours["loaded_p95_s"] if ours.get("loaded_p95_s") \
                else float("nan")
            swap.add_row(name, runner, f"{ours['bytes_on_wire'] / 1e6:.1f}", f"{ours['loaded_p50_s']:.3f}",
                         f"{ours['loaded_p95_s']:.3f}", f"{ours['in_use_p95_s']:.3f}", str(ours["late_ticks"]),
                         str(ours["late_ticks_outside_swaps"]), f"{base.get('loaded_p95_s', float('nan')):.3f}",
                         f"{ratio:.2f}x")
    console.print(swap)
    if report["fanout"]:
        fanout = Table(title="Weight fan-out: publish -> loaded at every robot (s); CPU per version: every edge "
                             "process and the learner, all on this machine's cores")
        for col in ("robots", "MB", "loaded p50", "loaded p95", "p95 / 1 robot", "edge CPU s", "learner CPU s",
                    "CPU floor s"):
            fanout.add_column(col, justify="right")
        one = report["fanout"].get("1", {}).get("loaded_p95_s")
        for robots, row in report["fanout"].items():
            fanout.add_row(robots, f"{row['payload_mb']:.0f}", f"{row['loaded_p50_s']:.3f}",
                           f"{row['loaded_p95_s']:.3f}", f"{row['loaded_p95_s'] / one:.2f}x" if one else "-",
                           f"{row['edge_cpu_s_per_version']:.3f}", f"{row['learner_cpu_s_per_version']:.3f}",
                           f"{row['cpu_floor_s']:.3f} on {row['cores']}")
        console.print(fanout)


def run_from_cli(cfg: RobotRLConfig) -> dict:
    logging.getLogger("robot_rl").setLevel(logging.WARNING)
    report = timed_run(lambda progress: run_transport_bench(cfg.bench, progress=progress))
    print_table(report)
    return report
