"""Load the configured policy: a checkpoint path or hub id, else the BC checkpoint."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from robot_rl.config import ConfigError


def load_policy(cfg: DictConfig, deterministic: bool = False):
    """FlowVLA or a LeRobot policy (``policy.type``) from ``policy.path``, else the trained BC
    checkpoint, else the shipped one (``checkpoints/bc_push``) where it fits the config."""
    path = cfg.policy.get("path") or cfg.bc.checkpoint_dir
    kind = cfg.policy.get("type", "flow_vla")
    if kind == "flow_vla":
        from policies.flow_vla import FlowVLA
        from robot_rl.commands.run import shipped_bc_checkpoint

        if not cfg.policy.get("path") and not (Path(path) / "config.json").exists():
            path = shipped_bc_checkpoint(cfg) or path

        if not cfg.policy.get("path") and not (Path(path) / "config.json").exists():
            raise ConfigError(
                f"no policy checkpoint at {path}; train one with `robot-rl train-bc` or pass policy.path=DIR_OR_HUB_ID"
            )
        policy = FlowVLA.from_pretrained(path, device="cpu")
        if deterministic:
            policy.config.inference_seed = 0
        return policy
    if kind == "lerobot":
        from policies.lerobot_adapter import LeRobotChunkPolicy

        return LeRobotChunkPolicy.from_pretrained(path)
    raise ConfigError(f"unknown policy.type {kind!r}; use flow_vla or lerobot")
