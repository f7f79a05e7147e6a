"""SO-101 (or any LeRobot) leader arm as a Teleop: the operator moves a second arm by hand.

The leader is read through LeRobot's own teleoperator class (``so101_leader`` and
friends), so its motor protocol and calibration are LeRobot's. The leader yields a pose
every tick; takeovers are switched by events from the session's keys (or a pedal),
because the leader arm is always somewhere and must not drive the follower unasked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.lerobot_registry import config_class
from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import TeleopConfig, TeleopReading

log = logging.getLogger(__name__)


@TELEOPS.register("leader", builder="robot_rl.hardware.teleop.leader:leader_teleop")
@dataclass
class LeaderArmConfig(TeleopConfig):
    """Which LeRobot teleoperator to open. ``type`` is its LeRobot registry name."""

    type: str = "so101_leader"
    port: str = "/dev/ttyACM1"
    id: str = "leader"
    calibration_dir: str | None = None


def make_lerobot_teleoperator(config: LeaderArmConfig):
    """Build the LeRobot teleoperator named by ``config.type`` through LeRobot's registry."""
    # LeRobot (the edge extra): every configuration reads this module's LeaderArmConfig
    from lerobot.teleoperators import TeleoperatorConfig, make_teleoperator_from_config

    config_cls = config_class("teleoperators", TeleoperatorConfig, config.type)
    calibration_dir = Path(config.calibration_dir) if config.calibration_dir else None
    lerobot_config = config_cls(port=config.port, id=config.id, calibration_dir=calibration_dir)
    return make_teleoperator_from_config(lerobot_config)


class LeaderArmTeleop:
    """A LeRobot leader arm; its joint positions (``<joint>.pos``) are the follower's target."""

    name = "leader_arm"

    def __init__(self, joint_names: tuple[str, ...], device=None, config: LeaderArmConfig | None = None) -> None:
        self.joint_names = tuple(joint_names)
        self.config = config or LeaderArmConfig()
        self.device = device if device is not None else make_lerobot_teleoperator(self.config)
        keys = set(self.device.action_features)
        missing = [j for j in self.joint_names if f"{j}.pos" not in keys]
        if missing:
            raise ValueError(
                f"leader {self.config.type!r} has no joints {missing} of the follower; "
                f"it offers {sorted(keys)}"
            )

    def connect(self) -> None:
        self.device.connect()

    def read(self, observation: Observation) -> TeleopReading:
        action = self.device.get_action()
        pose = np.array([action[f"{j}.pos"] for j in self.joint_names], dtype=np.float32)
        if not np.isfinite(pose).all():
            log.warning("leader arm gave a non-finite pose %s; ignoring this reading", pose)
            return TeleopReading()
        return TeleopReading(action=pose)

    def disconnect(self) -> None:
        if self.device.is_connected:
            self.device.disconnect()


def leader_teleop(config: LeaderArmConfig, robot) -> LeaderArmTeleop:
    return LeaderArmTeleop(tuple(robot.joint_names), config=config)
