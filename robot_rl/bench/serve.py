"""``robot-rl bench serve``: one policy server for 1, 4 and 16 robots, batched and one at a time.

The server runs in a process of its own (the GPU box's); the robots are synthetic edges in this
process, one thread each, ticking at ``edge.fps`` on the default schedule (a request when the plan
left is at most the delay estimate + ``edge.threshold_margin``, as ``robot_rl.edge.node`` asks) and
sending what the policy reads through the real ``RemoteRunner`` (sim camera frames, resized and
JPEG-encoded on its I/O thread). Per robot count, side by side in one run:

* request-to-chunk latency p50 / p95 and chunks/s over all robots;
* the server's mean batch and compute per chunk;
* the edges' late ticks (a tick starting over ``edge.late_threshold_ms`` behind its time) and stall
  seconds (ticks with no action planned once the first chunk came);
* ``serial``: the same with ``serve.max_batch=1`` (one forward per request);
* ``swap_to_serve_p95_s``: from ``load_published`` of a new version to the first chunk of that
  version at a robot asking on its schedule (the weights change in place, between two forwards);
  ``swap_to_serve_bound_s``, what the target allows it: one forward plus that robot's request interval;
* ``hot_swap_p95_s``: the same for today's network path, a model of the served one's size published
  over the weights socket to an edge that loads it into its policy process
  (``robot_rl.bench.transport.zmq_swap``): what serving in place saves;
* ``capacity``: chunks/s with every robot asking again as soon as its chunk came (no schedule),
  batched and serial: what batching adds when demand is not the limit (on the default schedule 16
  robots ask for fewer chunks than even one-at-a-time serving can make on a GPU);
* ``bytes_per_request``: two cameras at 224x224 (the input of SmolVLA and pi0) and at the served
  policy's own input size;
* ``lerobot_baseline`` (``bench.lerobot_baseline=true``; ``bench.fleet=false`` skips the cells
  above): LeRobot's own PolicyServer and RobotClients, then our server, on one tiny ACT saved
  locally, for ``bench.lerobot_robots`` robots (``robot_rl.bench.serve_lerobot``).
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing as mp
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
import torch

from robot_rl.bench.config import TransportBenchConfig
from robot_rl.bench.serve_config import ServeBenchConfig
from robot_rl.bench.transport import SwapPayload, zmq_swap
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_image
from robot_rl.edge.delay import DelayEstimator
from robot_rl.edge.inference import InferenceRequest
from robot_rl.edge.remote_runner import RemoteInferenceConfig, RemotePolicy
from robot_rl.learner.serving import PolicyServer, ServeStats
from robot_rl.learner.serving_config import ServeConfig

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)

_SERVER_START_S = 300.0  # the child builds the policy (a checkpoint from disk)
_BASELINE_CHUNK = 20  # the LeRobot baseline's ACT: actions per chunk


# ---------------------------------------------------------------- the server's process


def _serve_child(cfg: RobotRLConfig, serve: ServeConfig, conn: Any) -> None:
    """Builds the policy and serves it; answers ``swap`` (a new version in place) and ``stats``."""
    from robot_rl.app.policies import load_policy

    torch.set_num_threads(1)  # the edges' machine is this one too: one core for the forward
    policy = load_policy(cfg)
    server = PolicyServer(policy, serve).start()
    published = {k: v.clone() for k, v in policy.published_state_dict().items()}
    conn.send((server.endpoint, sum(t.numel() * t.element_size() for t in published.values())))
    try:
        while (command := conn.recv()) != "close":
            if command == "stats":
                stats = server.stats
                conn.send({"mean_batch": stats.mean_batch, "dropped_late": stats.dropped_late,
                           "compute_per_chunk_s": sum(stats.forward_s) / max(sum(stats.batch_sizes), 1)})
                server.stats = ServeStats()  # counts from here
            else:  # ("swap", version): perturbed weights, as a trainer's next version
                version = int(command[1])
                new = {k: v + 1e-4 * version if v.is_floating_point() else v for k, v in published.items()}
                started = time.time()
                server.load_published(new, version)
                conn.send(started)
    finally:
        server.close()


class _ServerProcess:
    def __init__(self, cfg: RobotRLConfig, serve: ServeConfig) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve_child, args=(cfg, serve, child), name="bench-serve", daemon=True)
        self.process.start()
        if not self.conn.poll(_SERVER_START_S):
            self.process.terminate()
            raise RuntimeError(f"the policy server did not start within {_SERVER_START_S:.0f} s")
        self.endpoint: str
        self.published_bytes: int  # what one version of the served policy weighs
        self.endpoint, self.published_bytes = self.conn.recv()

    def call(self, command: Any) -> Any:
        self.conn.send(command)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send("close")
        self.process.join(30)


# ---------------------------------------------------------------- a synthetic edge


@dataclass
class _EdgeLog:
    latencies_s: list[float] = field(default_factory=list)
    versions: list[tuple[float, int]] = field(default_factory=list)  # (time.time() of arrival, version)
    chunks: int = 0
    late_ticks: int = 0
    stall_ticks: int = 0
    ticks: int = 0


def _edge(policy: RemotePolicy, frames: dict[str, np.ndarray], fps: int, margin: int, late_s: float,
          until: float, log_to: _EdgeLog) -> None:
    """Tick at ``fps`` until ``until`` (time.monotonic()); request on the default schedule."""
    runner = policy.runner(time.monotonic, policy.action_dim, max_inflight=1)
    delay = DelayEstimator()
    state = np.zeros(policy.state_dim, np.float32)
    period, planned, had_chunk, tick = 1.0 / fps, 0, False, 0
    due = time.monotonic()
    while due < until:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
            now = time.monotonic()
        log_to.late_ticks += now - due > late_s
        while (result := runner.poll(now)) is not None:
            if result.chunk is None:
                continue
            measured = tick - result.request.request_tick
            delay.observe(measured)
            planned, had_chunk = max(policy.chunk_size - measured, 0), True
            log_to.chunks += 1
            log_to.latencies_s.append(result.latency_s)
            log_to.versions.append((time.time(), result.policy_version))
        log_to.stall_ticks += had_chunk and planned == 0
        planned = max(planned - 1, 0)
        if runner.in_flight == 0 and planned <= delay.estimate() + margin:
            runner.submit(InferenceRequest(
                chunk_id=tick, request_tick=tick, request_time_s=now, images=frames, state=state,
                instruction="push the red cube to the left", executed_index=-1, delay_ticks=0,
                delay_estimate=delay.estimate(), start_tick=None, rolled_state=None, generation=0))
        tick += 1
        log_to.ticks += 1
        due += period


# ---------------------------------------------------------------- cells


def _sim_frames(cfg: RobotRLConfig) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """One observation of the simulated SO-101's cameras (what a robot sends, before resizing), and
    its joints."""
    from robot_rl.core.registry import ROBOTS

    robot = ROBOTS.build(cfg.robot)
    robot.connect()
    try:
        return dict(robot.get_observation()["images"]), tuple(robot.joint_names)
    finally:
        robot.disconnect()


def _cell(server: _ServerProcess, n: int, seconds: float, frames: dict[str, np.ndarray],
          cfg: RobotRLConfig) -> dict[str, Any]:
    policies = [RemotePolicy(RemoteInferenceConfig(server.endpoint, f"bench-{i}", connect_timeout_s=120.0))
                for i in range(n)]
    try:
        for policy in policies:  # each robot's warm-up, as a session's before tick 0
            policy.predict_chunk(frames, np.zeros(policy.state_dim, np.float32), "push the red cube to the left")
        server.call("stats")  # counts from here
        logs = [_EdgeLog() for _ in policies]
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_edge, args=(p, frames, cfg.edge.fps, cfg.edge.threshold_margin,
                                                        cfg.edge.late_threshold_ms / 1000.0, until, log_),
                                    name=f"bench-edge-{i}", daemon=True)
                   for i, (p, log_) in enumerate(zip(policies, logs, strict=True))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = server.call("stats")
        latencies = np.array([x for log_ in logs for x in log_.latencies_s]) if any(logs) else np.zeros(0)
        bytes_sent = sum(p.link.bytes_sent for p in policies)
        requests = sum(p.link.requests_sent for p in policies)
        return {
            "latency_p50_s": float(np.percentile(latencies, 50)) if latencies.size else None,
            "latency_p95_s": float(np.percentile(latencies, 95)) if latencies.size else None,
            "chunks_per_s": sum(log_.chunks for log_ in logs) / seconds,
            "mean_batch": stats["mean_batch"],
            "compute_per_chunk_s": stats["compute_per_chunk_s"],
            "dropped_late": stats["dropped_late"],
            "late_ticks": sum(log_.late_ticks for log_ in logs),
            "ticks": sum(log_.ticks for log_ in logs),
            "stall_s": sum(log_.stall_ticks for log_ in logs) / cfg.edge.fps,
            "bytes_per_request": bytes_sent / max(requests, 1),
        }
    finally:
        for policy in policies:
            policy.close()


def _swap_to_serve(server: _ServerProcess, swaps: int, frames: dict[str, np.ndarray], cfg: RobotRLConfig
                   ) -> tuple[list[float], float]:
    """Seconds from ``load_published`` to the first chunk of that version at a robot on its schedule, and
    what the target allows it: one forward pass plus one of that robot's request intervals (a version
    published just after a request left is first used by the next one)."""
    policy = RemotePolicy(RemoteInferenceConfig(server.endpoint, "bench-swap", connect_timeout_s=120.0))
    log_to = _EdgeLog()
    until = time.monotonic() + 2.0 + 1.5 * swaps
    thread = threading.Thread(target=_edge, args=(policy, frames, cfg.edge.fps, cfg.edge.threshold_margin,
                                                  cfg.edge.late_threshold_ms / 1000.0, until, log_to), daemon=True)
    server.call("stats")  # counts from here: this robot's forwards only
    thread.start()
    published: list[tuple[int, float]] = []
    try:
        time.sleep(1.0)
        for version in range(1, swaps + 1):
            published.append((version, server.call(("swap", version))))
            time.sleep(1.0)
        thread.join()
        forward_s = server.call("stats")["compute_per_chunk_s"]
    finally:
        policy.close()
    out = []
    for version, started in published:
        first = next((t for t, v in log_to.versions if v == version), None)
        if first is not None:
            out.append(first - started)
    arrivals = [t for t, _ in log_to.versions]
    interval_s = float(np.median(np.diff(arrivals))) if len(arrivals) > 1 else float("nan")
    return out, forward_s + interval_s


def _ask_back_to_back(policy: RemotePolicy, frames: dict[str, np.ndarray], until: float, chunks: list[int],
                      slot: int) -> None:
    state = np.zeros(policy.state_dim, np.float32)
    while time.monotonic() < until:
        policy.predict_chunk(frames, state, "push the red cube to the left")
        chunks[slot] += 1


def _capacity(server: _ServerProcess, n: int, seconds: float, frames: dict[str, np.ndarray]) -> float:
    """Chunks/s with ``n`` robots each asking again as soon as its chunk arrives."""
    policies = [RemotePolicy(RemoteInferenceConfig(server.endpoint, f"bench-cap-{i}", connect_timeout_s=120.0))
                for i in range(n)]
    chunks = [0] * n
    try:
        for policy in policies:
            policy.predict_chunk(frames, np.zeros(policy.state_dim, np.float32), "push the red cube to the left")
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_ask_back_to_back, args=(p, frames, until, chunks, i), daemon=True)
                   for i, p in enumerate(policies)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(chunks) / seconds
    finally:
        for policy in policies:
            policy.close()


def _hot_swap(published_bytes: int, swaps: int) -> dict[str, Any]:
    """Today's network hot-swap of a model the served one's size (``bench transport``'s swap rows)."""
    payload = SwapPayload("served", published_bytes / 1e6)
    with tempfile.TemporaryDirectory(prefix="bench-serve-swap-") as workdir:
        return zmq_swap(payload, "process", TransportBenchConfig(swaps=swaps), Path(workdir))


def _bytes_per_request(frames: dict[str, np.ndarray], sizes: list[int]) -> dict[str, float]:
    """Bytes of the two cameras' JPEGs at each input size (JPEG quality as the edge sends them)."""
    encoding = ImageEncoding(format="jpeg", jpeg_quality=RemoteInferenceConfig("", "").jpeg_quality)
    out = {}
    for size in sizes:
        total = sum(encode_image(cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA), encoding).nbytes
                    for f in list(frames.values())[:2])
        out[f"{size}x{size}"] = float(total)
    return out


def _lerobot_baseline(cfg: RobotRLConfig, bench: ServeBenchConfig, frames: dict[str, np.ndarray],
                      joints: tuple[str, ...], serve: ServeConfig) -> dict[str, Any]:
    """LeRobot's PolicyServer and RobotClients (``robot_rl.bench.serve_lerobot``), then our server,
    on the same tiny ACT (random weights: the cost of serving, not what it does, is compared)."""
    if importlib.util.find_spec("grpc") is None:
        return {"skipped": "LeRobot's async inference needs its gRPC transport (the dev extra lerobot[async])"}
    # LeRobot: the checkpoint's classes and its async inference, only where the baseline runs.
    from robot_rl.bench.lerobot_checkpoint import tiny_act_dir
    from robot_rl.bench.serve_lerobot import measure_lerobot_async
    from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

    image_size = next(iter(frames.values())).shape[0]  # the policy's input: the cameras' own size
    report: dict[str, Any] = {"policy": f"ACT, ResNet-18, {image_size}x{image_size} x {len(frames)} cameras, "
                                        f"chunk {_BASELINE_CHUNK}", "seconds": bench.lerobot_seconds, "ours": {},
                              "raw_frames_bytes": sum(frame.nbytes for frame in frames.values())}
    with tempfile.TemporaryDirectory(prefix="bench-serve-lerobot-") as workdir:
        checkpoint = tiny_act_dir(Path(workdir) / "act", cameras=tuple(frames), image_size=image_size,
                                  joints=len(joints), chunk_size=_BASELINE_CHUNK)
        report["lerobot"] = measure_lerobot_async(checkpoint, frames, joints, bench.lerobot_robots, _BASELINE_CHUNK,
                                                  cfg.edge.fps, bench.lerobot_seconds, Path(workdir))
        # the edges send frames at the policy's input size (its config's), as LeRobot's server resizes them to
        server = _ServerProcess(replace(cfg, policy=LeRobotPolicyConfig(path=str(checkpoint), device="cpu")), serve)
        try:
            for n in bench.lerobot_robots:
                report["ours"][n] = _cell(server, n, bench.lerobot_seconds, frames, cfg)
        finally:
            server.close()
    return report


def run_serve_bench(cfg: RobotRLConfig, bench: ServeBenchConfig) -> dict[str, Any]:
    frames, joints = _sim_frames(cfg)
    report: dict[str, Any] = {"robots": {}, "serial": {}, "capacity": {}, "seconds": bench.seconds}
    serve = replace(cfg.serve, endpoint="tcp://127.0.0.1:*")  # a free loopback port
    arms = [("robots", serve)] + ([("serial", replace(serve, max_batch=1))] if bench.serial else [])
    for arm, arm_serve in arms if bench.fleet else []:
        server = _ServerProcess(cfg, arm_serve)
        try:
            for n in bench.robots:
                report[arm][n] = _cell(server, n, bench.seconds, frames, cfg)
                log.info("%s %d robots: %s", arm, n, report[arm][n])
                report["capacity"].setdefault(n, {})[arm] = _capacity(server, n, bench.seconds, frames)
            if arm == "robots" and bench.swaps:
                swap, report["swap_to_serve_bound_s"] = _swap_to_serve(server, bench.swaps, frames, cfg)
                report["swap_to_serve_s"] = swap
                report["swap_to_serve_p95_s"] = float(np.percentile(swap, 95)) if swap else None
                hot = _hot_swap(server.published_bytes, bench.swaps)
                report["hot_swap"] = hot
                report["hot_swap_p95_s"] = hot["in_use_p95_s"]
        finally:
            server.close()
    report["bytes_per_request"] = _bytes_per_request(frames, [224])
    if bench.lerobot_baseline:
        report["lerobot_baseline"] = _lerobot_baseline(cfg, bench, frames, joints, serve)
    return report


def print_table(report: dict[str, Any]) -> None:
    print("\n| robots | mode | latency p50 | p95 | chunks/s | mean batch | compute/chunk | late ticks | stall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in ("robots", "serial"):
        for n, row in report.get(arm, {}).items():
            p50 = row["latency_p50_s"] or float("nan")
            p95 = row["latency_p95_s"] or float("nan")
            print(f"| {n} | {'batched' if arm == 'robots' else 'serial'} | {p50 * 1e3:.0f} ms | {p95 * 1e3:.0f} ms | "
                  f"{row['chunks_per_s']:.1f} | {row['mean_batch']:.1f} | {row['compute_per_chunk_s'] * 1e3:.1f} ms | "
                  f"{row['late_ticks']}/{row['ticks']} | {row['stall_s']:.1f} |")
    for n, row in report.get("capacity", {}).items():
        serial = row.get("serial")
        gain = f" ({row['robots'] / serial:.1f}x)" if serial else ""
        print(f"capacity, {n} robots asking back to back: batched {row['robots']:.1f} chunks/s"
              + (f", serial {serial:.1f}{gain}" if serial else ""))
    if report.get("swap_to_serve_p95_s") is not None:
        print(f"publish to first chunk of the new version: p95 {report['swap_to_serve_p95_s'] * 1e3:.0f} ms served in "
              f"place (one forward + one request interval: {report['swap_to_serve_bound_s'] * 1e3:.0f} ms), "
              f"{report['hot_swap_p95_s'] * 1e3:.0f} ms over the network to an edge's policy process")
    print(f"bytes per request, two cameras: {report['bytes_per_request']}")
    if "lerobot_baseline" in report:
        _print_baseline(report["lerobot_baseline"])


def _print_baseline(baseline: dict[str, Any]) -> None:
    if "skipped" in baseline:
        print(f"LeRobot baseline skipped: {baseline['skipped']}")
        return
    print(f"\nLeRobot's async inference against ours, {baseline['policy']}, {baseline['seconds']:.0f} s a cell:")
    print("| robots | server | latency p50 | p95 | chunks/s | stall s | bytes/request | chunks from another robot |")
    print("|---|---|---|---|---|---|---|---|")
    for server in ("lerobot", "ours"):
        for n, row in baseline[server].items():
            if "error" in row:
                print(f"| {n} | {server} | {row['error']} |")
                continue
            p50, p95 = (float("nan") if row[k] is None else row[k] * 1e3 for k in ("latency_p50_s", "latency_p95_s"))
            print(f"| {n} | {server} | {p50:.0f} ms | {p95:.0f} ms | {row['chunks_per_s']:.1f} | "
                  f"{row['stall_s']:.1f} | {row['bytes_per_request'] / 1e3:.1f} KB | {row.get('foreign_chunks', 0)} |")


def run_from_cli(cfg: RobotRLConfig) -> dict[str, Any]:
    report = run_serve_bench(cfg, cfg.bench)
    print_table(report)
    return report
