"""Calibration: ChArUco intrinsics on synthetic views rendered under known intrinsics;
latency calibration recovering a known injected command delay in the sim."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from robot_rl.calibration.camera import CalibrationError, CameraCalibration, CharucoBoardSpec, calibrate_camera

TRUE_K = np.array([[620.0, 0.0, 322.0], [0.0, 615.0, 238.0], [0.0, 0.0, 1.0]])
SIZE = (640, 480)
PX_PER_SQUARE = 80


def render_view(spec: CharucoBoardSpec, rvec: np.ndarray, tvec: np.ndarray) -> np.ndarray:
    """The board seen by a pinhole camera TRUE_K at pose (rvec, tvec): a homography of its image."""
    board_px = spec.board().generateImage((spec.squares_x * PX_PER_SQUARE, spec.squares_y * PX_PER_SQUARE))
    width_m, height_m = spec.squares_x * spec.square_length_m, spec.squares_y * spec.square_length_m
    corners_m = np.array([[0, 0, 0], [width_m, 0, 0], [width_m, height_m, 0], [0, height_m, 0]], dtype=np.float64)
    projected, _ = cv2.projectPoints(corners_m, rvec, tvec, TRUE_K, None)
    src = np.array([[0, 0], [board_px.shape[1], 0], [board_px.shape[1], board_px.shape[0]], [0, board_px.shape[0]]],
                   dtype=np.float32)
    homography = cv2.getPerspectiveTransform(src, projected.reshape(4, 2).astype(np.float32))
    view = cv2.warpPerspective(board_px, homography, SIZE, flags=cv2.INTER_LINEAR, borderValue=255)
    return cv2.cvtColor(view, cv2.COLOR_GRAY2RGB)


def random_views(spec: CharucoBoardSpec, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    center = np.array([spec.squares_x * spec.square_length_m / 2, spec.squares_y * spec.square_length_m / 2, 0.0])
    views = []
    for _ in range(count):
        rvec = np.array([rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5), rng.uniform(-0.3, 0.3)])
        rotation, _ = cv2.Rodrigues(rvec)
        distance = rng.uniform(0.35, 0.55)
        offset = np.array([rng.uniform(-0.03, 0.03), rng.uniform(-0.03, 0.03), distance])
        tvec = offset - rotation @ center  # board centre in front of the camera
        views.append(render_view(spec, rvec, tvec))
    return views


def test_charuco_calibration_recovers_known_intrinsics_below_half_a_pixel(tmp_path):
    spec = CharucoBoardSpec()
    calib = calibrate_camera(random_views(spec, 12, seed=0), spec)
    assert calib.reprojection_error_px < 0.5
    assert calib.views_used >= 10
    np.testing.assert_allclose(calib.K[0, 0], TRUE_K[0, 0], rtol=0.02)
    np.testing.assert_allclose(calib.K[1, 1], TRUE_K[1, 1], rtol=0.02)
    np.testing.assert_allclose(calib.K[:2, 2], TRUE_K[:2, 2], atol=8.0)
    saved = CameraCalibration.load_yaml(calib.save_yaml(tmp_path / "front.yaml"))
    assert saved.reprojection_error_px == pytest.approx(calib.reprojection_error_px)
    assert saved.image_width == SIZE[0] and saved.image_height == SIZE[1]


def test_calibration_without_a_board_says_what_to_do():
    blank = [np.full((480, 640, 3), 255, dtype=np.uint8)] * 6
    with pytest.raises(CalibrationError, match="found in only 0 of 6"):
        calibrate_camera(blank, CharucoBoardSpec())


# ----------------------------------------------------------------------------- latency


class DelayedCommands:
    """Wraps a robot so each command reaches it ``delay`` ticks late (a slow bus or driver)."""

    def __init__(self, robot, delay: int) -> None:
        self.robot = robot
        self.delay = delay
        self.fps = robot.fps
        self.joint_names = robot.joint_names
        self._pipe: list[np.ndarray] = []

    def get_observation(self):
        return self.robot.get_observation()

    def send_action(self, action):
        self._pipe.append(np.asarray(action, dtype=np.float32))
        if len(self._pipe) <= self.delay:
            # Nothing has come out of the pipe yet: the arm keeps its previous target.
            return self.robot.send_action(self.robot.last_action)
        return self.robot.send_action(self._pipe.pop(0))


class VirtualTimePolicy:
    """Takes exactly ``latency_s`` of virtual time per chunk (a stand-in for a GPU VLA)."""

    chunk_size = 10
    action_dim = 6

    def __init__(self, clock, latency_s: float) -> None:
        self.clock, self.latency_s = clock, latency_s

    def predict_chunk(self, observation, state, instruction):
        self.clock.advance(self.latency_s)
        return np.repeat(np.asarray(state, dtype=np.float32)[None], self.chunk_size, axis=0)

    def save_pretrained(self, directory):
        pass


@pytest.fixture(scope="module")
def sim_robot():
    from robot_rl.hardware.sim import SimConfig, SimSO101

    robot = SimSO101(SimConfig(cameras=("front",), image_height=32, image_width=32))
    robot.connect()
    robot.reset(seed=0)
    yield robot
    robot.disconnect()


@pytest.mark.parametrize("injected", [0, 3, 6])
def test_latency_calibration_recovers_an_injected_command_delay_in_sim(sim_robot, injected, tmp_path):
    import yaml

    from robot_rl.calibration.latency import StepTestConfig, calibrate_latency
    from robot_rl.core.clock import VirtualClock

    clock = VirtualClock()
    robot = DelayedCommands(sim_robot, injected)
    report = calibrate_latency(
        robot, clock, policy=VirtualTimePolicy(clock, 0.110), step=StepTestConfig(joint=0, trials=2),
        inference_runs=5, inference_timer=clock.now,
    )
    assert abs(report.command_to_motion_ticks - injected) <= 1
    assert report.inference_ms["p50"] == pytest.approx(110.0)
    assert report.delay_prior_ticks == 4  # 110 ms at 30 Hz = 3.3 ticks of actions consumed -> 4
    saved = yaml.safe_load(report.save_yaml(tmp_path / "latency.yaml").read_text())
    assert saved["edge"]["delay_prior_ticks"] == 4
    from robot_rl.edge import EdgeConfig

    EdgeConfig(**saved["edge"])  # the prior is something the edge config accepts as it is


def test_a_joint_that_never_moves_is_a_clear_error():
    from robot_rl.calibration.latency import LatencyCalibrationError, StepTestConfig, measure_command_delay
    from robot_rl.core.clock import VirtualClock

    class Frozen:
        fps = 30
        joint_names = ("a",)

        def get_observation(self):
            return {"images": {}, "state": np.zeros(1, dtype=np.float32)}

        def send_action(self, action):
            return action

    with pytest.raises(LatencyCalibrationError, match="did not move"):
        measure_command_delay(Frozen(), VirtualClock(), StepTestConfig(max_wait_ticks=5, trials=1))


# ----------------------------------------------------------------------------- CLI


def test_calibrate_camera_cli_writes_yaml(tmp_path, capsys):
    import yaml

    from robot_rl.commands import calibrate

    spec = CharucoBoardSpec()
    for i, view in enumerate(random_views(spec, 8, seed=1)):
        cv2.imwrite(str(tmp_path / f"shot_{i}.png"), cv2.cvtColor(view, cv2.COLOR_RGB2BGR))
    out = tmp_path / "front.yaml"
    rc = calibrate.main(["camera", "--images", str(tmp_path / "shot_*.png"), "--out", str(out)])
    assert rc == 0
    assert "RMS reprojection error" in capsys.readouterr().out
    saved = yaml.safe_load(out.read_text())
    assert saved["reprojection_error_px"] < 0.5 and saved["views_used"] == 8


def test_calibrate_motors_without_a_robot_is_a_clear_error(capsys):
    from robot_rl.commands import calibrate

    rc = calibrate.main(["motors", "robot=so101", "robot.port=/dev/ttyNO_SUCH_PORT"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "/dev/ttyNO_SUCH_PORT" in err and "lerobot-find-port" in err


def test_calibrate_motors_refuses_the_sim(capsys):
    from robot_rl.commands import calibrate

    assert calibrate.main(["motors", "robot=sim_so101"]) == 2
    assert "robot=so101" in capsys.readouterr().err


def test_undistortion_is_applied_to_the_cameras_the_robot_config_names(tmp_path):
    import cv2
    import numpy as np

    from robot_rl.calibration.camera import CameraCalibration, UndistortingRobot

    h, w = 48, 64
    calibration = CameraCalibration(image_width=w, image_height=h, camera_matrix=[[60.0, 0, w / 2], [0, 60.0, h / 2],
                                                                                   [0, 0, 1]],
                                    distortion=[-0.4, 0.15, 0.0, 0.0, 0.0], reprojection_error_px=0.2, views_used=9,
                                    views_rejected=0)
    path = calibration.save_yaml(tmp_path / "front.yaml")
    grid = np.zeros((h, w, 3), dtype=np.uint8)
    grid[::8] = 255
    grid[:, ::8] = 255

    class TwoCameras:
        camera_names = ("front", "wrist")
        name = "arm"

        def get_observation(self):
            return {"images": {"front": grid, "wrist": grid}, "state": np.zeros(6, dtype=np.float32)}

    robot = UndistortingRobot(TwoCameras(), {"front": str(path)})
    obs = robot.get_observation()
    expected = cv2.undistort(grid, calibration.K, np.asarray(calibration.distortion))
    assert np.abs(obs["images"]["front"].astype(int) - expected.astype(int)).mean() < 8  # OpenCV's own result
    assert not np.array_equal(obs["images"]["front"], grid)  # the lines are straightened
    assert obs["images"]["wrist"] is grid and robot.name == "arm"  # other cameras and attributes untouched
    with pytest.raises(ValueError, match="robot has"):
        UndistortingRobot(TwoCameras(), {"top": str(path)})
    small = CameraCalibration(**{**calibration.__dict__, "image_width": 32})
    with pytest.raises(ValueError, match="recalibrate at this size"):
        UndistortingRobot(TwoCameras(), {"front": str(small.save_yaml(tmp_path / "small.yaml"))}).get_observation()


def test_the_edge_reads_the_delay_prior_calibrate_latency_wrote_for_its_robot(tmp_path):
    from robot_rl.calibration.latency import LatencyReport, default_latency_path
    from robot_rl.core.errors import ConfigError
    from robot_rl.edge import EdgeConfig
    from robot_rl.session.runner import with_latency_calibration

    edge = EdgeConfig(delay_prior_ticks=3)
    assert with_latency_calibration(edge, str(tmp_path), "arm").delay_prior_ticks == 3  # nothing measured yet
    LatencyReport(fps=30, command_to_motion_ticks=2, command_to_motion_trials=[2, 2],
                  delay_prior_ticks=7).save_yaml(default_latency_path(tmp_path, "arm"))
    read = with_latency_calibration(edge, str(tmp_path), "arm")
    assert (read.delay_prior_ticks, read.command_lag_ticks) == (7, 2)
    assert with_latency_calibration(edge, str(tmp_path), "other").delay_prior_ticks == 3  # per robot
    with pytest.raises(ConfigError, match="calibrate latency"):
        with_latency_calibration(EdgeConfig(latency_calibration=str(tmp_path / "none.yaml")), str(tmp_path), "arm")
    (tmp_path / "bad.yaml").write_text("fps: 30\n")
    with pytest.raises(ValueError, match="not a latency calibration"):
        with_latency_calibration(EdgeConfig(latency_calibration=str(tmp_path / "bad.yaml")), str(tmp_path), "arm")
