"""LeRobot SO-101 follower behind our Robot protocol, over a mocked Feetech bus.

As in LeRobot's own tests, the ``FeetechMotorsBus`` class is patched with a mock (no
serial port here); everything above the bus is LeRobot's real ``SOFollower``, its real
calibration file handling and a real LeRobot camera (``image_files``) reading PNGs.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from robot_rl.hardware.lerobot_robot import LeRobotRobot, LeRobotRobotConfig, RobotNotCalibratedError
from robot_rl.hardware.robot import InvalidActionError, Robot
from tests.lerobot_mocks import JOINTS, feetech_bus_mock, mocked_so101_bus
from tests.lerobot_mocks import write_calibration as _write_calibration


@pytest.fixture
def image_paths(tmp_path):
    paths = []
    for i in range(3):
        image = np.full((24, 32, 3), 40 * (i + 1), dtype=np.uint8)
        image[0, 0] = (255, 0, 0)  # a BGR pixel, to check RGB conversion
        path = tmp_path / f"frame_{i}.png"
        cv2.imwrite(str(path), image)
        paths.append(str(path))
    return paths


@pytest.fixture
def make_robot(tmp_path, image_paths):
    bus = feetech_bus_mock()
    made: list[LeRobotRobot] = []

    def factory(calibrated: bool = True, **overrides) -> LeRobotRobot:
        cal_dir = tmp_path / "calibration"
        cal_dir.mkdir(exist_ok=True)
        if calibrated:
            _write_calibration(cal_dir, "arm")
        bus.is_calibrated = calibrated
        config = LeRobotRobotConfig(
            type="so101_follower",
            port="/dev/null",
            id="arm",
            calibration_dir=str(cal_dir),
            cameras={"front": {"type": "image_files", "paths": image_paths, "fps": 30, "width": 32, "height": 24}},
            **overrides,
        )
        robot = LeRobotRobot(config)
        made.append(robot)
        return robot

    with mocked_so101_bus(bus):
        yield factory, bus
    for robot in made:
        robot.disconnect()


def test_adapter_describes_the_so101_like_the_sim(make_robot):
    factory, _ = make_robot
    robot = factory()
    assert isinstance(robot, Robot)
    assert robot.joint_names == JOINTS
    assert robot.camera_names == ("front",)
    assert robot.action_features == {f"{j}.pos": float for j in JOINTS}
    assert robot.observation_features["front"] == (24, 32, 3)


def test_observation_maps_dict_to_vector_in_joint_order(make_robot):
    factory, bus = make_robot
    robot = factory()
    robot.connect()
    bus.present.update({"shoulder_pan": -12.5, "elbow_flex": 30.0, "gripper": 55.0})
    obs = robot.get_observation()
    assert obs["state"].dtype == np.float32
    np.testing.assert_allclose(obs["state"], [-12.5, 0.0, 30.0, 0.0, 0.0, 55.0])
    image = obs["images"]["front"]
    assert image.shape == (24, 32, 3) and image.dtype == np.uint8
    assert tuple(image[0, 0]) == (0, 0, 255)  # BGR file pixel arrives as RGB


def test_action_maps_vector_to_lerobot_dict(make_robot):
    factory, bus = make_robot
    robot = factory()
    robot.connect()
    action = np.array([10.0, -20.0, 30.0, -40.0, 50.0, 60.0], dtype=np.float32)
    sent = robot.send_action(action)
    np.testing.assert_allclose(sent, action)
    goal = bus.sync_write.call_args.args[1]
    assert goal == pytest.approx(dict(zip(JOINTS, action.tolist(), strict=True)))


def test_limits_come_from_lerobot_calibration_and_clip_actions(make_robot):
    factory, bus = make_robot
    robot = factory()
    robot.connect()
    lower, upper = robot.joint_limits
    half = 2000 / 2 * 360 / 4095  # calibrated range 1000..3000 ticks on a 4096-tick servo
    assert upper[0] == pytest.approx(half) and lower[0] == pytest.approx(-half)
    assert (lower[5], upper[5]) == (0.0, 100.0)  # gripper in 0..100
    sent = robot.send_action(np.array([500.0, -500.0, 0.0, 0.0, 0.0, 150.0], dtype=np.float32))
    assert sent[0] == pytest.approx(half) and sent[1] == pytest.approx(-half) and sent[5] == pytest.approx(100.0)
    assert bus.present["gripper"] == pytest.approx(100.0)


def test_configured_limits_override_calibration(make_robot):
    factory, _ = make_robot
    robot = factory(joint_limits={"shoulder_pan": [-10.0, 10.0]})
    robot.connect()
    sent = robot.send_action(np.array([45.0, 0, 0, 0, 0, 50.0], dtype=np.float32))
    assert sent[0] == pytest.approx(10.0)


def test_nan_action_is_refused_and_nothing_is_sent(make_robot):
    factory, bus = make_robot
    robot = factory()
    robot.connect()
    bus.sync_write.reset_mock()
    with pytest.raises(InvalidActionError, match="NaN"):
        robot.send_action(np.array([0, np.nan, 0, 0, 0, 0], dtype=np.float32))
    with pytest.raises(InvalidActionError, match="shape"):
        robot.send_action(np.zeros(5, dtype=np.float32))
    bus.sync_write.assert_not_called()


def test_disconnect_releases_bus_and_camera_and_refuses_io(make_robot):
    factory, bus = make_robot
    robot = factory()
    robot.connect()
    camera = robot.robot.cameras["front"]
    assert robot.is_connected and camera.is_connected
    robot.disconnect()
    assert not robot.is_connected and not bus.is_connected and not camera.is_connected
    with pytest.raises(RuntimeError, match="not connected"):
        robot.get_observation()
    with pytest.raises(RuntimeError, match="not connected"):
        robot.send_action(np.zeros(6, dtype=np.float32))


def test_uncalibrated_robot_refuses_to_connect_with_a_pointer_to_calibration(make_robot):
    factory, bus = make_robot
    robot = factory(calibrated=False)
    with pytest.raises(RobotNotCalibratedError, match="robot-rl calibrate motors"):
        robot.connect()
    assert not bus.is_connected


def test_unknown_lerobot_type_is_a_clear_error():
    with pytest.raises(ValueError, match="no robot type 'nonexistent_arm'"):
        LeRobotRobot(LeRobotRobotConfig(type="nonexistent_arm"))
