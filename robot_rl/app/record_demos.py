"""The configured demonstrations (``robot-rl record-demos``, and BC when ``demos.dir`` holds none):
the sim in a child process while this one writes (``robot_rl.app.demo_process``), or both here
(``robot_rl.app.demos``); the same dataset either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.app.demo_process import DemoJob, record_demos_in_child
from robot_rl.app.demos import DemoSummary, expert_attempts, store_demos
from robot_rl.app.sim import demo_expert, make_sim, sim_config, task_families
from robot_rl.core.errors import ConfigError
from robot_rl.core.layout import RecordedLayout

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def record_demos(cfg: RobotRLConfig, progress: bool = True) -> DemoSummary:
    """The configured demonstrations (``demos``, root ``task_families``) into ``demos.dir``: with
    ``demos.sim_process`` the sim runs in a child process while this one writes, else both here
    (the same dataset either way)."""
    families = task_families(cfg)
    seed = cfg.seed + cfg.seeds.demos
    if cfg.demos.sim_process:
        job = DemoJob(sim_config(cfg), cfg.demos.expert_speed, tuple(families), cfg.demos.episodes, seed,
                      cfg.seeds.stride, cfg.demos.noise_deg)
        summary = record_demos_in_child(job, cfg.demos.dir, progress=progress)
    else:
        robot = make_sim(cfg)
        try:
            attempts = expert_attempts(robot, demo_expert(robot, cfg.demos.expert_speed), families,
                                       cfg.demos.episodes, seed, cfg.seeds.stride, cfg.demos.noise_deg)
            summary = store_demos(attempts, RecordedLayout.of_robot(robot), cfg.demos.dir, families,
                                  cfg.demos.episodes, progress)
        finally:
            robot.disconnect()
    if summary.stored == 0:  # a dataset without episodes: nothing to train on, and LeRobot cannot read it
        raise ConfigError(f"the scripted expert solved none of its {summary.attempted} attempts within "
                          f"robot.max_episode_steps={sim_config(cfg).max_episode_steps}: no demonstration was "
                          f"stored in {cfg.demos.dir}; allow longer episodes")
    return summary
