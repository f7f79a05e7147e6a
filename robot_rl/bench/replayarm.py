"""``ReplayArm``: a LeRobot ``Robot`` with no hardware behind it, for LeRobot's own ``RobotClient``.

``bench serve``'s LeRobot baseline drives LeRobot's ``RobotClient`` unchanged, and that client
builds its robot from a ``RobotConfig``. This one returns the same camera frames every tick (the
simulated SO-101's, taken once, as the bench's synthetic edges send) and joints that sit where the
last action sent them, as a position-controlled arm reaching its targets: LeRobot's PolicyServer
skips an observation whose joints moved less than 1 from the last one it ran, so frozen joints
would hide most of a client's requests.

LeRobot finds a robot's class from its config's class name without "Config", lower-cased, as a
module beside the config's (``make_device_from_device_class``): hence this module's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from lerobot.robots.config import RobotConfig
from lerobot.robots.robot import Robot


@RobotConfig.register_subclass("robot_rl_replay_arm")
@dataclass(kw_only=True)
class ReplayArmConfig(RobotConfig):
    frames: dict[str, np.ndarray] = field(default_factory=dict)  # camera name -> HxWx3 uint8, sent every tick
    joints: tuple[str, ...] = ()  # joint names; LeRobot's keys are "<joint>.pos"


class ReplayArm(Robot):
    config_class = ReplayArmConfig
    name = "robot_rl_replay_arm"

    def __init__(self, config: ReplayArmConfig) -> None:
        super().__init__(config)
        self.config = config
        self._positions = {f"{joint}.pos": 0.0 for joint in config.joints}
        self._connected = False

    @cached_property
    def observation_features(self) -> dict[str, Any]:
        return {**dict.fromkeys(self._positions, float),
                **{camera: frame.shape for camera, frame in self.config.frames.items()}}

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(self._positions, float)

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self, calibrate: bool = True) -> None:
        self._connected = True

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        """Nothing to calibrate: no motors."""

    def configure(self) -> None:
        """Nothing to configure: no motors."""

    def get_observation(self) -> dict[str, Any]:
        return {**self._positions, **self.config.frames}

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        self._positions.update({key: float(action[key]) for key in self._positions})
        return action

    def disconnect(self) -> None:
        self._connected = False
