"""`robot-rl demo-sim`: the sim with the scripted expert (``robot_rl.app.sim_demo``)."""

from __future__ import annotations

from robot_rl.config import load_config

HELP = """the MuJoCo SO-101 sim with the scripted expert, demo_sim.episodes episodes of every task
family, and a table of successes: the first check of a new install (seconds).

  robot-rl demo-sim
  robot-rl demo-sim demo_sim.episodes=1 demo_sim.realtime=true"""
GROUPS = ("robot", "demo_sim")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl demo-sim --help` answers without MuJoCo
    from robot_rl.app.sim_demo import run_sim_demo

    results = run_sim_demo(load_config(argv))
    # An expert that solves nothing means a broken install (physics, rendering), not bad luck.
    return 0 if any(o["success"] for outcomes in results.values() for o in outcomes) else 1
