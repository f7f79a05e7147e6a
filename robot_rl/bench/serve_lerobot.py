"""``bench serve``'s ``lerobot_baseline``: LeRobot's own async inference on the policy ours serves.

LeRobot's PolicyServer runs as LeRobot ships it (``python -m lerobot.async_inference.policy_server``,
a process of its own on loopback); LeRobot's ``RobotClient``s, unchanged, run in a second process
(``robot_rl.bench.lerobot_clients``), one per robot. The policy is a tiny ACT saved locally
(``robot_rl.bench.lerobot_checkpoint``), which ``bench serve`` also serves from our server.

What LeRobot's server does by design shows in the numbers: it serves one client (each ``Ready()``
resets it, and all clients share one observation queue of one), and a request is the robot's raw
observation pickled, every camera at full resolution, which the server unpickles inside LeRobot's
own process (LeRobot issue #3047). That is the baseline's nature; nothing of ours unpickles
anything received over a socket.

The client process sends its measurements back after each robot count; the bench waits a bounded
time for each, so a client that hangs costs a timeout and an ``error`` in the report, never the bench.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

_START_S = 120.0  # the client process imports LeRobot and waits for the server's port
_SLACK_S = 30.0  # beyond a robot count's warm-up and window: the clients' start and stop
WARMUP_S = 2.0  # each robot count's first seconds (handshakes, first forwards) are not measured


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_policy_server(port: int, fps: int, workdir: Path) -> subprocess.Popen[bytes]:
    """LeRobot's PolicyServer as its docs start it, on loopback, with one torch thread (as ours: the
    robots share this box). Its loggers write ``logs/`` under ``workdir``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(workdir / "policy_server.log", "wb") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "lerobot.async_inference.policy_server", "--host=127.0.0.1", f"--port={port}",
             f"--fps={fps}"], cwd=workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def _client_process(workdir: str, frames: dict[str, np.ndarray], joints: tuple[str, ...], address: str,
                    checkpoint: str, robot_counts: list[int], chunk_size: int, fps: int, seconds: float,
                    conn: Any) -> None:
    os.chdir(workdir)  # before the import: LeRobot's async-inference loggers write logs/ here
    with open("robot_clients.log", "wb") as log_file:  # and the console: there, the bench's table is
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
    # LeRobot's gRPC client and robots: only in this process (they reset the root logger on import).
    from robot_rl.bench.lerobot_clients import run_clients
    from robot_rl.bench.replayarm import ReplayArmConfig

    arm = ReplayArmConfig(calibration_dir=Path(workdir) / "calibration", frames=frames, joints=joints)
    run_clients(address, checkpoint, arm, robot_counts, chunk_size, fps, WARMUP_S, seconds, conn)


def measure_lerobot_async(checkpoint: Path, frames: dict[str, np.ndarray], joints: tuple[str, ...],
                          robot_counts: list[int], chunk_size: int, fps: int, seconds: float,
                          workdir: Path) -> dict[int, dict[str, Any]]:
    """Per robot count: LeRobot's clients against LeRobot's server (``lerobot_clients._summary``'s
    fields), or ``{"error": ...}`` where the clients did not report within their time."""
    port = _free_port()
    server = _start_policy_server(port, fps, workdir)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_client_process, name="bench-lerobot-clients", daemon=True, args=(
        str(workdir), frames, joints, f"127.0.0.1:{port}", str(checkpoint), robot_counts, chunk_size, fps, seconds,
        child_conn))
    process.start()
    child_conn.close()  # the child's end is the child's alone: its exit reads as EOF here, not as a hang
    results: dict[int, dict[str, Any]] = {}
    try:
        for i, robots in enumerate(robot_counts):
            budget = (_START_S if i == 0 else 0.0) + WARMUP_S + seconds + _SLACK_S
            if not conn.poll(budget):
                results[robots] = {"error": f"no result within {budget:.0f} s (a client hung)"}
                break
            try:
                item = conn.recv()
            except EOFError:
                results[robots] = {"error": f"the client process exited ({process.exitcode}); "
                                            f"server: {_tail(workdir / 'policy_server.log')}"}
                break
            if item is None:
                break
            results[item[0]] = item[1]
    finally:
        process.terminate()
        process.join(10)
        server.terminate()
        server.wait(10)
    return results


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else "no output"
