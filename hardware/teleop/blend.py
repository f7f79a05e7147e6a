"""TakeoverBlender: a takeover must never make the follower jump.

When a human takes over, the teleop pose (a leader arm held somewhere else, a scripted
expert's first target) can be far from where the follower is. A position servo told to
go there at once moves at full speed. So the commanded pose starts at the follower's
current commanded pose and moves towards the teleop pose along a linear ramp, and on top
of that no joint target may change by more than ``max_step_per_tick`` between two ticks
(a velocity bound: step x fps). After the ramp the command tracks the teleop pose, still
under the same per-tick bound, so a jumpy device cannot jerk the arm either.

The ramp lasts as long as covering the initial gap at half the per-tick bound takes, and
at most ``blend_time_s``: a device that starts where the follower is (a leader arm held at
the follower's pose, a scripted expert that steps from the last command) passes through
in a tick or two. A fixed ramp would hold such a device back for the whole blend time,
and those nearly still ticks are recorded as the human's correction: taught to the policy,
they say "freeze when things go wrong" (measured: the first 12 ticks of every takeover
moved at 0.1-0.5 deg/tick against 1.2-1.4 after).

Convergence: the command reaches the teleop pose after ``max(blend_ticks, ceil(gap /
max_step))`` ticks at the latest for a still teleop pose.
"""

from __future__ import annotations

import math

import numpy as np


class TakeoverBlender:
    """Ramp from the follower's pose to the teleop pose, bounded in time and per-tick step."""

    def __init__(self, fps: int, blend_time_s: float, max_step_per_tick: float | list[float]) -> None:
        """The two settings come from the device's ``TeleopConfig`` (their defaults live there)."""
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if blend_time_s < 0:
            raise ValueError(f"blend_time_s must be >= 0, got {blend_time_s}")
        step = np.asarray(max_step_per_tick, dtype=np.float32)
        if (step <= 0).any() or not np.isfinite(step).all():
            raise ValueError(f"max_step_per_tick must be finite and > 0, got {max_step_per_tick}")
        self.fps = fps
        self.blend_ticks = max(1, math.ceil(blend_time_s * fps))
        self.max_step = step
        self._start: np.ndarray | None = None
        self._last: np.ndarray | None = None
        self._tick = 0
        self._ramp_ticks = self.blend_ticks  # set from the gap at the first command of a takeover

    @property
    def active(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._last is not None

    @property
    def blending(self) -> bool:
        """True while the ramp is still running (the command is not yet the teleop pose)."""
        return self.active and self._tick < self._ramp_ticks

    def start(self, follower_pose: np.ndarray) -> None:
        """Begin a takeover from ``follower_pose`` (the follower's current commanded target)."""
        pose = np.asarray(follower_pose, dtype=np.float32).copy()
        if not np.isfinite(pose).all():
            raise ValueError("follower pose has NaN/inf; cannot start a takeover from it")
        self._start = pose
        self._last = pose.copy()
        self._tick = 0

    def ramp_ticks_for(self, gap: np.ndarray) -> int:
        """Ticks to cover ``gap`` at half the per-tick bound, between 1 and ``blend_ticks``."""
        ticks = np.ceil(2.0 * np.abs(np.asarray(gap, dtype=np.float64)) / self.max_step)
        return int(np.clip(ticks.max(initial=1.0), 1, self.blend_ticks))

    def stop(self) -> None:
        self._start = None
        self._last = None

    def __call__(self, teleop_pose: np.ndarray) -> np.ndarray:
        """The command for this tick, given the teleop pose now."""
        if self._start is None or self._last is None:
            raise RuntimeError("TakeoverBlender.start(follower_pose) must be called before blending")
        target = np.asarray(teleop_pose, dtype=np.float32)
        if self._tick == 0:
            self._ramp_ticks = self.ramp_ticks_for(target - self._start)
        self._tick += 1
        alpha = min(1.0, self._tick / self._ramp_ticks)
        ramp = (1.0 - alpha) * self._start + alpha * target
        step = np.clip(ramp - self._last, -self.max_step, self.max_step)
        self._last = (self._last + step).astype(np.float32)
        return self._last.copy()
