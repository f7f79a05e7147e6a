"""Build the session's robot, policy and teleop device from the composed Hydra config.

The robot group says which backend it is: ``backend: lerobot`` (configs/robot/so101.yaml),
``backend: ros2`` (configs/robot/ros2_arm.yaml), or no backend key for the MuJoCo sim
(configs/robot/sim_so101.yaml).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from robot_rl.config import ConfigError, to_dataclass
from robot_rl.session.config import TeleopConfig

log = logging.getLogger(__name__)


def _plain(node: DictConfig | None) -> dict[str, Any]:
    return dict(OmegaConf.to_container(node, resolve=True)) if node is not None else {}


def robot_backend(cfg: DictConfig) -> str:
    return str(_plain(cfg.get("robot")).get("backend", "sim"))


def make_robot(cfg: DictConfig):
    """The Robot named by the ``robot`` group (not yet connected)."""
    values = _plain(cfg.get("robot"))
    backend = values.pop("backend", "sim")
    if backend == "lerobot":
        from robot_rl.hardware.lerobot_robot import LeRobotRobot, LeRobotRobotConfig

        return LeRobotRobot(to_dataclass(values, LeRobotRobotConfig))
    if backend == "ros2":
        from robot_rl.bridges.ros2 import Ros2ArmConfig, Ros2Robot

        return Ros2Robot(to_dataclass(values, Ros2ArmConfig))
    if backend == "sim":
        from robot_rl.hardware.sim import SimConfig, SimSO101

        return SimSO101(to_dataclass(values, SimConfig))
    raise ConfigError(f"robot.backend must be lerobot, ros2 or absent (sim), got {backend!r}")


class HoldPolicy:
    """Dry-run policy: every action is the state it was given, so the arm stays where it is.

    For checking a new set-up (cameras, teleop, recording, e-stop) before trusting a model
    with the arm: with the scripted operator in the sim it also exercises takeovers.
    """

    def __init__(self, action_dim: int, chunk_size: int = 20) -> None:
        self.action_dim, self.chunk_size = action_dim, chunk_size

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        return np.repeat(np.asarray(state, dtype=np.float32)[None], self.chunk_size, axis=0)

    def save_pretrained(self, directory: str | Path) -> None:
        raise NotImplementedError("the hold policy has no weights")


def make_policy(cfg: DictConfig, action_dim: int):
    """The ChunkPolicy named by ``policy.type`` (flow_vla, lerobot or hold), loaded from ``policy.path``."""
    values = _plain(cfg.get("policy"))
    kind = values.get("type", "flow_vla")
    path = values.get("path")
    device = values.get("device")
    if kind == "hold":
        return HoldPolicy(action_dim)
    if not path:
        raise ConfigError(
            "policy.path is not set; give a checkpoint (robot-rl session policy.path=outputs/bc_policy), "
            "or policy.type=hold for a dry run without a model"
        )
    if kind == "flow_vla":
        from robot_rl.policies.flow_vla import FlowVLA

        policy = FlowVLA.from_pretrained(path, device=device)
    elif kind == "lerobot":
        from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

        policy = LeRobotChunkPolicy.from_pretrained(path, device=device)
    else:
        raise ConfigError(f"policy.type must be flow_vla, lerobot or hold, got {kind!r}")
    if getattr(policy, "action_dim", action_dim) != action_dim:
        raise ConfigError(f"policy at {path} predicts {policy.action_dim}-dim actions; the robot has {action_dim} joints")
    return policy


def make_teleop(config: TeleopConfig, robot):
    """The teleop device of ``config.type`` for ``robot``."""
    joints = tuple(robot.joint_names)
    if config.type == "scripted":
        from robot_rl.hardware.teleop.scripted import ScriptedOperatorConfig, scripted_operator_for_sim

        try:
            return scripted_operator_for_sim(robot, to_dataclass(config.device, ScriptedOperatorConfig))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if config.type == "leader":
        from robot_rl.hardware.teleop.leader import LeaderArmConfig, LeaderArmTeleop

        return LeaderArmTeleop(joints, config=to_dataclass(config.device, LeaderArmConfig))
    if config.type == "gamepad":
        from robot_rl.hardware.teleop.gamepad import GamepadConfig, GamepadTeleop

        return GamepadTeleop(joints, config=to_dataclass(config.device, GamepadConfig))
    if config.type == "keyboard":
        from robot_rl.hardware.teleop.keyboard import KeyboardJogConfig, KeyboardJogTeleop

        return KeyboardJogTeleop(joints, config=to_dataclass(config.device, KeyboardJogConfig))
    from robot_rl.hardware.teleop import NullTeleop

    return NullTeleop()


def camera_shapes(robot) -> dict[str, tuple[int, int]]:
    """(H, W) of each camera, for the recorder."""
    shapes = getattr(robot, "camera_shapes", None)
    if shapes is not None:
        return dict(shapes)
    features = robot.observation_features
    return {cam: (int(features[cam][0]), int(features[cam][1])) for cam in robot.camera_names}
