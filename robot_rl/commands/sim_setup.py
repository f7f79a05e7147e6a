"""Build the configured sim robot, expert and policy from a composed Hydra config."""

from __future__ import annotations

from omegaconf import DictConfig

from robot_rl.config import ConfigError, to_dataclass


def check_sim_robot(cfg: DictConfig) -> None:
    """Refuse a real robot's config in a command that runs in the sim."""
    if cfg.robot.get("name", "sim_so101") != "sim_so101":
        raise ConfigError(f"this command runs in the sim; robot={cfg.robot.name} is not a sim robot (use robot=sim_so101)")


def make_sim(cfg: DictConfig):
    from robot_rl.hardware.sim import SimConfig, SimSO101

    check_sim_robot(cfg)
    robot = SimSO101(to_dataclass(cfg.robot, SimConfig))
    robot.connect()
    return robot


def check_expert_speed(speed) -> float:
    """``demos.expert_speed``, checked: a fraction of the expert's full rates, in (0, 1]."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed <= 1:
        raise ConfigError(f"demos.expert_speed must be in (0, 1], got {speed!r}")
    return float(speed)


def demo_expert(robot, speed: float):
    """The scripted expert as demonstrator, at ``speed`` times its full joint and Cartesian rates."""
    from robot_rl.hardware.sim import ScriptedExpert

    speed = check_expert_speed(speed)
    return ScriptedExpert(robot, max_joint_step=6.0 * speed, cartesian_step=0.012 * speed, careful_step=0.006 * speed)


def task_families(cfg_families, robot_module_families: tuple[str, ...]) -> list[str]:
    if cfg_families is None:
        return list(robot_module_families)
    unknown = [f for f in cfg_families if f not in robot_module_families]
    if unknown:
        raise ConfigError(f"unknown task families {unknown}; the sim has {list(robot_module_families)}")
    return list(cfg_families)
