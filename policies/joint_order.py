"""A checkpoint's joint order against a robot's: state and action vectors matched by joint name.

A LeRobot checkpoint stores its state and action as plain vectors, in the order of the dataset it
was trained on; nothing in the checkpoint names the joints. A robot (or a ROS 2 arm's
``JointState``) may list the same joints in another order, and joint i of one is then not joint i
of the other: a command meant for the wrist would drive the shoulder. ``policy.joint_names``
says the checkpoint's order; ``JointOrder`` then reorders every state the policy reads and every
action it writes by name, and the processors' per-joint statistics (the units) stay with their joint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from robot_rl.core.errors import ConfigError
from robot_rl.core.robot_io import joint_base_name

Vector = TypeVar("Vector", np.ndarray, torch.Tensor)


class JointOrder:
    """Maps vectors between the robot's joint order and the policy's (last axis)."""

    def __init__(self, policy_joints: Sequence[str], robot_joints: Sequence[str]) -> None:
        policy_joints, robot_joints = tuple(policy_joints), tuple(robot_joints)
        ours = [joint_base_name(j) for j in policy_joints]  # "shoulder_pan.pos" is the joint "shoulder_pan"
        theirs = [joint_base_name(j) for j in robot_joints]
        missing = [j for j, base in zip(policy_joints, ours, strict=True) if base not in theirs]
        extra = [j for j, base in zip(robot_joints, theirs, strict=True) if base not in ours]
        if missing or extra or len(set(ours)) != len(ours):
            raise ConfigError(f"policy.joint_names {list(policy_joints)} must name the robot's joints "
                              f"{list(robot_joints)}, each once (the robot lacks {missing}; the policy lacks {extra})")
        self.robot_index = np.array([theirs.index(base) for base in ours])  # policy joint i = robot's [i]
        self.policy_index = np.argsort(self.robot_index)  # robot joint k = policy's [k]
        self.is_identity = bool((self.robot_index == np.arange(len(policy_joints))).all())

    def to_policy(self, robot_vectors: Vector) -> Vector:
        """[..., J] in the robot's order -> the policy's."""
        return robot_vectors if self.is_identity else robot_vectors[..., self.robot_index]

    def to_robot(self, policy_vectors: Vector) -> Vector:
        """[..., J] in the policy's order -> the robot's."""
        return policy_vectors if self.is_identity else policy_vectors[..., self.policy_index]
