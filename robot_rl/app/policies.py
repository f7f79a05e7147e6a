"""Which policy a command runs: ``policy.path``, else the behaviour-cloned start.

Every command that acts with a policy (run, eval, replay, session, bench) asks here, so
they all start from the same checkpoint: ``policy.path`` when given, else the BC checkpoint
``robot-rl train-bc`` wrote to ``bc.checkpoint_dir``, else the one that ships with robot_rl
(``checkpoints/bc_push``) where it was trained for the configured model and task set.
"""

from __future__ import annotations

import dataclasses
import logging
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.core.errors import ConfigError
from robot_rl.core.registry import POLICIES
from robot_rl.policies.flow_vla.config import FlowVLAPolicyConfig
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)

# Trained by `robot-rl train-bc` with the defaults on the default push demonstrations.
SHIPPED_BC = Path(str(files("robot_rl.checkpoints"))) / "bc_push"
SHIPPED_BC_FAMILIES = ["push"]


class NoCheckpointError(ConfigError):
    """The command needs trained weights and none were given or found."""


def shipped_bc_checkpoint(cfg: RobotRLConfig) -> Path | None:
    """The shipped BC start, if ``bc.use_shipped`` and it was trained for this ``policy.model`` and
    ``task_families``; else None (a different model or task set must be trained first)."""
    from robot_rl.policies.flow_vla.checkpoint import read_config  # PyTorch: only where a checkpoint is read

    if not cfg.bc.use_shipped or not isinstance(cfg.policy, FlowVLAPolicyConfig):
        return None
    if not (SHIPPED_BC / "model.safetensors").exists() or cfg.task_families != SHIPPED_BC_FAMILIES:
        return None
    return SHIPPED_BC if read_config(SHIPPED_BC).config_hash() == cfg.policy.model.config_hash() else None


def policy_source(cfg: RobotRLConfig) -> str | None:
    """Where the configured policy's weights come from (None: the policy has none, e.g. ``hold``).
    Reports name this path, so they say which checkpoint really ran."""
    if not hasattr(cfg.policy, "path"):
        return None
    if cfg.policy.path:
        return str(cfg.policy.path)
    trained = Path(cfg.bc.checkpoint_dir)
    if (trained / "config.json").exists() or not isinstance(cfg.policy, FlowVLAPolicyConfig):
        return str(trained)
    shipped = shipped_bc_checkpoint(cfg)
    return str(shipped if shipped is not None else trained)


def resolved_policy_config(cfg: RobotRLConfig) -> Any:
    """``cfg.policy`` with its ``path`` filled in by ``policy_source``; refuses a missing checkpoint."""
    source = policy_source(cfg)
    if source is None:
        return cfg.policy
    if not cfg.policy.path and not (Path(source) / "config.json").exists():
        raise NoCheckpointError(f"no policy checkpoint at {source}: train one with `robot-rl train-bc` "
                                "or pass policy.path=DIR_OR_HUB_ID")
    return dataclasses.replace(cfg.policy, path=source)


def load_policy(cfg: RobotRLConfig, deterministic: bool = False) -> Any:
    """The configured policy, loaded (a ``ChunkPolicy``). ``deterministic`` fixes a flow policy's
    noise seed, so the same observation always gives the same chunk (counterfactual replay)."""
    policy = POLICIES.build(resolved_policy_config(cfg))
    if deterministic and hasattr(policy, "config") and hasattr(policy.config, "inference_seed"):
        policy.config.inference_seed = 0
    return policy


def learner_policy_config(config: RobotRLConfig) -> Any:
    """The policy configuration the learner starts from: ``learner.init_checkpoint`` if given, else
    the checkpoint an edge of the same configuration starts from (``policy.path``, else the BC
    checkpoint, else the shipped one), so learner and robots begin with the same weights; with none
    of these, a new FlowVLA of ``policy.model`` (``path`` empty; a LeRobot policy needs its
    checkpoint: its normalisation statistics travel with it)."""
    if not isinstance(config.policy, FlowVLAPolicyConfig | LeRobotPolicyConfig):
        raise ConfigError(f"the learner trains policy=flow_vla or policy=lerobot, not "
                          f"policy={POLICIES.name_of(config.policy)}")
    if config.learner.init_checkpoint:
        return dataclasses.replace(config.policy, path=config.learner.init_checkpoint)
    try:
        return resolved_policy_config(config)
    except NoCheckpointError:
        if not isinstance(config.policy, FlowVLAPolicyConfig):
            raise
        return config.policy


def learner_policy(config: RobotRLConfig) -> TrainablePolicy:
    """The learner's policy, built as ``learner_policy_config`` says."""
    policy_config = learner_policy_config(config)
    if policy_config.path:
        log.info("learner starts from %s", policy_config.path)
    else:
        log.warning("no checkpoint to start from (policy.path, bc.checkpoint_dir, the shipped one): "
                    "training a new model of policy.model")
    return POLICIES.build(policy_config)
