"""The Robot protocol: what the edge runtime needs from any arm, real or simulated.

It mirrors LeRobot's ``Robot`` conventions (``observation_features``,
``action_features``, ``connect``/``disconnect``, SO-101 joints in degrees and the
gripper in 0..100) so that one policy runs unchanged in the sim and on a real SO-101.
Observations are split into camera images and one joint-state vector because the
policy, the recorder and the wire all treat them differently.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

# Re-exported: backends import these from here or from robot_rl.core.
from robot_rl.core.robot_io import InvalidActionError, Observation, RobotFaultError, features_for, validate_action

__all__ = ["InvalidActionError", "Observation", "Robot", "RobotFaultError", "features_for", "validate_action"]


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

    # Optional: ``simulated`` (True for a simulation, whose loop the edge never runs under SCHED_FIFO).
    # Optional: ``max_joint_velocity`` (action units per second, one number or one per joint).
    # The edge bounds every commanded target by it; a robot without it (the sim) is bounded only
    # by ``edge.max_joint_delta_per_tick``.

    def connect(self) -> None: ...

    def get_observation(self) -> Observation:
        """The newest reading. Raises RobotFaultError when the robot cannot be read (silent driver,
        state too old, bus down): the session then stops the episode in a controlled way."""
        ...

    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Command joint targets; returns the action actually sent (clipped to limits).

        Raises InvalidActionError for NaN/inf or a wrong shape, leaving the robot untouched.
        """
        ...

    def disconnect(self) -> None: ...
