"""Gamepad as a Teleop, through LeRobot's ``gamepad`` teleoperator (pygame or hidapi).

LeRobot's gamepad gives end-effector deltas (x, y, z), a gripper command and episode
events (intervention button, success / failure / rerecord). Our robots take joint
targets, so each axis jogs one joint at ``jog_deg_per_tick`` per unit of stick (a
joint-space jog: predictable on any arm without an IK model), integrated from the
follower's current commanded pose. The intervention button's edges become take-over
and hand-back events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import TeleopConfig, TeleopEvent, TeleopReading

# LeRobot's GripperAction: 0 close, 1 stay, 2 open.
_GRIPPER_DIRECTION = {0: -1.0, 1: 0.0, 2: 1.0}


@TELEOPS.register("gamepad", builder="robot_rl.hardware.teleop.gamepad:gamepad_teleop")
@dataclass
class GamepadConfig(TeleopConfig):
    """Which joint each stick axis jogs, and how fast (degrees or gripper units per tick)."""

    axis_joints: dict[str, str] = field(
        default_factory=lambda: {"delta_x": "shoulder_pan", "delta_y": "shoulder_lift", "delta_z": "elbow_flex"}
    )
    gripper_joint: str = "gripper"
    jog_deg_per_tick: float = 1.0
    gripper_step_per_tick: float = 3.0
    hidapi_fallback: bool = False


class GamepadTeleop:
    """Joint jog from LeRobot's gamepad; its buttons give the episode events."""

    name = "gamepad"

    def __init__(self, joint_names: tuple[str, ...], config: GamepadConfig | None = None, device=None) -> None:
        self.joint_names = tuple(joint_names)
        self.config = config or GamepadConfig()
        driven = [*self.config.axis_joints.values(), self.config.gripper_joint]
        unknown = [j for j in driven if j not in self.joint_names]
        if unknown:
            raise ValueError(f"gamepad jogs joints {unknown} that the robot does not have ({list(self.joint_names)})")
        self.device = device if device is not None else self._make_device()
        self._was_intervening = False
        self._pose: np.ndarray | None = None

    def _make_device(self):
        # LeRobot (the edge extra), here and below: every configuration reads this module's GamepadConfig
        from lerobot.teleoperators.gamepad import GamepadTeleop as LeRobotGamepad
        from lerobot.teleoperators.gamepad import GamepadTeleopConfig

        return LeRobotGamepad(GamepadTeleopConfig(use_gripper=True, hidapi_fallback=self.config.hidapi_fallback))

    def connect(self) -> None:
        self.device.connect()

    def start_takeover(self, pose: np.ndarray) -> None:
        """Jog from where the follower is told to be (called by TeleopIntervention)."""
        self._pose = np.asarray(pose, dtype=np.float32).copy()

    def read(self, observation: Observation) -> TeleopReading:
        events = self._events()
        if self._pose is None or TeleopEvent.TAKE_OVER in events:
            self._pose = np.asarray(observation["state"], dtype=np.float32).copy()
        action = self.device.get_action()
        step = np.zeros(len(self.joint_names), dtype=np.float32)
        for axis, joint in self.config.axis_joints.items():
            step[self.joint_names.index(joint)] = float(action.get(axis, 0.0)) * self.config.jog_deg_per_tick
        direction = _GRIPPER_DIRECTION.get(int(action.get("gripper", 1)), 0.0)
        step[self.joint_names.index(self.config.gripper_joint)] = direction * self.config.gripper_step_per_tick
        self._pose = (self._pose + step).astype(np.float32)
        return TeleopReading(action=self._pose.copy(), events=events)

    def _events(self) -> list[TeleopEvent]:
        from lerobot.teleoperators.utils import TeleopEvents  # LeRobot (the edge extra)

        raw = self.device.get_teleop_events()
        events: list[TeleopEvent] = []
        intervening = bool(raw.get(TeleopEvents.IS_INTERVENTION, False))
        if intervening and not self._was_intervening:
            events.append(TeleopEvent.TAKE_OVER)
        elif self._was_intervening and not intervening:
            events.append(TeleopEvent.HAND_BACK)
        self._was_intervening = intervening
        if raw.get(TeleopEvents.SUCCESS):
            events.append(TeleopEvent.SUCCESS)
        elif raw.get(TeleopEvents.RERECORD_EPISODE):
            events.append(TeleopEvent.RERECORD)
        elif raw.get(TeleopEvents.TERMINATE_EPISODE):
            events.append(TeleopEvent.FAILURE)
        return events

    def disconnect(self) -> None:
        self.device.disconnect()


def gamepad_teleop(config: GamepadConfig, robot) -> GamepadTeleop:
    return GamepadTeleop(tuple(robot.joint_names), config=config)
