"""``robot-rl replay``: a logged dataset replayed open-loop in the sim (``robot_rl.replay``), with
the configured policy asked what it would have done where ``replay.counterfactual`` is on."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from robot_rl.app.policies import load_policy
from robot_rl.app.sim import make_sim
from robot_rl.core.errors import ConfigError
from robot_rl.replay.dataset import load_logged_dataset
from robot_rl.replay.run import ReplayRun, replay_dataset

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig

log = logging.getLogger(__name__)


def run_replay(cfg: RobotRLConfig, progress: bool = True) -> ReplayRun:
    """Load, map and replay ``replay.dataset``; the sim runs at the dataset's rate."""
    config = cfg.replay
    if not config.dataset:
        raise ConfigError("say which dataset to replay: replay.dataset=DIR (a LeRobotDataset v3) "
                          "or replay.dataset=OWNER/NAME (Hugging Face Hub)")
    dataset = load_logged_dataset(config.dataset, config.episode_indices)  # DatasetError: a ConfigError
    policy = counterfactual_policy(cfg) if config.counterfactual else None
    if cfg.robot.fps != dataset.fps:
        log.info("the dataset was logged at %d fps: running the sim at %d fps", dataset.fps, dataset.fps)
        cfg = dataclasses.replace(cfg, robot=dataclasses.replace(cfg.robot, fps=dataset.fps))
    robot = make_sim(cfg)
    try:  # joints or cameras that do not map raise JointMappingError, a ConfigError: one line
        return replay_dataset(robot, dataset, config, policy=policy, progress=progress, viewer=cfg.viewer)
    finally:
        robot.disconnect()


def counterfactual_policy(cfg: RobotRLConfig) -> Any:
    """The policy asked at every logged step, its noise fixed (the same state, the same answer)."""
    if not getattr(cfg.policy, "path", None):
        raise ConfigError("replay.counterfactual=true needs the policy to ask: policy.path=CHECKPOINT_DIR_OR_HUB_ID")
    return load_policy(cfg, deterministic=True)
