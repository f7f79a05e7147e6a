"""Reaction latency: how long after the world changes do the executed actions respond?

Method (counterfactual, exact on the virtual clock): run the same seeded episode twice
with the policy's noise seeded per episode (``app.evaluation.run_scene_episode``), once with
the target cube moved at tick ``t_m`` and once without. Both runs are identical until the policy's chunks start to
reflect the new image. The reaction tick is the first tick at which the commanded
end-effector positions (forward kinematics of the executed actions) of the two runs
differ by more than ``threshold_m`` *in the direction of the move*: that is when the
robot starts heading for the new target. Until the policy sees the change the twin runs
are bit-identical (same seed, same noise), so the threshold only has to exceed float
noise: 2 mm, a fraction of one tick's travel, so the measure adds (almost) no time of
its own to the policy's reaction. Physics limits it from below: no policy can
react faster than one inference plus one tick.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_rl.core.types import Episode


@dataclass
class ReactionMeasurement:
    reaction_s: float  # nan if the runs never diverged towards the new target
    perturb_tick: int
    reaction_tick: int | None


def commanded_ee(robot, episode: Episode) -> np.ndarray:
    """World positions the executed joint commands put the gripper at, one per tick."""
    return np.stack([robot.forward_kinematics(step.action) for step in episode.steps])


def reaction_time(
    ee_moved: np.ndarray,
    ee_baseline: np.ndarray,
    move_direction: np.ndarray,
    perturb_tick: int,
    fps: int,
    threshold_m: float = 0.002,
) -> ReactionMeasurement:
    """First tick after ``perturb_tick`` whose commanded EE moved ``threshold_m`` towards the new target."""
    direction = np.asarray(move_direction, dtype=np.float64)
    norm = np.linalg.norm(direction[:2])
    if norm == 0:
        raise ValueError("the target did not move; no reaction can be measured")
    unit = np.zeros(3)
    unit[:2] = direction[:2] / norm  # horizontal: heights of old and new target are equal
    n = min(len(ee_moved), len(ee_baseline))
    for tick in range(perturb_tick, n):
        if float((ee_moved[tick] - ee_baseline[tick]) @ unit) > threshold_m:
            # The action at `tick` is executed during tick `tick`: it took (tick - t_m + 1) ticks.
            return ReactionMeasurement((tick - perturb_tick + 1) / fps, perturb_tick, tick)
    return ReactionMeasurement(float("nan"), perturb_tick, None)
