"""Closed-loop evaluation of one or more checkpoints on the same starting scenes.

Every policy runs through the real EdgeNode (action queue, roll-forward, splice,
simulated inference latency from the edge config) on a virtual clock. All policies of
one run start from the very same scenes (seeds, or initial scenes taken from a dataset),
so their success rates compare pairwise rather than across different luck.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tqdm import tqdm

from robot_rl.core.clock import VirtualClock
from robot_rl.core.types import Episode
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.evaluation import EvalResult, episode_noise, summarize, wilson_interval
from robot_rl.replay.dataset import DatasetError, LoggedDataset
from robot_rl.replay.joint_mapping import JointMapping, build_mapper
from robot_rl.replay.scenes import Scene, apply_scene, task_of_instruction

# Builds the intervention callable of one episode (e.g. a simulated operator), or None.
InterventionFactory = Callable[[int], Callable | None]


@dataclass
class PolicyEval:
    """One checkpoint's results over the shared scenes."""

    name: str
    result: EvalResult
    intervention_free_rate: float  # episodes in which nobody took over
    intervention_free_success: float  # succeeded with nobody taking over
    intervention_free_ci95: tuple[float, float]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            **self.result.as_dict(),
            "intervention_free_rate": self.intervention_free_rate,
            "intervention_free_success": self.intervention_free_success,
            "intervention_free_ci95": list(self.intervention_free_ci95),
            "per_episode_success": [bool(e.success) for e in self.result.episodes],
        }


def seed_scenes(n: int, first_seed: int, families: Sequence[str] | None = None) -> list[Scene]:
    """Scenes from seeds first_seed.. ; with ``families`` the task family rotates over them in order
    (as in ``robot_rl.evaluation.evaluate_policy``), else each seed draws its own family."""
    return [Scene(seed=first_seed + i, family=families[i % len(families)] if families else None) for i in range(n)]


def dataset_scenes(dataset: LoggedDataset, mapping: JointMapping, sim_joints: tuple[str, ...]) -> list[Scene]:
    """The starting scene of each loaded episode: its seed if known, its instruction and first state."""
    mapper = build_mapper(mapping, dataset.state_names, sim_joints)
    scenes = []
    for episode in dataset.episodes:
        if task_of_instruction(episode.instruction) is None:
            raise DatasetError(
                f"episode {episode.index} of {dataset.source} asks {episode.instruction!r}, which is not a sim task; "
                "closed-loop eval judges success with the sim's tasks (pick/push/place a coloured cube)"
            )
        scenes.append(Scene(episode.seed, episode.instruction, mapper.to_sim(episode.state[0])))
    return scenes


def run_scene_episode(
    robot,
    policy,
    edge_config: EdgeConfig,
    scene: Scene,
    episode_id: int,
    max_steps: int | None = None,
    intervention: Callable | None = None,
    fallback_seed: int = 0,
) -> tuple[Episode, EdgeNode]:
    """One closed-loop episode from ``scene`` on a fresh virtual clock."""
    instruction = apply_scene(robot, scene, fallback_seed=fallback_seed + episode_id)
    seed = scene.seed if scene.seed is not None else fallback_seed + episode_id
    config = replace(edge_config, fps=robot.fps, latency_seed=edge_config.latency_seed + seed)
    node = EdgeNode(robot, policy, VirtualClock(), config, task=robot, intervention=intervention)
    with episode_noise(policy, seed), node:
        episode = node.run_episode(
            max_steps or robot.config.max_episode_steps,
            instruction,
            episode_id=episode_id,
            seed=scene.seed,
            task_family=robot.task.family,
        )
    return episode, node


def evaluate_on_scenes(
    robot,
    policy,
    edge_config: EdgeConfig,
    scenes: Sequence[Scene],
    name: str = "policy",
    *,
    max_steps: int | None = None,
    intervention_factory: InterventionFactory | None = None,
    fallback_seed: int = 0,
    progress: bool = True,
) -> PolicyEval:
    """Success (Wilson 95 % CI), completion time, stalls and intervention-free rate over ``scenes``."""
    episodes: list[Episode] = []
    stall_ticks = late_ticks = total_ticks = 0
    for i, scene in enumerate(tqdm(scenes, desc=f"evaluating {name}", disable=not progress, leave=False)):
        intervention = intervention_factory(i) if intervention_factory else None
        episode, node = run_scene_episode(robot, policy, edge_config, scene, i, max_steps, intervention, fallback_seed)
        episodes.append(episode)
        stall_ticks += episode.stall_steps
        late_ticks += node.stats.late_ticks
        total_ticks += episode.num_steps
    result = summarize(episodes, robot.fps, stall_ticks, late_ticks, total_ticks)
    n = len(episodes)
    clean = [e for e in episodes if e.intervention_steps == 0]
    clean_successes = sum(1 for e in clean if e.success)
    return PolicyEval(
        name=name,
        result=result,
        intervention_free_rate=len(clean) / n if n else 0.0,
        intervention_free_success=clean_successes / n if n else 0.0,
        intervention_free_ci95=wilson_interval(clean_successes, n),
    )


def compare_policies(
    robot,
    policies: dict[str, object],
    edge_config: EdgeConfig,
    scenes: Sequence[Scene],
    **kwargs,
) -> list[PolicyEval]:
    """Evaluate every policy on the same ``scenes``; returned best first (success, then faster completion)."""
    evals = [evaluate_on_scenes(robot, policy, edge_config, scenes, name, **kwargs) for name, policy in policies.items()]
    return rank(evals)


def rank(evals: list[PolicyEval]) -> list[PolicyEval]:
    def key(e: PolicyEval) -> tuple[float, float]:
        completion = e.result.completion_s
        return (-e.result.success_rate, completion if completion == completion else float("inf"))

    return sorted(evals, key=key)
