"""What crosses the robot boundary: observations, actions and their validation.

These live in ``robot_rl.core`` (which imports nothing of the project) so that every robot
backend — the sim and LeRobot robots in ``hardware``, ROS 2 arms in ``robot_rl.bridges.ros2`` — checks
actions the same way without one backend package importing another.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

POSITION_SUFFIX = ".pos"  # LeRobot's robots name a joint's position "shoulder_pan.pos"


def joint_base_name(name: str) -> str:
    """A joint's name without LeRobot's position suffix: "shoulder_pan.pos" and "shoulder_pan" are one joint."""
    return name.removesuffix(POSITION_SUFFIX)


class Observation(TypedDict):
    """One reading of the robot: uint8 HxWx3 images by camera name, float32 joint state."""

    images: dict[str, np.ndarray]
    state: np.ndarray


class RobotFaultError(RuntimeError):
    """The robot cannot be driven safely any more: its driver fell silent, its state is too old,
    its bus stopped answering. The session stops the episode in a controlled way (hold, then the
    e-stop path) and saves what was recorded as aborted."""


class InvalidActionError(ValueError):
    """An action that must never reach the motors (NaN, inf, wrong shape, wrong type)."""


def validate_action(action: object, joint_names: tuple[str, ...]) -> np.ndarray:
    """Return ``action`` as float32[len(joint_names)] or raise InvalidActionError saying why."""
    try:
        arr = np.asarray(action, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidActionError(f"action is not numeric: {exc}") from exc
    expected = (len(joint_names),)
    if arr.shape != expected:
        raise InvalidActionError(
            f"action has shape {arr.shape}, expected {expected} for joints {list(joint_names)}"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        names = [joint_names[i] for i in np.flatnonzero(bad)]
        raise InvalidActionError(f"action has NaN/inf for joints {names}; nothing was sent")
    return arr


def features_for(joint_names: tuple[str, ...], cameras: dict[str, tuple[int, int]]) -> tuple[dict, dict]:
    """LeRobot-style (observation_features, action_features) for joints and cameras (name -> (H, W))."""
    action = {f"{j}.pos": float for j in joint_names}
    obs: dict[str, type | tuple[int, ...]] = dict(action)
    for cam, (h, w) in cameras.items():
        obs[cam] = (h, w, 3)
    return obs, action
