"""`robot-rl demo-sim`: the sim world with the scripted expert, one episode per task.

A quick look that the simulation, the tasks and the expert work on this machine,
with a progress bar and a per-family summary.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from robot_rl.config import load_config


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl demo-sim")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per (family, colour) shown")
    parser.add_argument("--realtime", action="store_true", help="tick at fps on the wall clock")
    args, overrides = parser.parse_known_args(argv)
    return run_sim_demo(load_config(overrides), args.episodes, args.realtime)


def run_sim_demo(cfg, episodes_per_family: int, realtime: bool = False) -> int:
    from robot_rl.hardware.sim import TASK_FAMILIES, ScriptedExpert
    from robot_rl.hardware.sim.episode import run_expert_episode
    from robot_rl.commands.sim_setup import make_sim
    from robot_rl.core.clock import WallClock

    robot = make_sim(cfg)
    expert = ScriptedExpert(robot)
    results: dict[str, list[dict]] = {f: [] for f in TASK_FAMILIES}
    jobs = [(f, i) for f in TASK_FAMILIES for i in range(episodes_per_family)]
    try:
        for family, i in tqdm(jobs, desc="sim + scripted expert"):
            clock = WallClock() if realtime else None
            outcome = run_expert_episode(robot, expert, seed=int(cfg.seed) + i, clock=clock, family=family)
            results[family].append(outcome)
    finally:
        robot.disconnect()
    table = Table(title="scripted expert in the MuJoCo SO-101 sim")
    for col in ("task family", "success", "mean steps", "example instruction"):
        table.add_column(col)
    for family, outcomes in results.items():
        ok = sum(bool(o["success"]) for o in outcomes)
        steps = sum(o["steps"] for o in outcomes) / max(len(outcomes), 1)
        table.add_row(family, f"{ok}/{len(outcomes)}", f"{steps:.0f}", outcomes[0].get("instruction", ""))
    Console().print(table)
    return 0
