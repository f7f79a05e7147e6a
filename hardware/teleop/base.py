"""The Teleop protocol: what every teleoperation device gives the edge, once per control tick.

A device yields two things: an action (the joint target the operator is commanding, in the
robot's units: degrees, gripper 0..100) and events (take over, hand back, success, failure,
rerecord, e-stop). Whether the human is driving is decided by the events, not by the device
having an action: a leader arm always has a pose, but the operator only drives after
pressing "take over". Keeping the two apart lets a keyboard supply the events while a
leader arm supplies the pose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from robot_rl.core.registry import TELEOPS
from robot_rl.hardware.robot import Observation


class TeleopEvent(StrEnum):
    """Things an operator can say during an episode."""

    TAKE_OVER = "take_over"  # the human starts driving
    HAND_BACK = "hand_back"  # the policy drives again, from a fresh chunk
    SUCCESS = "success"  # end the episode, it succeeded
    FAILURE = "failure"  # end the episode, it failed
    RERECORD = "rerecord"  # end the episode and throw it away (reset went wrong, ...)
    ESTOP = "estop"  # stop now: hold the arm, save what was recorded, end the session


# Events that end the current episode.
EPISODE_ENDING = frozenset({TeleopEvent.SUCCESS, TeleopEvent.FAILURE, TeleopEvent.RERECORD, TeleopEvent.ESTOP})


@dataclass
class TeleopReading:
    """One tick of a teleop device: the commanded joint target (None: none) and new events."""

    action: np.ndarray | None = None
    events: list[TeleopEvent] = field(default_factory=list)


@runtime_checkable
class Teleop(Protocol):
    """A teleoperation device, read once per control tick by the control thread.

    ``read`` must not block for long (a few ms at most): it runs inside the 1/fps tick.
    Devices that command relative motion (jog) may also define ``start_takeover(pose)``,
    called with the follower's commanded pose when a takeover starts.
    """

    name: str

    def connect(self) -> None: ...

    def read(self, observation: Observation) -> TeleopReading: ...

    def disconnect(self) -> None: ...


@dataclass
class TeleopConfig:
    """What every teleop device's config has: how its takeovers are blended into the follower's
    commands (``hardware.teleop.blend``). ``teleop=NAME`` chooses the device; its config adds its own fields."""

    blend_time_s: float = 0.5  # a takeover eases from the policy's target to the operator's over this long
    max_step_per_tick: float = 3.0  # degrees (gripper units) per tick while blending: 90 deg/s at 30 Hz

    def __post_init__(self) -> None:
        if self.blend_time_s < 0 or self.max_step_per_tick <= 0:
            raise ValueError(f"teleop: blend_time_s must be >= 0 and max_step_per_tick > 0, got "
                             f"{self.blend_time_s}, {self.max_step_per_tick}")


@TELEOPS.register("none", builder="robot_rl.hardware.teleop.base:null_teleop")
@dataclass
class NoTeleopConfig(TeleopConfig):
    """No device: the policy always drives; the session's keys still give verdicts and the e-stop."""


def null_teleop(config: NoTeleopConfig, robot: object) -> NullTeleop:
    return NullTeleop()


class NullTeleop:
    """No device: the policy always drives; events come only from the session's keys."""

    name = "none"

    def connect(self) -> None:
        pass

    def read(self, observation: Observation) -> TeleopReading:
        return TeleopReading()

    def disconnect(self) -> None:
        pass
