"""Closed-loop evaluation of a ChunkPolicy in the sim, through the real EdgeNode.

Everything that is evaluated runs the same control path a robot runs (action queue,
roll-forward, splice, clamps); only the clock is virtual, so a 2-core CPU evaluates a
policy as if it ran at a given inference latency, exactly and reproducibly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from robot_rl.core.clock import VirtualClock
from robot_rl.core.types import Episode
from robot_rl.edge import EdgeConfig, EdgeNode


@dataclass
class EvalResult:
    episodes: list[Episode]
    success_rate: float
    ci95: tuple[float, float]
    completion_s: float  # mean time to success over successful episodes (nan if none)
    stall_s_per_episode: float
    late_tick_frac: float
    per_family: dict[str, float]

    def as_dict(self) -> dict:
        return {
            "success": self.success_rate,
            "ci95": list(self.ci95),
            "completion_s": self.completion_s,
            "stall_s_per_episode": self.stall_s_per_episode,
            "late_tick_frac": self.late_tick_frac,
            "per_family": self.per_family,
            "episodes": len(self.episodes),
        }


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval: honest at small n and at 0 % or 100 %."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@contextmanager
def episode_noise(policy, seed: int) -> Iterator[None]:
    """Seed the policy's sampling noise for one episode (if it has ``reseed_noise``), then
    return it to fresh noise: the episode is reproducible, and policies compared on the
    same seeds meet the same noise."""
    reseed = getattr(policy, "reseed_noise", None)
    if reseed is None:
        yield
        return
    reseed(seed)
    try:
        yield
    finally:
        reseed(None)


def run_sim_episode(
    robot,
    policy,
    edge_config: EdgeConfig,
    seed: int,
    family: str | None = None,
    episode_id: int = 0,
    on_tick: Callable | None = None,
    max_steps: int | None = None,
    policy_version: int = 0,
) -> tuple[Episode, EdgeNode]:
    """Reset the sim to ``seed`` and run one closed-loop episode on a fresh virtual clock
    (the policy's noise seeded with ``seed``, see ``episode_noise``)."""
    instruction = robot.reset(seed=seed, family=family)
    config = replace(edge_config, fps=robot.fps, latency_seed=edge_config.latency_seed + seed)
    node = EdgeNode(robot, policy, VirtualClock(), config, task=robot, on_tick=on_tick, policy_version=policy_version)
    with episode_noise(policy, seed), node:
        episode = node.run_episode(
            max_steps or robot.config.max_episode_steps,
            instruction,
            episode_id=episode_id,
            seed=seed,
            task_family=robot.task.family,
        )
    return episode, node


def evaluate_policy(
    robot,
    policy,
    edge_config: EdgeConfig,
    seeds: Sequence[int],
    families: Sequence[str] | None = None,
    progress: bool = True,
    desc: str = "evaluating",
) -> EvalResult:
    """Success rate (Wilson 95 % CI), completion time and stalls over seeded episodes.

    Families rotate over the seeds so every family gets an equal share.
    """
    episodes: list[Episode] = []
    stall_ticks = late_ticks = total_ticks = 0
    for i, seed in enumerate(tqdm(seeds, desc=desc, disable=not progress, leave=False)):
        family = families[i % len(families)] if families else None
        episode, node = run_sim_episode(robot, policy, edge_config, seed, family, episode_id=i)
        episodes.append(episode)
        stall_ticks += episode.stall_steps
        late_ticks += node.stats.late_ticks
        total_ticks += episode.num_steps
    return summarize(episodes, robot.fps, stall_ticks, late_ticks, total_ticks)


def summarize(episodes: list[Episode], fps: int, stall_ticks: int, late_ticks: int, total_ticks: int) -> EvalResult:
    successes = [e for e in episodes if e.success]
    completion = [_first_success_tick(e) / fps for e in successes]
    families = sorted({e.task_family for e in episodes})
    per_family = {
        f: float(np.mean([e.success for e in episodes if e.task_family == f])) for f in families
    }
    n = len(episodes)
    return EvalResult(
        episodes=episodes,
        success_rate=len(successes) / n if n else 0.0,
        ci95=wilson_interval(len(successes), n),
        completion_s=float(np.mean(completion)) if completion else float("nan"),
        stall_s_per_episode=stall_ticks / fps / n if n else 0.0,
        late_tick_frac=late_ticks / total_ticks if total_ticks else 0.0,
        per_family=per_family,
    )


def _first_success_tick(episode: Episode) -> int:
    for i, step in enumerate(episode.steps):
        if step.success:
            return i + 1
    return episode.num_steps
