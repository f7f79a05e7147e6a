"""Behaviour cloning from scripted-expert demonstrations (``robot-rl train-bc``): the flow VLA, or
any LeRobot policy (new from ``policy.type``, or fine-tuned from ``policy.path``).

Records the demonstrations first when ``demos.dir`` holds none, trains with state-offset
augmentation (so the policy can use a rolled-forward state), saves a Hugging Face-layout
checkpoint, then evaluates it closed-loop in the sim through the EdgeNode. The learner of the
main job starts from this checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from robot_rl.app.evaluation import evaluate_policy, scoring_edge
from robot_rl.app.record_demos import record_demos
from robot_rl.app.sim import make_sim, task_families
from robot_rl.core.errors import ConfigError
from robot_rl.core.registry import POLICIES
from robot_rl.data.reader import load_episode_arrays, recorded_joint_names
from robot_rl.policies.flow_vla.config import FlowVLAPolicyConfig
from robot_rl.policies.flow_vla.model import FlowVLA
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
from robot_rl.policies.training import fit

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)


def ensure_demos(cfg: RobotRLConfig) -> Path:
    """The demonstration dataset directory, recorded first if it is missing."""
    demos = Path(cfg.demos.dir)
    if (demos / "meta" / "info.json").exists():
        return demos
    log.info("no demonstrations in %s: recording them with the scripted expert", demos)
    record_demos(cfg)
    return demos


def bc_start(cfg: RobotRLConfig, episodes: list[dict]) -> TrainablePolicy:
    """The policy BC trains: a new FlowVLA of ``policy.model``; for ``policy=lerobot`` the checkpoint at
    ``policy.path`` (fine-tuned with its own statistics), else a new ``policy.type`` shaped by the episodes."""
    if isinstance(cfg.policy, FlowVLAPolicyConfig):
        return FlowVLA(cfg.policy.model)
    if not isinstance(cfg.policy, LeRobotPolicyConfig):
        raise ConfigError(f"train-bc trains policy=flow_vla or policy=lerobot, "
                          f"not policy={POLICIES.name_of(cfg.policy)}")
    # LeRobot's policy stack (the edge and learner extras): seconds to import, for policy=lerobot only
    from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

    if cfg.policy.path:
        return LeRobotChunkPolicy.from_policy_config(cfg.policy)
    return LeRobotChunkPolicy.from_scratch(cfg.policy, episodes)


def train_bc(cfg: RobotRLConfig, progress: bool = True) -> dict:
    """Train the BC start (``bc_start``) on the demonstrations, save it to ``bc.checkpoint_dir`` (a
    LeRobot checkpoint for a LeRobot policy), score it in the sim."""
    demos = ensure_demos(cfg)
    episodes = load_episode_arrays(demos)
    log.info("training on %d demonstrations (%d steps)", len(episodes), sum(len(e["action"]) for e in episodes))
    policy = bc_start(cfg, episodes)
    joints = recorded_joint_names(demos)
    if joints:
        policy.bind_joints(joints)  # a checkpoint's policy.joint_names: the demonstrations' vectors by name
    started = time.monotonic()
    stats = fit(policy, episodes, steps=cfg.bc.steps, batch_size=cfg.bc.batch_size, lr=cfg.bc.lr, seed=cfg.seed,
                progress=progress)
    checkpoint = Path(cfg.bc.checkpoint_dir)
    policy.save_pretrained(checkpoint)
    log.info("trained %d steps in %.0f s (loss %.4f -> %.4f); saved %s", stats["steps"],
             time.monotonic() - started, stats["initial_loss"], stats["final_loss"], checkpoint)
    robot = make_sim(cfg)
    try:
        n = cfg.bc.eval_episodes
        evaluation = evaluate_policy(
            robot, policy.cpu(), scoring_edge(cfg.edge), seeds=[cfg.seeds.bc_eval + i for i in range(n)],
            families=task_families(cfg), desc="evaluating BC policy", progress=progress,
        )
    finally:
        robot.disconnect()
    return {"checkpoint": str(checkpoint), "eval_episodes": n, "train": stats, **evaluation.as_dict()}
