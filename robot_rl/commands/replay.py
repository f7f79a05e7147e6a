"""`robot-rl replay dataset=DIR_OR_HUB_ID [episodes=[0,2]] [realtime=true] [counterfactual=true policy.path=...]`.

Replays logged episodes open-loop in the sim, prints per-joint tracking error, and writes
under ``replay.out_dir`` one MP4 and one plot per episode plus ``replay.json``.
See ``configs/replay/default.yaml`` for every option (joint mapping included).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from robot_rl.config import ConfigError, to_dataclass

log = logging.getLogger(__name__)

ALIASES = ("dataset", "episodes", "realtime", "counterfactual", "seeds")


def main(argv: list[str]) -> int:
    from robot_rl.replay.cli_config import load_group_config

    cfg = load_group_config(argv, "replay", ALIASES)
    run = run_replay(cfg)
    _print_summary(run)
    return 0


def replay_config(cfg: DictConfig):
    """The ``replay`` group as a ReplayConfig (its mapping as a JointMapping)."""
    from robot_rl.replay import JointMapping, ReplayConfig

    mapping = to_dataclass(cfg.replay.mapping, JointMapping)
    group = {k: v for k, v in cfg.replay.items() if k != "mapping"}
    config = to_dataclass(group, ReplayConfig, mapping=mapping)
    if not config.dataset:
        raise ConfigError("say which dataset to replay: dataset=DIR (a LeRobotDataset v3) or dataset=OWNER/NAME (Hub)")
    return config


def run_replay(cfg: DictConfig, progress: bool = True):
    """Load, map and replay the dataset named in ``cfg``; returns the ReplayRun."""
    from robot_rl.commands.sim_setup import make_sim
    from robot_rl.replay import DatasetError, JointMappingError, load_logged_dataset, replay_dataset

    config = replay_config(cfg)
    try:
        dataset = load_logged_dataset(config.dataset, list(config.episodes) if config.episodes is not None else None)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from exc
    policy = _counterfactual_policy(cfg) if config.counterfactual else None
    if int(cfg.robot.fps) != dataset.fps:
        log.info("the dataset was logged at %d fps: running the sim at %d fps", dataset.fps, dataset.fps)
        cfg.robot.fps = dataset.fps
    robot = make_sim(cfg)
    try:
        return replay_dataset(robot, dataset, config, policy=policy, progress=progress)
    except JointMappingError as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        robot.disconnect()


def _counterfactual_policy(cfg: DictConfig):
    from robot_rl.commands.policy_loading import load_policy

    if not cfg.policy.get("path"):
        raise ConfigError("counterfactual=true needs the policy to ask: policy.path=CHECKPOINT_DIR_OR_HUB_ID")
    return load_policy(cfg, deterministic=True)


def _print_summary(run) -> None:
    from robot_rl.replay.report import print_table, tracking_table

    print_table(tracking_table({r.index: r.tracking for r in run.episodes}))
    for result in run.episodes:
        if result.counterfactual is not None:
            cf = result.counterfactual.as_dict(k=3)
            worst = ", ".join(f"t={d['step']} ({d['chunk_error']:.2f})" for d in cf["top_deviations"])
            print(f"episode {result.index}: counterfactual chunk error {cf['mean_chunk_error']:.2f} "
                  f"(during interventions: {cf['mean_chunk_error_during_interventions']}); largest at {worst}")
        for path in (result.video, result.plot):
            if path is not None:
                print(f"wrote {path}")
    print(f"wrote {run.summary_path}")
