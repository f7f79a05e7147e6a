"""Per-tick joint-step bound: the last line of defence before an action reaches the motors.

A position-controlled servo driven to a far target moves at full speed; a bad chunk,
a seam between two chunks, the first tick of an episode (the plan starts where the policy
thinks the arm is, the arm may stand elsewhere), a takeover or a hand-back would then jerk
the arm. Bounding the change of every joint target per tick bounds joint velocity
(step x fps), whoever produced the target.

Two sources set the bound, and the tighter one wins per joint: the robot's own velocity
limit (``max_joint_velocity`` in its config, units per second, on by default for real
arms) divided by the tick rate, and the edge's ``max_joint_delta_per_tick`` (units per
tick; off by default).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _per_joint(value: Any, num_joints: int, name: str) -> np.ndarray:
    try:
        limit = np.broadcast_to(np.asarray(value, dtype=np.float32), (num_joints,)).copy()
    except ValueError as exc:
        raise ValueError(f"{name} needs one number or {num_joints} (one per joint), got {value}") from exc
    if (limit <= 0).any() or not np.isfinite(limit).all():
        raise ValueError(f"{name} must be finite and > 0 per joint, got {value}")
    return limit


def step_limit_per_tick(max_velocity: Any, fps: int, max_delta_per_tick: Any, num_joints: int) -> np.ndarray | None:
    """The per-tick bound of each joint: ``max_velocity / fps`` and ``max_delta_per_tick``, the
    tighter per joint; None when neither is set."""
    limits = []
    if max_velocity is not None:
        limits.append(_per_joint(max_velocity, num_joints, "max_joint_velocity") / float(fps))
    if max_delta_per_tick is not None:
        limits.append(_per_joint(max_delta_per_tick, num_joints, "max_joint_delta_per_tick"))
    if not limits:
        return None
    return np.minimum.reduce(limits).astype(np.float32)


class JointDeltaClamp:
    """Limit ``|target - previous target|`` per joint and per tick; ``None`` disables it."""

    def __init__(self, max_delta: Any, num_joints: int) -> None:
        self.limit = None if max_delta is None else _per_joint(max_delta, num_joints, "max_joint_delta_per_tick")

    def __call__(self, target: np.ndarray, previous: np.ndarray) -> np.ndarray:
        if self.limit is None:
            return target
        return (previous + np.clip(target - previous, -self.limit, self.limit)).astype(np.float32)

    def along(self, start: np.ndarray, points: list[np.ndarray]) -> list[np.ndarray]:
        """``points`` one tick apart, each clamped against the one before it (starting from
        ``start``): a whole planned trajectory that never moves a joint faster than the bound."""
        out, previous = [], np.asarray(start, dtype=np.float32)
        for point in points:
            previous = self(np.asarray(point, dtype=np.float32), previous)
            out.append(previous)
        return out
