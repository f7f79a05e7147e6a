"""Load the configured policy: a checkpoint path or hub id, else the BC checkpoint."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig

from robot_rl.config import ConfigError

SHIPPED_BC = Path(str(files("robot_rl.checkpoints"))) / "bc_push"


def shipped_bc_checkpoint(cfg: DictConfig) -> Path | None:
    """The shipped BC start (``checkpoints/bc_push``, trained with ``robot-rl train-bc`` on
    the default push demonstrations), if ``bc.use_shipped`` and it fits ``policy.model`` and
    ``task_families``; else None (a different model or task set must be trained)."""
    from robot_rl.policies.flow_vla import FlowVLAConfig
    from robot_rl.policies.flow_vla.checkpoint import read_config
    from robot_rl.config import to_dataclass

    if not cfg.bc.get("use_shipped", True) or not (SHIPPED_BC / "model.safetensors").exists():
        return None
    families = list(cfg.task_families) if cfg.get("task_families") is not None else None
    if families != ["push"]:
        return None
    wanted = to_dataclass(cfg.policy.model, FlowVLAConfig).config_hash()
    return SHIPPED_BC if read_config(SHIPPED_BC).config_hash() == wanted else None


def policy_source(cfg: DictConfig) -> str:
    """Where ``load_policy`` loads from: ``policy.path``, else the trained BC checkpoint, else
    (FlowVLA only) the shipped one where it fits the config. Reports name this path."""
    path = cfg.policy.get("path") or cfg.bc.checkpoint_dir
    if cfg.policy.get("type", "flow_vla") == "flow_vla" and not cfg.policy.get("path") \
            and not (Path(path) / "config.json").exists():
        path = shipped_bc_checkpoint(cfg) or path
    return str(path)


def load_policy(cfg: DictConfig, deterministic: bool = False):
    """FlowVLA or a LeRobot policy (``policy.type``) from ``policy_source(cfg)``."""
    path = policy_source(cfg)
    kind = cfg.policy.get("type", "flow_vla")
    if kind == "flow_vla":
        from robot_rl.policies.flow_vla import FlowVLA

        if not cfg.policy.get("path") and not (Path(path) / "config.json").exists():
            raise ConfigError(
                f"no policy checkpoint at {path}; train one with `robot-rl train-bc` or pass policy.path=DIR_OR_HUB_ID"
            )
        policy = FlowVLA.from_pretrained(path, device="cpu")
        if deterministic:
            policy.config.inference_seed = 0
        return policy
    if kind == "lerobot":
        from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

        return LeRobotChunkPolicy.from_pretrained(path)
    raise ConfigError(f"unknown policy.type {kind!r}; use flow_vla or lerobot")
