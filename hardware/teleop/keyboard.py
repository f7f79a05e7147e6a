"""Keyboard jog as a Teleop: keys nudge one joint each, from the follower's current pose.

Meant for small corrections over SSH (no display needed): the session owns the terminal
and hands the keys of each tick to ``feed``. The bindings avoid the session's own keys
(space, s, f, r, e, q, n); they are shown on screen when the session starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.robot import Observation
from robot_rl.hardware.teleop.base import TeleopConfig, TeleopReading

# Pairs of keys (minus, plus), given to the robot's joints in order: j/l the first joint (an
# SO-101's shoulder_pan), i/k the second, and so on; the last pair, z/x, is always the gripper's
# when the robot has one. Chosen around the right hand's home row, clear of the session's keys.
JOG_KEY_PAIRS = (("j", "l"), ("i", "k"), ("u", "o"), ("y", "h"), ("m", "."), ("c", "v"), ("z", "x"))


def bindings_for(joint_names: tuple[str, ...]) -> dict[str, list]:
    """key -> [joint, direction] for these joints (``JOG_KEY_PAIRS``)."""
    gripper = next((j for j in joint_names if "gripper" in j), None)
    arm = [j for j in joint_names if j != gripper]
    pairs = JOG_KEY_PAIRS[:-1]
    if len(arm) > len(pairs):
        raise ValueError(f"keyboard jog has keys for {len(pairs)} arm joints, the robot has {len(arm)}; "
                         "give teleop.bindings")
    bindings = {}
    for joint, (minus, plus) in [*zip(arm, pairs, strict=False), *([(gripper, JOG_KEY_PAIRS[-1])] if gripper else [])]:
        bindings[minus], bindings[plus] = [joint, -1.0], [joint, 1.0]
    return bindings


@TELEOPS.register("keyboard", builder="robot_rl.hardware.teleop.keyboard:keyboard_teleop")
@dataclass
class KeyboardJogConfig(TeleopConfig):
    """key -> [joint, direction]; each press moves the joint by ``step`` (degrees / gripper units).
    ``bindings`` null: ``JOG_KEY_PAIRS`` over the robot's joints in order."""

    bindings: dict[str, list] | None = None
    step: float = 2.0


class KeyboardJogTeleop:
    name = "keyboard"

    def __init__(self, joint_names: tuple[str, ...], config: KeyboardJogConfig | None = None) -> None:
        self.joint_names = tuple(joint_names)
        self.config = config or KeyboardJogConfig()
        self.bindings = dict(self.config.bindings) if self.config.bindings else bindings_for(self.joint_names)
        unknown = sorted({j for j, _ in self.bindings.values()} - set(self.joint_names))
        if unknown:
            raise ValueError(f"keyboard bindings name joints {unknown} the robot does not have")
        self._keys: list[str] = []
        self._pose: np.ndarray | None = None

    def feed(self, keys: list[str]) -> None:
        """Keys pressed this tick (from the session's key source)."""
        self._keys.extend(k for k in keys if k in self.bindings)

    def key_help(self) -> str:
        """The jog keys, for the session's help line: ``jog (while you drive): j/l shoulder_pan ...``."""
        by_joint: dict[str, list[str]] = {}
        for key, (joint, _direction) in sorted(self.bindings.items(), key=lambda kv: kv[1][1]):
            by_joint.setdefault(joint, []).append(key)
        pairs = "  ".join(f"{'/'.join(keys)} {joint}" for joint, keys in by_joint.items())
        return f"jog (while you drive, {self.config.step:g} per press): {pairs}"

    def connect(self) -> None:
        pass

    def start_takeover(self, pose: np.ndarray) -> None:
        """Jog from where the follower is told to be, so the first press moves it by one step."""
        self._pose = np.asarray(pose, dtype=np.float32).copy()

    def read(self, observation: Observation) -> TeleopReading:
        if self._pose is None:
            self._pose = np.asarray(observation["state"], dtype=np.float32).copy()
        for key in self._keys:
            joint, direction = self.bindings[key]
            self._pose[self.joint_names.index(joint)] += float(direction) * self.config.step
        self._keys.clear()
        return TeleopReading(action=self._pose.copy())

    def disconnect(self) -> None:
        pass


def keyboard_teleop(config: KeyboardJogConfig, robot) -> KeyboardJogTeleop:
    return KeyboardJogTeleop(tuple(robot.joint_names), config=config)
