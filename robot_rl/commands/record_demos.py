"""`robot-rl record-demos`: scripted-expert demonstrations (``robot_rl.app.record_demos``)."""

from __future__ import annotations

from robot_rl.config import load_config

HELP = """scripted-expert demonstrations in the sim, stored as a LeRobotDataset v3 in demos.dir (only
successful attempts; demos.episodes per task family).

  robot-rl record-demos
  robot-rl record-demos demos.episodes=30 task_families=[push,pick] demos.dir=/tmp/demos"""
GROUPS = ("robot", "demos", "seeds", "task_families")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl record-demos --help` answers without MuJoCo and LeRobot
    from robot_rl.app.record_demos import record_demos

    cfg = load_config(argv)
    summary = record_demos(cfg)
    for family, (ok, tries) in summary.per_family.items():
        print(f"  {family:8s} {ok}/{tries} successful demonstrations stored")
    print(f"stored {summary.stored} episodes ({summary.steps} steps) in {cfg.demos.dir}")
    return 0
