"""Put the sim where a logged episode started.

Best case, the episode's sim seed is known (a recording from our sim carries it, or the
user passes it): ``reset(seed, family, colour)`` re-creates the whole scene, cubes
included, and physics then matches the recording exactly. Otherwise the arm is placed
at the first logged joint state in a scene drawn from a fallback seed: the arm's motion
is reproduced, contacts with objects are not (they are somewhere else).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from robot_rl.hardware.sim.rendering import mujoco
from robot_rl.hardware.sim.so101_package import gripper as gripper_units
from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS, TASK_COLORS, TASK_FAMILIES, make_task

log = logging.getLogger(__name__)

# Try this many consecutive seeds to find one whose task matches a logged instruction
# (a push direction is drawn from the seed, so about every other seed fits).
MAX_TASK_SEED_TRIES = 64


@dataclass(frozen=True)
class Scene:
    """Where an episode starts: a seed (scene re-created) and/or a first joint state (sim units).

    ``family`` picks the task family (pick/push/place) of a seeded scene that has no
    instruction; a logged instruction, when there is one, decides instead.
    """

    seed: int | None
    instruction: str = ""
    initial_state: np.ndarray | None = None
    family: str | None = None

    @property
    def recreated(self) -> bool:
        return self.seed is not None


def task_of_instruction(instruction: str) -> tuple[str, str] | None:
    """(family, colour) of a sim instruction, or None if it is not one of the sim's tasks."""
    text = instruction.strip().lower()
    for family in TASK_FAMILIES:
        for color in TASK_COLORS:
            for direction in PUSH_DIRECTIONS if family == "push" else (None,):
                if make_task(family, color, direction).instruction == text:
                    return family, color
    return None


def apply_scene(robot, scene: Scene, fallback_seed: int = 0) -> str:
    """Reset ``robot`` (a SimSO101) to ``scene``; returns the instruction in force."""
    task = task_of_instruction(scene.instruction) if scene.instruction else None
    family, color = task if task else (scene.family, None)
    if scene.seed is not None:
        instruction = robot.reset(seed=scene.seed, family=family, color=color)
        _warn_if_start_differs(robot, scene)
        return instruction
    instruction = _reset_matching_task(robot, scene.instruction, family, color, fallback_seed)
    if scene.initial_state is not None:
        place_arm(robot, scene.initial_state)
    return instruction


def place_arm(robot, joints: np.ndarray) -> None:
    """Set the arm's joints (sim units) at rest, servos holding there; the scene stays as it is."""
    lower, upper = robot.joint_limits
    target = np.clip(np.asarray(joints, dtype=np.float64), lower, upper)
    ids = robot.ids
    gripper_range = robot.model.actuator_ctrlrange[ids.actuators][-1]
    arm = np.deg2rad(target[:5])
    grip = gripper_units.normalized_to_ctrl(float(target[5]) / 100.0, gripper_range)
    robot.data.qpos[ids.arm_qpos] = arm
    robot.data.qpos[ids.gripper_qpos] = grip
    robot.data.qvel[:] = 0.0
    robot.data.ctrl[ids.actuators] = np.append(arm, grip)
    mujoco.mj_forward(robot.model, robot.data)


def _reset_matching_task(robot, instruction: str, family: str | None, color: str | None, seed: int) -> str:
    """Reset from ``seed`` onwards until the drawn task is the logged one (push direction)."""
    if family is None:
        return robot.reset(seed=seed)
    for candidate in range(seed, seed + MAX_TASK_SEED_TRIES):
        got = robot.reset(seed=candidate, family=family, color=color)
        if got == instruction.strip().lower():
            return got
    return got


def _warn_if_start_differs(robot, scene: Scene, tolerance_deg: float = 0.5) -> None:
    if scene.initial_state is None:
        return
    gap = float(np.max(np.abs(robot.joint_state() - scene.initial_state)))
    if gap > tolerance_deg:
        log.warning(
            "seed %s puts the arm %.2f deg away from the logged first state; is it the episode's seed?", scene.seed, gap
        )
