"""The simulated cell as the jobs use it: the sim robot, the demonstrator, the task families."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robot_rl.core.errors import ConfigError
from robot_rl.hardware.sim.config import SimConfig
from robot_rl.hardware.sim.expert import ScriptedExpert
from robot_rl.hardware.sim.robot import SimSO101
from robot_rl.hardware.sim.tasks import TASK_FAMILIES

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


class NotASimRobotError(ConfigError):
    """A job that runs in the sim was given a real robot's config."""


def sim_config(cfg: RobotRLConfig) -> SimConfig:
    """``cfg.robot``, refused unless it is the sim (these jobs re-create scenes and score them)."""
    if not isinstance(cfg.robot, SimConfig):
        raise NotASimRobotError(f"this command runs in the sim; robot={type(cfg.robot).__name__} is not the sim "
                                "(use robot=sim_so101)")
    return cfg.robot


def make_sim(cfg: RobotRLConfig) -> Any:
    """The configured ``SimSO101``, connected."""
    robot = SimSO101(sim_config(cfg))
    robot.connect()
    return robot


def demo_expert(robot: Any, speed: float) -> Any:
    """The scripted expert as demonstrator, at ``speed`` (0..1] times its full joint (6 deg/tick)
    and Cartesian (12 mm/tick) rates."""
    return ScriptedExpert(robot, max_joint_step=6.0 * speed, cartesian_step=0.012 * speed, careful_step=0.006 * speed)


def task_families(cfg: RobotRLConfig) -> list[str]:
    """The root ``task_families``, checked against the sim's (null: every family)."""
    if cfg.task_families is None:
        return list(TASK_FAMILIES)
    unknown = [f for f in cfg.task_families if f not in TASK_FAMILIES]
    if unknown:
        raise ConfigError(f"task_families: unknown {unknown}; the sim has {list(TASK_FAMILIES)}")
    return list(cfg.task_families)
