"""Part 7 of `robot-rl bench faults`: a robot killed mid-episode keeps that episode, at the learner and
in its own dataset, but for at most one segment (``edge_kill_mid_episode``).

The robot is the one edge runtime (``robot_rl.edge.runtime.EdgeRuntime``: node, learner link, local
recorder and its journal) on a simulated SO-101 holding still, in a process of its own, streaming to a
learner endpoint (``ZmqServer`` on a thread of this process, storing each decoded segment once). It
ticks one endless episode on the wall clock, writing each finished tick's count to a file, and is
killed with SIGKILL a few segments in. Then the runtime starts again on the same disk, as a restarted
``robot-rl edge`` would: its link re-sends its spool, and its start stores what its journal holds in
the local dataset. ``ticks_recorded`` (the killed robot's count) minus ``ticks_stored`` (the learner's)
and minus ``local_ticks`` (the dataset's) must each be at most ``segment_ticks``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from robot_rl.bench.fault_peers import CountingIngest, serving_thread
from robot_rl.bridges.zmq.server import ServerConfig

SEGMENT_TICKS = 10
KILL_AFTER_TICKS = 4 * SEGMENT_TICKS + 5  # mid-segment, a few segments in
ROBOT_ID = "robot-crash"
REPO_ID = "local/robot-crash"
START_TIMEOUT_S = 120.0  # a cold child imports torch, LeRobot and MuJoCo


def crash_edge_main(root: str, router: str, pub: str, tick: bool) -> None:
    """The robot's process: build the runtime on ``root``; with ``tick``, tick one endless episode (each
    finished tick's count to ``root/ticks``), else start, flush and stop, writing what its start
    recovered to ``root/restart.json``."""
    # Imported in the robot's process only: the runtime brings PyTorch, LeRobot's writer and MuJoCo.
    from robot_rl.bridges.zmq.client import ClientConfig
    from robot_rl.core.clock import WallClock
    from robot_rl.core.layout import RecordedLayout
    from robot_rl.core.parent_watch import exit_when_parent_dies
    from robot_rl.data.recorder import EpisodeRecorder
    from robot_rl.edge.config import EdgeConfig
    from robot_rl.edge.runtime import EdgeRuntime
    from robot_rl.hardware.sim.config import SimConfig
    from robot_rl.hardware.sim.robot import SimSO101
    from robot_rl.policies.hold import HoldPolicy

    exit_when_parent_dies(f"the bench's {ROBOT_ID}")
    logging.basicConfig(level=logging.WARNING, filename=f"{root}/robot.log")
    robot = SimSO101(SimConfig(image_height=32, image_width=32))
    robot.connect()
    layout = RecordedLayout.of_robot(robot)
    client = ClientConfig(robot_id=ROBOT_ID, router_endpoint=router, pub_endpoint=pub, spool_dir=f"{root}/spool",
                          features=layout.to_document(), fetch_weights=False, hello_retry_s=0.1,
                          heartbeat_interval_s=0.2)
    recorder = EpisodeRecorder(Path(root) / "robots" / ROBOT_ID, layout.fps, layout.joint_names,
                               layout.camera_shapes, repo_id=REPO_ID)
    runtime = EdgeRuntime(robot, HoldPolicy(), WallClock(), EdgeConfig(fps=layout.fps), robot_id=ROBOT_ID,
                          client=client, recorder=recorder, segment_steps=SEGMENT_TICKS)
    runtime.start(30.0)
    if not tick:
        acked = runtime.close(ack_timeout_s=60.0)
        Path(root, "restart.json").write_text(json.dumps({"recovered_ticks": runtime.recovered_ticks,
                                                          "acked": acked}))
        return
    runtime.begin_episode("hold still")
    with open(Path(root) / "ticks", "w") as out:
        while True:
            step = runtime.tick()
            out.write(f"{step.tick + 1}\n")
            out.flush()


def _robot(root: Path, router: str, pub: str, tick: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "robot_rl.bench.fault_crash", str(root), router, pub,
                             "tick" if tick else "restart"])


def _ticks(root: Path) -> int:
    lines = (root / "ticks").read_text().split() if (root / "ticks").exists() else []
    return int(lines[-1]) if lines else 0


def edge_kill_mid_episode(root: Path) -> dict[str, int | bool]:
    ingest = CountingIngest()
    with serving_thread(ServerConfig(), ingest) as server:
        robot = _robot(root, server.router_endpoint, server.pub_endpoint, tick=True)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while _ticks(root) < KILL_AFTER_TICKS:
                if robot.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"bench faults: the crashing robot did not tick (see {root / 'robot.log'})")
                time.sleep(0.01)
            os.kill(robot.pid, signal.SIGKILL)
            robot.wait(30)
        finally:
            if robot.poll() is None:
                robot.kill()
        recorded = _ticks(root)
        restart = _robot(root, server.router_endpoint, server.pub_endpoint, tick=False)
        restart.wait(START_TIMEOUT_S + 60)
        result = json.loads((root / "restart.json").read_text()) if restart.returncode == 0 else {}
        stored = sum(n for (robot_id, _, _), n in ingest.steps.items() if robot_id == ROBOT_ID)
    return {"ticks_recorded": recorded, "ticks_stored": stored, "local_ticks": int(result.get("recovered_ticks", 0)),
            "segment_ticks": SEGMENT_TICKS, "acked_after_restart": bool(result.get("acked", False))}


def edge_kill_passed(row: dict[str, int | bool]) -> bool:
    recorded, segment = int(row["ticks_recorded"]), int(row["segment_ticks"])
    # The count is written after each tick: the robot may have run one more tick than it says.
    return (bool(row["acked_after_restart"]) and -1 <= recorded - int(row["ticks_stored"]) <= segment
            and -1 <= recorded - int(row["local_ticks"]) <= segment)


if __name__ == "__main__":  # the robot's process: ROOT ROUTER PUB tick|restart
    crash_edge_main(sys.argv[1], sys.argv[2], sys.argv[3], tick=sys.argv[4] == "tick")
