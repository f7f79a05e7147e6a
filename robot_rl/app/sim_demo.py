"""``robot-rl demo-sim``: the sim world with the scripted expert, a few episodes per task family.

A quick look that the simulation, the tasks and the expert work on this machine (the first
thing a new install runs), with a progress bar and a table of successes per family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from robot_rl.app.sim import make_sim
from robot_rl.core.clock import WallClock
from robot_rl.hardware.sim.episode import run_expert_episode
from robot_rl.hardware.sim.expert import ScriptedExpert
from robot_rl.hardware.sim.tasks import TASK_FAMILIES

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig


def run_sim_demo(cfg: RobotRLConfig) -> dict[str, list[dict]]:
    """``demo_sim.episodes`` expert episodes of every family; prints the table, returns the outcomes."""
    robot = make_sim(cfg)
    expert = ScriptedExpert(robot)
    results: dict[str, list[dict]] = {f: [] for f in TASK_FAMILIES}
    jobs = [(f, i) for f in TASK_FAMILIES for i in range(cfg.demo_sim.episodes)]
    try:
        for family, i in tqdm(jobs, desc="sim + scripted expert"):
            clock = WallClock() if cfg.demo_sim.realtime else None
            results[family].append(run_expert_episode(robot, expert, seed=cfg.seed + i, clock=clock, family=family))
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
    return results
