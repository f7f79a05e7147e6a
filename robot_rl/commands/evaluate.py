"""`robot-rl eval policy.path=CKPT [compare.path=CKPT2] [episodes=N] [dataset=DIR_OR_HUB_ID]`.

Closed-loop evaluation in the sim through the real EdgeNode (mode and simulated latency
from the ``edge`` group). With ``compare.path`` both checkpoints run on the same scenes
in one run and are printed side by side, with their scene-by-scene difference and its exact
McNemar p (``robot_rl.paired_comparison``); results go to ``eval.out_dir``/eval.json and a
bar plot with 95 % confidence intervals.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig

from robot_rl.config import ConfigError, to_dataclass

ALIASES = ("episodes", "dataset", "dataset_episodes", "compare", "first_seed", "max_steps")


def main(argv: list[str]) -> int:
    from robot_rl.replay.cli_config import load_group_config
    from robot_rl.replay.report import eval_table, print_table

    cfg = load_group_config(argv, "eval", ALIASES)
    evals, json_path, plot_path = run_eval(cfg)
    print_table(eval_table(evals))
    if len(evals) == 2:
        print(f"{evals[0].name} against {evals[1].name}, scene by scene: "
              f"{paired_comparison(evals).describe('the first', 'the second')}")
    print(f"wrote {json_path}\nwrote {plot_path}")
    return 0


def run_eval(cfg: DictConfig, progress: bool = True):
    """Evaluate ``policy.path`` (and ``eval.compare.path``) on shared scenes; returns (evals, json, plot)."""
    from pathlib import Path

    from robot_rl.commands.sim_setup import make_sim
    from robot_rl.edge import EdgeConfig
    from robot_rl.replay import compare_policies
    from robot_rl.replay.report import plot_eval, write_json

    policies = _load_policies(cfg)
    robot = make_sim(cfg)
    try:
        scenes = _scenes(cfg, robot)
        edge = to_dataclass(cfg.edge, EdgeConfig)
        max_steps = cfg.eval.max_steps
        evals = compare_policies(robot, policies, edge, scenes, max_steps=int(max_steps) if max_steps else None,
                                 fallback_seed=int(cfg.eval.first_seed), progress=progress)
    finally:
        robot.disconnect()
    out = Path(cfg.eval.out_dir)
    payload = {
        "scenes": "dataset " + str(cfg.eval.dataset) if cfg.eval.dataset else f"seeds from {cfg.eval.first_seed}",
        "edge": {"mode": edge.mode, "simulated_latency_ms": edge.simulated_latency_ms},
        "ranking": [e.name for e in evals],
        "checkpoints": [e.as_dict() for e in evals],
        # best against second best on the same scenes: is the gap more than luck?
        "paired": paired_comparison(evals).as_dict() if len(evals) == 2 else None,
    }
    return evals, write_json(out / "eval.json", payload), plot_eval(out / "eval.png", evals)


def paired_comparison(evals):
    """The first (better-ranked) of two checkpoints against the second, scene by scene."""
    from robot_rl.paired_comparison import compare_paired

    first, second = evals
    return compare_paired([e.success for e in first.result.episodes], [e.success for e in second.result.episodes])


def _families(cfg: DictConfig) -> list[str]:
    """The configured task families (root ``task_families``), checked against the sim's."""
    from robot_rl.hardware.sim import TASK_FAMILIES
    from robot_rl.commands.sim_setup import task_families

    return task_families(cfg.get("task_families"), TASK_FAMILIES)


def _load_policies(cfg: DictConfig) -> dict[str, object]:
    """{name: policy} for policy.path and, if given, eval.compare.path (names are the paths)."""
    from robot_rl.commands.policy_loading import load_policy, policy_source

    main_name = policy_source(cfg)
    policies = {main_name: load_policy(cfg)}
    compare = cfg.eval.compare
    if compare.get("path"):
        other = copy.deepcopy(cfg)
        other.policy.path = compare.path
        other.policy.type = compare.type
        name = str(compare.path) if str(compare.path) != main_name else f"{compare.path} (compare)"
        policies[name] = load_policy(other)
    return policies


def _scenes(cfg: DictConfig, robot):
    from robot_rl.replay import (
        DatasetError,
        JointMapping,
        JointMappingError,
        dataset_scenes,
        load_logged_dataset,
        seed_scenes,
    )

    if not cfg.eval.dataset:
        n = int(cfg.eval.episodes)
        if n < 1:
            raise ConfigError(f"episodes must be >= 1, got {n}")
        return seed_scenes(n, int(cfg.eval.first_seed), _families(cfg))
    episodes = cfg.eval.dataset_episodes
    try:
        dataset = load_logged_dataset(str(cfg.eval.dataset), list(episodes) if episodes is not None else None)
        return dataset_scenes(dataset, to_dataclass(cfg.eval.mapping, JointMapping), tuple(robot.joint_names))
    except (DatasetError, JointMappingError) as exc:
        raise ConfigError(str(exc)) from exc
