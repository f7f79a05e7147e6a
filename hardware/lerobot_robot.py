"""Any installed LeRobot robot (SO-101 follower first) behind our ``Robot`` protocol.

LeRobot robots speak flat dicts (``{"shoulder_pan.pos": 12.5, ..., "front": HxWx3}``);
the edge speaks a float32 joint vector plus images by camera. This adapter only maps
between the two and adds the checks the edge relies on (NaN refusal, joint-limit
clipping, a clear error when not connected or not calibrated). Motor protocols,
calibration and cameras stay LeRobot's: the robot is built from LeRobot's own config
class, found by its registry name (``so101_follower``, ``koch_follower``, ``lekiwi``...).

Units are LeRobot's: with ``use_degrees`` (the SO-101 default) arm joints are degrees
and the gripper is 0..100, exactly what the sim and the policies use.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.hardware.lerobot_registry import config_class
from robot_rl.hardware.lerobot_robot_config import LeRobotRobotConfig
from robot_rl.hardware.robot import Observation, RobotFaultError, validate_action

log = logging.getLogger(__name__)


class RobotNotCalibratedError(RuntimeError):
    """The motors have no calibration matching this robot id; positions would be meaningless."""


def make_lerobot_config(config: LeRobotRobotConfig):
    """The LeRobot ``RobotConfig`` for ``config`` (its class found through LeRobot's registry)."""
    # LeRobot (the edge extra), here and below: seconds to import, paid when a LeRobot robot is built
    from lerobot.robots import RobotConfig

    from robot_rl.hardware.cameras import camera_configs_from_spec  # LeRobot's cameras

    cls = config_class("robots", RobotConfig, config.type)
    accepted = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {
        "port": config.port,
        "id": config.id,
        "calibration_dir": Path(config.calibration_dir) if config.calibration_dir else None,
        "cameras": camera_configs_from_spec(config.cameras),
        "max_relative_target": config.max_relative_target,
        "disable_torque_on_disconnect": config.disable_torque_on_disconnect,
    }
    values = {k: v for k, v in values.items() if k in accepted}
    unknown = sorted(set(config.options) - accepted)
    if unknown:
        raise ValueError(f"LeRobot {config.type!r} config has no field(s) {unknown}; it has {sorted(accepted)}")
    values.update(config.options)
    return cls(**values)


class LeRobotRobot:
    """Robot protocol over a LeRobot ``Robot`` instance (built from config, or given)."""

    def __init__(self, config: LeRobotRobotConfig | None = None, robot: Any = None) -> None:
        self.config = config or LeRobotRobotConfig()
        if robot is None:
            from lerobot.robots.utils import make_robot_from_config  # LeRobot (the edge extra)

            robot = make_robot_from_config(make_lerobot_config(self.config))
        self.robot = robot
        self.name = str(self.config.id or getattr(robot, "name", "lerobot"))
        self.fps = int(self.config.fps)
        features = robot.action_features
        self._action_keys = tuple(k for k, v in features.items() if v is float)
        if not self._action_keys:
            raise ValueError(f"LeRobot robot {type(robot).__name__} has no float action features: {features}")
        self.joint_names = tuple(k.removesuffix(".pos") for k in self._action_keys)
        self.camera_names = tuple(k for k, v in robot.observation_features.items() if isinstance(v, tuple))
        self._limits: tuple[np.ndarray, np.ndarray] | None = None

    # -- Robot protocol: description ----------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return bool(self.robot.is_connected)

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        if self._limits is None:
            self._limits = self._derive_limits()
        return self._limits

    @property
    def max_joint_velocity(self) -> Any:
        """Action units per second (the edge bounds every target by it)."""
        return self.config.max_joint_velocity

    @property
    def observation_features(self) -> dict[str, type | tuple[int, ...]]:
        return dict(self.robot.observation_features)

    @property
    def action_features(self) -> dict[str, type]:
        return {k: float for k in self._action_keys}

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int]]:
        """(H, W) per camera, for the recorder."""
        features = self.robot.observation_features
        return {cam: (int(features[cam][0]), int(features[cam][1])) for cam in self.camera_names}

    # -- Robot protocol: life cycle --------------------------------------------------------

    def connect(self) -> None:
        if self.is_connected:
            return
        self.robot.connect(calibrate=self.config.calibrate_on_connect)
        if not self.robot.is_calibrated:
            self.robot.disconnect()
            raise RobotNotCalibratedError(
                f"{self.config.type} {self.name!r} on {self.config.port} is not calibrated (no matching "
                "calibration file); run `robot-rl calibrate motors` first"
            )
        self._limits = self._derive_limits()
        log.info("connected %s %r: joints %s, cameras %s", self.config.type, self.name, self.joint_names,
                 self.camera_names)

    def disconnect(self) -> None:
        if self.is_connected:
            self.robot.disconnect()

    def get_observation(self) -> Observation:
        self._require_connected()
        try:
            raw = self.robot.get_observation()
        except (ConnectionError, TimeoutError, OSError) as exc:  # the bus or a camera stopped answering
            raise RobotFaultError(f"{self.name}: no reading from the robot ({exc})") from exc
        state = np.array([raw[k] for k in self._action_keys], dtype=np.float32)
        if not np.isfinite(state).all():
            bad = [self.joint_names[i] for i in np.flatnonzero(~np.isfinite(state))]
            raise RobotFaultError(f"{self.name}: joint reading is NaN/inf for {bad}; check the motor bus")
        images = {cam: np.ascontiguousarray(raw[cam], dtype=np.uint8) for cam in self.camera_names}
        return {"images": images, "state": state}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Clip to the joint limits, send through LeRobot; return what LeRobot actually sent."""
        self._require_connected()
        target = validate_action(action, self.joint_names)
        lower, upper = self.joint_limits
        target = np.clip(target, lower, upper).astype(np.float32)
        try:
            sent = self.robot.send_action({k: float(v) for k, v in zip(self._action_keys, target, strict=True)})
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise RobotFaultError(f"{self.name}: command not delivered ({exc})") from exc
        return np.array([sent.get(k, t) for k, t in zip(self._action_keys, target, strict=True)], dtype=np.float32)

    def camera_frame_ages_s(self) -> dict[str, float]:
        """Age of each camera's newest frame (for cameras that timestamp frames, as LeRobot's do)."""
        ages = {}
        for name, cam in getattr(self.robot, "cameras", {}).items():
            stamp = getattr(cam, "latest_timestamp", None)
            if stamp is not None:
                ages[name] = time.perf_counter() - stamp
            elif hasattr(cam, "frame_age_s"):
                ages[name] = cam.frame_age_s()
        return ages

    # -- internals -------------------------------------------------------------------------

    def _require_connected(self) -> None:
        if not self.is_connected:
            raise RuntimeError(f"robot {self.name!r} is not connected; call connect() first")

    def _derive_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """Configured limits, else the motor ranges recorded by LeRobot's calibration."""
        lower = np.full(len(self.joint_names), -np.inf, dtype=np.float32)
        upper = np.full(len(self.joint_names), np.inf, dtype=np.float32)
        from_calibration = calibration_limits(self.robot)
        for i, joint in enumerate(self.joint_names):
            if self.config.joint_limits and joint in self.config.joint_limits:
                lower[i], upper[i] = self.config.joint_limits[joint]
            elif joint in from_calibration:
                lower[i], upper[i] = from_calibration[joint]
        missing = [j for j, lo in zip(self.joint_names, lower, strict=True) if not np.isfinite(lo)]
        if missing:
            log.warning("no joint limits known for %s; actions on them are not clipped", missing)
        return lower, upper


def calibration_limits(robot: Any) -> dict[str, tuple[float, float]]:
    """Joint limits in LeRobot's normalised units from the motor calibration ranges.

    Degrees mode maps the calibrated range [min, max] (encoder ticks) to
    +-(max - min) / 2 * 360 / resolution around its middle, as LeRobot's bus does;
    the range modes map it to -100..100 or 0..100.
    """
    from lerobot.motors import MotorNormMode  # LeRobot (the edge extra)

    bus = getattr(robot, "bus", None)
    calibration = getattr(robot, "calibration", None) or {}
    if bus is None or not calibration:
        return {}
    limits: dict[str, tuple[float, float]] = {}
    for name, motor in bus.motors.items():
        cal = calibration.get(name)
        if cal is None:
            continue
        if motor.norm_mode is MotorNormMode.DEGREES:
            resolution = bus.model_resolution_table[motor.model] - 1
            half = (cal.range_max - cal.range_min) / 2 * 360.0 / resolution
            limits[name] = (-half, half)
        elif motor.norm_mode is MotorNormMode.RANGE_M100_100:
            limits[name] = (-100.0, 100.0)
        elif motor.norm_mode is MotorNormMode.RANGE_0_100:
            limits[name] = (0.0, 100.0)
    return limits
