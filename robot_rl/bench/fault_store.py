"""A full disk under the learner's store for ``robot-rl bench faults``.

The learner (``LearnerService``, not training) runs in a process of its own; once a robot has said
hello, that process's file-size limit (RLIMIT_FSIZE) drops to one byte, so its next staging write
lands one byte and then fails with EFBIG, as writes on a full disk fail (a real short write, not a
mock). A robot streams an episode meanwhile. The learner must ack none of it, keep serving (the
robot's heartbeats are answered: it stays connected), say so once in its log and count it in its
store's stats; once the limit is lifted the robot's re-sends must be stored, every step once. The
learner logs to memory, which no file-size limit reaches.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

STEPS, SEGMENT_STEPS = 30, 10
READY_TIMEOUT_S = 180.0  # a cold process imports torch and reads its store
REFUSED_ROUNDS = 2  # each segment refused at least this often (the robot re-sends after its ack timeout)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _learner_child(root: str, conn: Any) -> None:
    """Serve until told ``stop``; ``fill`` / ``free`` set and lift the file-size limit; ``stats``."""
    import resource
    import signal

    from robot_rl.core.parent_watch import exit_when_parent_dies

    exit_when_parent_dies("the bench's full-disk learner")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    lines = _Lines()
    logging.getLogger().addHandler(lines)
    logging.getLogger().setLevel(logging.INFO)
    import torch

    from robot_rl.bench.transport import ballast_policy
    from robot_rl.learner.config import LearnerConfig, ServiceConfig, StoreConfig, TrainerConfig
    from robot_rl.learner.service import LearnerService

    torch.set_num_threads(1)
    config = LearnerConfig(
        store=StoreConfig(root=f"{root}/store", commit_linger_s=0.0, writer="thread"),
        trainer=TrainerConfig(device="cpu", log_dir="", checkpoint_dir=f"{root}/ckpt"),
        service=ServiceConfig(router_endpoint="tcp://127.0.0.1:*", pub_endpoint="tcp://127.0.0.1:*",
                              heartbeat_interval_s=0.2))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    with LearnerService(config, ballast_policy(0.0), train=False) as service:
        service.start()
        conn.send({"router": service.router_endpoint, "config_hash": service.policy.config_hash()})
        while (command := conn.recv()) != "stop":
            if command == "fill":
                resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
            elif command == "free":
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            conn.send(service.store.stats())
    conn.send(lines.lines)


def _steps(episode: int) -> list[Any]:
    from robot_rl.bench.transport import synthetic_frames
    from robot_rl.core.types import Step

    frames = synthetic_frames(STEPS, 7)
    return [Step(tick=t, time_s=t / 30, state=np.array([7, episode, t, 0, 0, 0], np.float32),
                 action=np.zeros(6, np.float32), images=frames[t], done=t == STEPS - 1) for t in range(STEPS)]


def full_disk_under_the_store(root: Path) -> bool:
    """True when the learner acked nothing it could not stage, kept serving, said so once, and stored
    every step once after the disk had room again."""
    from robot_rl.bench.fault_edge import JOINTS
    from robot_rl.bench.fault_stored import stored_rows
    from robot_rl.bench.transport import CAMERAS, IMAGE
    from robot_rl.bridges.zmq.client import ClientConfig, ZmqClient
    from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment

    context = mp.get_context("spawn")
    conn, child_conn = context.Pipe()
    learner = context.Process(target=_learner_child, args=(str(root), child_conn), name="bench-full-disk-learner")
    learner.start()
    client = None
    try:
        if not conn.poll(READY_TIMEOUT_S):
            return False
        ready = conn.recv()
        features = {"fps": 30, "joint_names": list(JOINTS), "cameras": {c: [IMAGE, IMAGE] for c in CAMERAS}}
        client = ZmqClient(ClientConfig(robot_id="robot-7", router_endpoint=ready["router"], pub_endpoint=None,
                                        spool_dir=root / "spool", features=features, config_hash=ready["config_hash"],
                                        ack_timeout_s=0.5, hello_retry_s=0.1, heartbeat_interval_s=0.2))

        def until(done: Callable[[], bool], timeout_s: float) -> bool:
            deadline = time.monotonic() + timeout_s
            while not done() and time.monotonic() < deadline:
                client.poll(20)
            return done()

        def command(name: str) -> dict:
            conn.send(name)
            return conn.recv()

        if not until(lambda: client.connected, 60.0):
            return False
        command("fill")
        steps = _steps(1)
        segments = [encode_segment("robot-7", 1, seq, steps[i:i + SEGMENT_STEPS], image_encoding=ImageEncoding("jpeg"),
                                   episode_done=i + SEGMENT_STEPS >= STEPS)
                    for seq, i in enumerate(range(0, STEPS, SEGMENT_STEPS))]
        for segment in segments:
            client.send_segment(segment)
        refused = until(lambda: client.stats.errors_received >= REFUSED_ROUNDS * len(segments), 60.0)
        full = command("stats")
        unacked_while_full = refused and client.stats.segments_acked == 0 and client.pending == len(segments)
        served_while_full = client.connected and client.stats.link_resets == 0
        command("free")
        delivered = until(lambda: client.pending == 0, 60.0)
        conn.send("stop")
        lines = conn.recv() if conn.poll(120.0) else []
    finally:
        if client is not None:
            client.close()
        learner.join(60)
        if learner.is_alive():
            learner.kill()
            learner.join()
    rows, non_finite, left_staged = stored_rows(root / "store")
    said = [line for line in lines if line.startswith("STAGING FAILED")]
    return (unacked_while_full and served_while_full and full["staging_write_failures"] >= len(segments)
            and len(said) == 1 and delivered and sorted(rows) == [(7, 1, t) for t in range(STEPS)]
            and non_finite == 0 and left_staged == 0)
