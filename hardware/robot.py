"""The Robot protocol: what the edge runtime needs from any arm, real or simulated.

It mirrors LeRobot's ``Robot`` conventions (``observation_features``,
``action_features``, ``connect``/``disconnect``, SO-101 joints in degrees and the
gripper in 0..100) so that one policy runs unchanged in the sim and on a real SO-101.
Observations are split into camera images and one joint-state vector because the
policy, the recorder and the wire all treat them differently.
"""

from __future__ import annotations

from typing import Protocol, TypedDict, runtime_checkable

import numpy as np


class Observation(TypedDict):
    """One reading of the robot: uint8 HxWx3 images by camera name, float32 joint state."""

    images: dict[str, np.ndarray]
    state: np.ndarray


class InvalidActionError(ValueError):
    """An action that must never reach the motors (NaN, inf, wrong shape, wrong type)."""


@runtime_checkable
class Robot(Protocol):
    """An arm with position-controlled joints, cameras and a fixed control rate."""

    name: str
    fps: int
    joint_names: tuple[str, ...]
    camera_names: tuple[str, ...]

    @property
    def is_connected(self) -> bool: ...

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) of each joint in action units; send_action clips into it."""
        ...

    @property
    def observation_features(self) -> dict[str, type | tuple[int, ...]]:
        """LeRobot-style: ``{"shoulder_pan.pos": float, ..., "front": (H, W, 3)}``."""
        ...

    @property
    def action_features(self) -> dict[str, type]:
        """LeRobot-style: ``{"shoulder_pan.pos": float, ...}``."""
        ...

    def connect(self) -> None: ...

    def get_observation(self) -> Observation: ...

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Command joint targets; returns the action actually sent (clipped to limits).

        Raises InvalidActionError for NaN/inf or a wrong shape, leaving the robot untouched.
        """
        ...

    def disconnect(self) -> None: ...


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
