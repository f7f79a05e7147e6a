"""The real-robot loop end to end, each part a CLI process of its own, over CURVE on loopback:

``robot-rl learner`` (no robot settings) serves two operator sessions at once: an SO-101 follower
through LeRobot (its motor bus mocked, its camera reading image files) and a ROS 2 arm (a driver
node in a third process). Scripted keys take over, jog and hand back. The learner trains and
publishes, the sessions swap the new weights in mid-session, the learner is killed (SIGKILL) and
restarted once while they run, and in the end its store holds every recorded step exactly once.
A session whose key the learner does not know is refused with one clear line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.learner_helpers import tiny_policy
from tests.lerobot_mocks import JOINTS, write_calibration

pytestmark = [pytest.mark.slow(order=0), pytest.mark.timeout(600)]  # the suite's longest: started first

REPO = Path(__file__).resolve().parent.parent
DOMAIN_ID = os.getpid() % 100 + 1
EPISODES = 14
TICKS = 60  # 2 s at 30 Hz
# Episode 0 and 3: take over at tick 10, jog the shoulder, hand back at tick 30; end early with s/f.
KEYS = ["0:10:space", "0:12:l", "0:14:l", "0:16:i", "0:30:space", "3:10:space", "3:15:k", "3:30:space",
        "5:50:f"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", ROS_DOMAIN_ID=str(DOMAIN_ID),
                ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")


def start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env(), cwd=cwd,
                            stdin=subprocess.DEVNULL)


def wait_for_line(log: Path, text: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log.name} after {timeout_s} s:\n{log.read_text()[-3000:]}")


def session_versions(log_path: Path) -> set[int]:
    if not log_path.exists():
        return set()
    return {v for line in log_path.read_text().splitlines() for v in json.loads(line)["policy_versions"]}


@pytest.fixture
def world(tmp_path):
    """Keys, a tiny policy for one front camera and six SO-101 joints, camera images, calibration."""
    subprocess.run([sys.executable, "-m", "robot_rl.cli", "keys", "--out", str(tmp_path / "keys"),
                    "--robots", "so101-a", "ros2-b"], check=True, env=env(), cwd=tmp_path, capture_output=True)
    subprocess.run([sys.executable, "-m", "robot_rl.cli", "keys", "--out", str(tmp_path / "stranger"),
                    "--robots", "so101-a"], check=True, env=env(), cwd=tmp_path, capture_output=True)
    tiny_policy().save_pretrained(tmp_path / "policy")
    frames = []
    for i in range(3):
        path = tmp_path / f"frame_{i}.png"
        cv2.imwrite(str(path), np.full((24, 32, 3), 60 * (i + 1), dtype=np.uint8))
        frames.append(str(path))
    write_calibration(tmp_path / "calibration", "arm")
    return tmp_path, frames


def learner_args(root: Path, router: int, pub: int, resume: bool = False) -> list[str]:
    return [sys.executable, "-m", "robot_rl.cli", "learner", *(["--resume"] if resume else []), "learner=rwr",
            f"policy.path={root / 'policy'}", f"output_dir={root / 'learner'}",
            f"learner.service.router_endpoint=tcp://127.0.0.1:{router}",
            f"learner.service.pub_endpoint=tcp://127.0.0.1:{pub}",
            f"learner.service.secret_key={root / 'keys' / 'learner.key_secret'}",
            f"learner.service.robot_keys_dir={root / 'keys' / 'robots'}",
            "learner.trainer.device=cpu", "learner.trainer.batch_size=8", "learner.trainer.min_steps_to_train=32",
            "learner.trainer.publish_every_updates=10", "learner.trainer.publish_every_s=2",
            "learner.trainer.checkpoint_every_updates=20", "learner.store.commit_linger_s=0"]


def session_args(root: Path, robot_id: str, router: int, pub: int, keys_dir: str = "keys") -> list[str]:
    out = root / (robot_id if keys_dir == "keys" else f"{robot_id}-{keys_dir}")
    return ["session", f"policy.path={root / 'policy'}", "teleop=keyboard", f"output_dir={out}",
            f"session.episodes={EPISODES}", f"session.max_episode_steps={TICKS}", "session.keys=script",
            f"session.key_script=[{','.join(KEYS)}]", "session.reset_time_s=0.2", "session.ack_timeout_s=2",
            "session.final_ack_timeout_s=120",
            "session.instruction=push the cube", f"link.learner=tcp://127.0.0.1:{router}",
            f"link.weights=tcp://127.0.0.1:{pub}", f"link.robot_id={robot_id}",
            f"link.secret_key={root / keys_dir / 'robots' / (robot_id + '.key_secret')}",
            f"link.learner_key={root / 'keys' / 'learner.key'}"]


def so101_session(root: Path, frames: list[str], robot_id: str, router: int, pub: int,
                  keys_dir: str = "keys") -> list[str]:
    camera = f"{{type:image_files,paths:[{','.join(frames)}],fps:30,width:32,height:24}}"
    return [sys.executable, "-m", "tests.lerobot_mocks", "robot-rl",
            *session_args(root, robot_id, router, pub, keys_dir), "robot=so101", "robot.port=/dev/null", "robot.id=arm",
            f"robot.calibration_dir={root / 'calibration'}", "~robot.cameras.front", "~robot.cameras.wrist",
            f"+robot.cameras.front={camera}"]


def ros2_session(root: Path, router: int, pub: int) -> list[str]:
    return [sys.executable, "-m", "robot_rl.cli", *session_args(root, "ros2-b", router, pub), "robot=ros2_arm",
            f"robot.joint_names=[{','.join(JOINTS)}]", f"robot.domain_id={DOMAIN_ID}",
            "+robot.cameras={front:{topic:/camera/image_raw,height:24,width:32}}"]


def dataset_steps(root: Path, repo_id: str) -> list[dict]:
    from robot_rl.data.reader import load_episode_arrays

    return load_episode_arrays(root, repo_id)


def test_two_real_robot_sessions_stream_to_a_restarted_learner_and_swap_its_weights(world):
    root, frames = world
    router, pub = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    try:
        learner = start(learner_args(root, router, pub), root / "learner1.log", root)
        procs.append(learner)
        wait_for_line(root / "learner1.log", "learner up", 120, learner)
        arm = start([sys.executable, "-m", "robot_rl.bridges.ros2.fake_arm", "--joints", ",".join(JOINTS),
                     "--rate", "100"], root / "arm.log", REPO)
        procs.append(arm)
        wait_for_line(root / "arm.log", '"ready"', 60, arm)
        so101 = start(so101_session(root, frames, "so101-a", router, pub), root / "so101.log", REPO)
        ros2 = start(ros2_session(root, router, pub), root / "ros2.log", REPO)
        procs += [so101, ros2]

        # A robot whose key the learner does not know is refused, in one line.
        stranger = subprocess.run(so101_session(root, frames, "so101-a", router, pub, keys_dir="stranger"), env=env(),
                                  cwd=REPO, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        assert stranger.returncode == 2, stranger.stdout + stranger.stderr
        last = stranger.stderr.strip().splitlines()[-1]
        assert last.startswith("robot-rl session:") and "CURVE" in last and "so101-a.key" in last

        # The learner trains and publishes: both sessions swap new weights in while they run.
        deadline = time.monotonic() + 240
        logs = [root / rid / "session_log.jsonl" for rid in ("so101-a", "ros2-b")]
        while time.monotonic() < deadline and not all(max(session_versions(p), default=0) >= 1 for p in logs):
            assert so101.poll() is None and ros2.poll() is None, (root / "so101.log").read_text()[-3000:]
            time.sleep(0.5)
        assert all(max(session_versions(p), default=0) >= 1 for p in logs), "no session swapped in new weights"
        # Killed mid-session (after its first checkpoint), restarted with --resume: the sessions keep
        # recording and re-send what was not acked.
        checkpoints = root / "learner" / "learner" / "checkpoints"
        while time.monotonic() < deadline and not (checkpoints / "latest").exists():
            time.sleep(0.2)
        assert (checkpoints / "latest").exists(), "the learner wrote no checkpoint to resume from"
        learner.send_signal(signal.SIGKILL)
        learner.wait(30)
        # Down until each session has ended an episode into its spool and said so (a restart faster
        # than an episode plus its ack timeout would leave no outage to see).
        outage_deadline = time.monotonic() + 120
        while not all("waits in the spool" in p.read_text() for p in logs):
            assert time.monotonic() < outage_deadline, "no session said its episode waits in the spool"
            assert so101.poll() is None and ros2.poll() is None, "a session ended before the learner came back"
            time.sleep(0.2)
        learner = start(learner_args(root, router, pub, resume=True), root / "learner2.log", root)
        procs.append(learner)
        for proc, name in ((so101, "so101"), (ros2, "ros2")):
            assert proc.wait(400) == 0, (root / f"{name}.log").read_text()[-4000:]
        learner.send_signal(signal.SIGTERM)  # a clean stop: the last episodes are committed
        assert learner.wait(120) == 0, (root / "learner2.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

    for robot_id in ("so101-a", "ros2-b"):
        text = (root / f"{robot_id.split('-')[0]}.log").read_text()
        assert "operator takes over" in text and "operator hands back" in text and "Traceback" not in text
        assert "jog (while you drive" in text and "j/l shoulder_pan" in text  # the jog keys are on screen
        local = dataset_steps(root / robot_id / "session", "local/robot_rl_session")
        assert len(local) == EPISODES
        versions = {int(v) for episode in local for v in np.asarray(episode["policy_version"]).reshape(-1)}
        assert len(versions) >= 2, versions  # weights swapped mid-session
        assert any(np.asarray(e["is_intervention"]).reshape(-1).any() for e in local)
        assert all(int(np.asarray(e["episode_seed"]).reshape(-1)[0]) == -1 for e in local)  # real scenes
        log = [json.loads(line) for line in (root / robot_id / "session_log.jsonl").read_text().splitlines()]
        assert log[0]["learner"].startswith("learner acked")
        assert any("waits in the spool" in entry["learner"] for entry in log)  # the outage, said
        assert "not every episode reached the learner" not in text  # the spool was emptied before the end

    # Every recorded step is in the learner's store exactly once: per robot, the same episodes
    # (lengths, actions) as recorded locally, none twice.
    store = root / "learner" / "learner" / "store"
    ledger = [json.loads(line) for line in (store / "ledger.jsonl").read_text().splitlines()]
    robot_of = {r["index"]: r["robot"] for r in ledger if r["op"] == "commit"}
    stored = dataset_steps(store / "dataset", "local/robot_rl_replay")
    for robot_id in ("so101-a", "ros2-b"):
        local = dataset_steps(root / robot_id / "session", "local/robot_rl_session")
        mine = [e for e in stored if robot_of.get(int(e["episode_index"])) == robot_id]
        assert sorted(len(e["action"]) for e in mine) == sorted(len(e["action"]) for e in local)
        local_actions = sorted(np.asarray(e["action"]).round(3).tobytes() for e in local)
        stored_actions = sorted(np.asarray(e["action"]).round(3).tobytes() for e in mine)
        assert local_actions == stored_actions
