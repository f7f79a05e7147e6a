"""Keyboard jog as a Teleop: keys nudge one joint each, from the follower's current pose.

Meant for small corrections over SSH (no display needed): the session owns the terminal
and hands the keys of each tick to ``feed``. The bindings avoid the session's own keys
(space, s, f, r, e, q, n).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import TeleopConfig, TeleopReading


def _default_bindings() -> dict[str, list]:
    return {
        "j": ["shoulder_pan", -1.0], "l": ["shoulder_pan", 1.0],
        "i": ["shoulder_lift", -1.0], "k": ["shoulder_lift", 1.0],
        "u": ["elbow_flex", -1.0], "o": ["elbow_flex", 1.0],
        "y": ["wrist_flex", -1.0], "h": ["wrist_flex", 1.0],
        "m": ["wrist_roll", -1.0], ".": ["wrist_roll", 1.0],
        "z": ["gripper", -1.0], "x": ["gripper", 1.0],
    }  # fmt: skip


@TELEOPS.register("keyboard", builder="robot_rl.hardware.teleop.keyboard:keyboard_teleop")
@dataclass
class KeyboardJogConfig(TeleopConfig):
    """key -> [joint, direction]; each press moves the joint by ``step`` (degrees / gripper units)."""

    bindings: dict[str, list] = field(default_factory=_default_bindings)
    step: float = 2.0


class KeyboardJogTeleop:
    name = "keyboard"

    def __init__(self, joint_names: tuple[str, ...], config: KeyboardJogConfig | None = None) -> None:
        self.joint_names = tuple(joint_names)
        self.config = config or KeyboardJogConfig()
        unknown = sorted({j for j, _ in self.config.bindings.values()} - set(self.joint_names))
        if unknown:
            raise ValueError(f"keyboard bindings name joints {unknown} the robot does not have")
        self._keys: list[str] = []
        self._pose: np.ndarray | None = None

    def feed(self, keys: list[str]) -> None:
        """Keys pressed this tick (from the session's key source)."""
        self._keys.extend(k for k in keys if k in self.config.bindings)

    def connect(self) -> None:
        pass

    def start_takeover(self, pose: np.ndarray) -> None:
        """Jog from where the follower is told to be, so the first press moves it by one step."""
        self._pose = np.asarray(pose, dtype=np.float32).copy()

    def read(self, observation: Observation) -> TeleopReading:
        if self._pose is None:
            self._pose = np.asarray(observation["state"], dtype=np.float32).copy()
        for key in self._keys:
            joint, direction = self.config.bindings[key]
            self._pose[self.joint_names.index(joint)] += float(direction) * self.config.step
        self._keys.clear()
        return TeleopReading(action=self._pose.copy())

    def disconnect(self) -> None:
        pass


def keyboard_teleop(config: KeyboardJogConfig, robot) -> KeyboardJogTeleop:
    return KeyboardJogTeleop(tuple(robot.joint_names), config=config)
