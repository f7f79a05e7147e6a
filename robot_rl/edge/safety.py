"""Per-tick joint-delta clamp: the last line of defence before an action reaches the motors.

A position-controlled servo driven to a far target moves at full speed; a bad chunk,
a seam between two chunks or a jumpy teleop device would then jerk the arm. Bounding
the change of every joint target per tick bounds joint velocity (delta x fps).
"""

from __future__ import annotations

import numpy as np


class JointDeltaClamp:
    """Limit ``|target - previous target|`` per joint and per tick; ``None`` disables it."""

    def __init__(self, max_delta: float | list[float] | None, num_joints: int) -> None:
        if max_delta is None:
            self.limit = None
            return
        limit = np.broadcast_to(np.asarray(max_delta, dtype=np.float32), (num_joints,)).copy()
        if (limit <= 0).any() or not np.isfinite(limit).all():
            raise ValueError(f"max_joint_delta_per_tick must be finite and > 0 per joint, got {max_delta}")
        self.limit = limit

    def __call__(self, target: np.ndarray, previous: np.ndarray) -> np.ndarray:
        if self.limit is None:
            return target
        return (previous + np.clip(target - previous, -self.limit, self.limit)).astype(np.float32)
