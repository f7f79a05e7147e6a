"""`robot-rl record-demos`: scripted-expert demonstrations into a LeRobotDataset v3."""

from __future__ import annotations

from robot_rl.config import load_config


def main(argv: list[str]) -> int:
    from hardware.sim import TASK_FAMILIES
    from robot_rl.commands.sim_setup import demo_expert, make_sim, task_families
    from robot_rl.demos import record_expert_demos

    cfg = load_config(argv)
    robot = make_sim(cfg)
    try:
        summary = record_expert_demos(
            robot,
            demo_expert(robot, cfg.demos.get("expert_speed", 1.0)),
            cfg.demos.dir,
            task_families(cfg.demos.families, TASK_FAMILIES),
            int(cfg.demos.episodes_per_family),
            seed=int(cfg.seed),
        )
    finally:
        robot.disconnect()
    for family, (ok, tries) in summary.per_family.items():
        print(f"  {family:8s} {ok}/{tries} successful demonstrations stored")
    print(f"stored {summary.stored} episodes ({summary.steps} steps) in {cfg.demos.dir}")
    return 0
