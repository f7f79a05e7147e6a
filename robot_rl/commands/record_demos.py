"""`robot-rl record-demos`: scripted-expert demonstrations into a LeRobotDataset v3."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from robot_rl.config import ConfigError, load_config


def main(argv: list[str]) -> int:
    cfg = load_config(argv)
    summary = record_demos(cfg)
    for family, (ok, tries) in summary.per_family.items():
        print(f"  {family:8s} {ok}/{tries} successful demonstrations stored")
    print(f"stored {summary.stored} episodes ({summary.steps} steps) in {cfg.demos.dir}")
    return 0


def record_demos(cfg: DictConfig, progress: bool = True):
    """The configured demonstrations into ``demos.dir``: with ``demos.sim_process`` (default) the
    sim runs in a child process while this one writes, else both here (the same dataset either way)."""
    from robot_rl.hardware.sim import TASK_FAMILIES
    from robot_rl.commands.sim_setup import check_expert_speed, check_sim_robot, demo_expert, make_sim, task_families
    from robot_rl.demos import record_expert_demos

    families = task_families(cfg.demos.families, TASK_FAMILIES)
    speed = check_expert_speed(cfg.demos.get("expert_speed", 1.0))
    per_family, seed = int(cfg.demos.episodes_per_family), int(cfg.seed)
    in_child = cfg.demos.get("sim_process", True)
    if not isinstance(in_child, bool):
        raise ConfigError(f"demos.sim_process must be true or false, got {in_child!r}")
    if in_child:
        from robot_rl.demo_process import DemoJob, record_demos_in_child

        check_sim_robot(cfg)
        job = DemoJob(OmegaConf.to_container(cfg.robot, resolve=True), speed, tuple(families), per_family, seed)
        return record_demos_in_child(job, cfg.demos.dir, progress=progress)
    robot = make_sim(cfg)
    try:
        return record_expert_demos(robot, demo_expert(robot, speed), cfg.demos.dir, families, per_family,
                                   seed=seed, progress=progress)
    finally:
        robot.disconnect()
