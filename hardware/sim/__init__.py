"""MuJoCo SO-101 simulation: an arm on a table with coloured cubes and a bowl.

``SimSO101`` implements the ``robot_rl.hardware.robot.Robot`` protocol in LeRobot's SO-101
units; ``ScriptedExpert`` is an IK demonstrator over privileged state;
``run_expert_episode`` runs one expert episode in virtual or wall-clock time.
"""

import os

# Headless rendering: must be decided before mujoco is imported anywhere.
os.environ.setdefault("MUJOCO_GL", "egl")

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.hardware.sim.config import SimConfig
    from robot_rl.hardware.sim.episode import run_expert_episode
    from robot_rl.hardware.sim.expert import ScriptedExpert
    from robot_rl.hardware.sim.robot import SimSO101, SimState
    from robot_rl.hardware.sim.tasks import TASK_COLORS, TASK_FAMILIES, TaskSpec

# Exported lazily, so that reading a config that names the sim (hardware.sim.config) imports no MuJoCo.
_EXPORTS = {
    "SimConfig": "config",
    "run_expert_episode": "episode",
    "ScriptedExpert": "expert",
    "SimSO101": "robot",
    "SimState": "robot",
    "TASK_COLORS": "tasks",
    "TASK_FAMILIES": "tasks",
    "TaskSpec": "tasks",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


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
