"""Run one scripted-expert episode, in virtual time (as fast as possible) or real time."""

from __future__ import annotations

from typing import Any

from robot_rl.core.clock import Clock
from robot_rl.hardware.sim.expert import ScriptedExpert
from robot_rl.hardware.sim.robot import SimSO101


def run_expert_episode(
    robot: SimSO101,
    expert: ScriptedExpert,
    seed: int,
    clock: Clock | None = None,
    family: str | None = None,
    color: str | None = None,
    max_steps: int | None = None,
    render: bool = False,
) -> dict[str, Any]:
    """Reset with ``seed`` and let the expert act until success or ``max_steps``.

    Without a clock (or with a virtual one) ticks run back to back. With a
    ``WallClock`` each tick waits for its slot at ``robot.fps``, as on a real arm.
    ``render`` also grabs camera images each tick (costs ~1 ms per camera).

    Returns ``success``, ``steps`` (ticks run), ``sim_time_s``, ``instruction``,
    ``family``, ``color`` and ``seed``.
    """
    if not robot.is_connected:
        robot.connect()
    instruction = robot.reset(seed=seed, family=family, color=color)
    expert.reset()
    limit = max_steps if max_steps is not None else robot.config.max_episode_steps
    period = 1.0 / robot.fps
    t0 = clock.now() if clock is not None else 0.0
    success = False
    steps = 0
    for tick in range(limit):
        if clock is not None:
            clock.sleep_until(t0 + tick * period)
        if render:
            robot.get_observation()
        robot.send_action(expert.act())
        steps = tick + 1
        if robot.is_success():
            success = True
            break
    return {
        "success": success,
        "steps": steps,
        "sim_time_s": robot.sim_time,
        "instruction": instruction,
        "family": robot.task.family,
        "color": robot.task.color,
        "seed": seed,
    }
