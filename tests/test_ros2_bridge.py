"""ROS 2 bridge round trip against a fake arm driver in a separate process, over loopback.

Each test run gets its own ROS_DOMAIN_ID (from the pid) and discovery is limited to
localhost, so parallel runs and other engineers' nodes never see each other. Every wait
is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from robot_rl.bridges.ros2 import Ros2ArmConfig, Ros2Robot, StaleStateError
from robot_rl.hardware.robot import InvalidActionError, Robot

REPO = Path(__file__).resolve().parent.parent
DOMAIN_ID = os.getpid() % 100 + 100
JOINTS = ("j1", "j2", "j3")
WAIT_S = 15.0


class FakeArm:
    """The fake driver process and a reader thread collecting its JSON lines."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                   PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "robot_rl.bridges.ros2.fake_arm", "--joints", ",".join(JOINTS), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next("ready")["joints"] == list(JOINTS)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self, kind: str, timeout: float = WAIT_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if record["type"] == kind:
                return record
        raise AssertionError(f"fake arm sent no {kind!r} within {timeout} s; stderr: {self._stderr()}")

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def make_robot(**overrides) -> Ros2Robot:
    values = dict(
        name="loopback_arm", fps=20, joint_names=JOINTS, domain_id=DOMAIN_ID, connect_timeout_s=WAIT_S,
        cameras={"front": {"topic": "/camera/image_raw", "height": 24, "width": 32},
                 "wrist": {"topic": "/camera/image_raw/compressed", "compressed": True, "height": 24, "width": 32}},
        stale_after_ms=300.0,
    )
    values.update(overrides)
    return Ros2Robot(Ros2ArmConfig(**values))


def wait_until(predicate, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture(autouse=True)
def _localhost_discovery(monkeypatch):
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")


def test_state_in_trajectory_out_with_plan_timing():
    arm = FakeArm("--start", "0.1", "-0.2", "0.3")
    robot = make_robot(scale=[10.0, 10.0, 1.0], offset=[0.0, 1.0, 0.0])
    try:
        robot.connect()
        assert isinstance(robot, Robot)
        obs = robot.get_observation()
        # Matched by name though the driver publishes in reverse order; scale/offset applied.
        np.testing.assert_allclose(obs["state"], [1.0, -1.0, 0.3], atol=1e-6)
        assert obs["images"]["front"].shape == (24, 32, 3) and tuple(obs["images"]["front"][0, 0]) == (200, 0, 0)
        assert tuple(obs["images"]["wrist"][0, 0]) == (200, 0, 0)

        plan = [np.array([2.0, 1.0, 0.5 + 0.1 * i], dtype=np.float32) for i in range(4)]
        robot.set_plan_source(lambda: plan)
        sent = robot.send_action(np.array([1.5, 1.0, 0.4], dtype=np.float32))
        np.testing.assert_allclose(sent, [1.5, 1.0, 0.4])
        record = arm.next("trajectory")
        assert record["joint_names"] == list(JOINTS)
        assert record["stamp"] == [0, 0]  # start now
        points = np.array(record["points"])
        assert points.shape == (5, 3)
        np.testing.assert_allclose(points[0], [0.15, 0.0, 0.4], atol=1e-9)  # back to ROS units
        np.testing.assert_allclose(points[1:, 2], [0.5, 0.6, 0.7, 0.8], atol=1e-6)
        np.testing.assert_allclose(record["time_from_start"], [(i + 1) / 20 for i in range(5)], atol=1e-9)
        # The arm moved to the commanded target and reports it back.
        moved = wait_until(lambda: np.allclose(robot.get_observation()["state"], [1.5, 1.0, 0.4], atol=1e-5))
        assert moved
    finally:
        robot.disconnect()
        arm.stop()


def test_forward_controller_gets_float64_multiarray_and_limits_clip():
    arm = FakeArm("--command-type", "forward", "--command-topic", "/forward_position_controller/commands")
    robot = make_robot(command_type="forward", command_topic="/forward_position_controller/commands",
                       cameras={}, joint_limits={"j1": [-1.0, 1.0]})
    try:
        robot.connect()
        robot.send_action(np.array([5.0, 0.5, -0.5], dtype=np.float32))
        record = arm.next("forward")
        np.testing.assert_allclose(record["data"], [1.0, 0.5, -0.5])
        with pytest.raises(InvalidActionError):
            robot.send_action(np.array([np.nan, 0, 0], dtype=np.float32))
    finally:
        robot.disconnect()
        arm.stop()


def test_stale_state_is_a_clear_error_when_the_driver_dies():
    arm = FakeArm()
    robot = make_robot(cameras={}, stale_after_ms=200.0)
    try:
        robot.connect()
        robot.get_observation()
        arm.stop()

        def stale() -> str | None:
            try:
                robot.get_observation()
            except StaleStateError as exc:
                return str(exc)
            return None

        message = wait_until(stale)
        assert "/joint_states" in message and "ms old" in message
    finally:
        robot.disconnect()
        arm.stop()


def test_connect_times_out_with_a_pointer_to_the_topics():
    robot = make_robot(cameras={}, connect_timeout_s=0.5, joint_state_topic="/nobody_publishes_this")
    with pytest.raises(TimeoutError, match="/nobody_publishes_this"):
        robot.connect()
    assert not robot.is_connected


def test_split_joint_states_are_merged_and_every_trajectory_point_is_bounded():
    """A driver that publishes the gripper on its own JointState connects; a plan that jumps is sent
    with every point one velocity-limited step from the one before (the controller runs them all)."""
    arm = FakeArm("--split")
    robot = make_robot(cameras={}, max_joint_velocity=2.0)  # 0.1 units per tick at 20 fps
    try:
        robot.connect()
        np.testing.assert_allclose(robot.get_observation()["state"], [0.0, 0.0, 0.0])
        plan = [np.array([5.0, -5.0, 0.05 * (i + 1)], dtype=np.float32) for i in range(6)]
        robot.set_plan_source(lambda: plan)
        robot.send_action(np.zeros(3, dtype=np.float32))
        points = np.array(arm.next("trajectory")["points"])
        steps = np.abs(np.diff(points, axis=0))
        assert steps.max() <= 0.1 + 1e-6
        np.testing.assert_allclose(points[-1], [0.6, -0.6, 0.3], atol=1e-6)  # 6 bounded steps towards the plan
    finally:
        robot.disconnect()
        arm.stop()


@pytest.mark.slow
def test_a_session_whose_driver_falls_silent_stops_in_control_and_saves_the_episode_as_aborted(tmp_path):
    arm = FakeArm("--silent-after", "1.5", "--rate", "50")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "robot_rl.cli", "session", "robot=ros2_arm", "policy=hold", "teleop=none",
           f"output_dir={out}", "session.episodes=2", "session.max_episode_steps=300", "session.keys=none",
           f"robot.joint_names=[{','.join(JOINTS)}]", f"robot.domain_id={DOMAIN_ID}", "robot.fps=20",
           "robot.stale_after_ms=300", "+robot.cameras={front:{topic:/camera/image_raw,height:24,width:32}}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)
    finally:
        arm.stop()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 4, text[-3000:]
    assert "ROBOT FAULT" in text and "ms old" in text and "Traceback" not in text
    from robot_rl.data import load_episode_arrays

    episodes = load_episode_arrays(out / "session", repo_id="local/robot_rl_session")
    assert len(episodes) == 1  # the episode under way is saved; the second never starts
    assert 20 <= len(episodes[0]["action"]) < 300  # ~1.5 s of ticks before the driver fell silent
    assert int(np.asarray(episodes[0]["episode_seed"]).reshape(-1)[0]) == -1  # a real scene: no sim seed
    log = [json.loads(line) for line in (out / "session_log.jsonl").read_text().splitlines()]
    assert [entry["verdict"] for entry in log] == ["aborted"]
