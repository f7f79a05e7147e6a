"""MuJoCo SO-101 simulation: an arm on a table with coloured cubes and a bowl.

``SimSO101`` implements the ``robot_rl.hardware.robot.Robot`` protocol in LeRobot's SO-101
units; ``ScriptedExpert`` is an IK demonstrator over privileged state;
``run_expert_episode`` runs one expert episode in virtual or wall-clock time.
"""

import os

# Headless rendering: must be decided before mujoco is imported anywhere.
os.environ.setdefault("MUJOCO_GL", "egl")

from robot_rl.hardware.sim.config import SimConfig  # noqa: E402
from robot_rl.hardware.sim.episode import run_expert_episode  # noqa: E402
from robot_rl.hardware.sim.expert import ScriptedExpert  # noqa: E402
from robot_rl.hardware.sim.robot import SimSO101, SimState  # noqa: E402
from robot_rl.hardware.sim.tasks import TASK_COLORS, TASK_FAMILIES, TaskSpec  # noqa: E402

__all__ = [
    "TASK_COLORS",
    "TASK_FAMILIES",
    "ScriptedExpert",
    "SimConfig",
    "SimSO101",
    "SimState",
    "TaskSpec",
    "run_expert_episode",
]
