"""``LeRobotPolicyConfig``: ``policy=lerobot``, any LeRobot policy checkpoint (ACT, Diffusion, SmolVLA, pi0 ...).

Kept apart from the adapter (``policies.lerobot_adapter``) so that reading a config imports no LeRobot code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_rl.core.registry import POLICIES


@POLICIES.register("lerobot", builder="robot_rl.policies.lerobot_adapter:LeRobotChunkPolicy.from_policy_config")
@dataclass
class LeRobotPolicyConfig:
    """A checkpoint saved by LeRobot (``lerobot-train`` or ``save_pretrained``), run through LeRobot's
    own classes and processors; its saved config decides the policy type. ``robot-rl train-bc``
    also builds a new one: ``policy.type`` with ``policy.options``, shaped by the demonstrations."""

    path: str | None = None  # a local checkpoint directory or a Hugging Face Hub id
    # A new policy (train-bc, when no path is given): LeRobot's type name and its config fields, e.g.
    # type: act, options: {chunk_size: 20, n_action_steps: 20, dim_model: 256}.
    type: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    device: str | None = None  # null: the device the checkpoint was saved for
    camera_map: dict[str, str] = field(default_factory=dict)  # our camera -> LeRobot's image key, e.g. {wrist: gripper}
    # The tokenizer the checkpoint's processor loads, in place of the one it names (pi0 and pi0.5 name
    # google/paligemma-3b-pt-224 on the Hub): a local directory of it for a machine without Internet.
    tokenizer: str | None = None
    # The checkpoint's joints in the order of its state/action vectors (its dataset's names, e.g.
    # [shoulder_pan.pos, ...]): matched to the robot's joints by name. null: the robot's own order.
    joint_names: list[str] | None = None
    # Learner: train on states rolled forward 0..max_state_offset ticks (the edge's roll-forward, as FlowVLA does).
    max_state_offset: int = 5
    offset_weights: tuple[float, ...] | None = None  # relative probability per offset; None = uniform
    # LoRA (policies/lerobot_lora.py): rank of the adapters; 0 = fine-tune every trainable parameter.
    lora_rank: int = 0
    lora_alpha: int | None = None  # scaling alpha / rank; None: PEFT's default (8)
    lora_targets: list[str] | None = None  # module names; None: LeRobot's default for the policy type
    lora_full_training: list[str] | None = None  # modules trained in full beside the adapters; None: LeRobot's

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ValueError(f"policy.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if self.max_state_offset < 0:
            raise ValueError(f"policy.max_state_offset must be >= 0, got {self.max_state_offset}")
        if self.offset_weights is not None:
            self.offset_weights = tuple(float(w) for w in self.offset_weights)
            if len(self.offset_weights) != self.max_state_offset + 1:
                raise ValueError(f"policy.offset_weights needs {self.max_state_offset + 1} values (offsets "
                                 f"0..{self.max_state_offset}), got {len(self.offset_weights)}")


def is_lerobot_checkpoint(path: str | Path) -> bool:
    """True for a local directory whose config.json names a LeRobot policy type (``"type": "act"``),
    as ``lerobot-train`` and ``save_pretrained`` write it; FlowVLA's says ``policy_type`` instead."""
    config = Path(path) / "config.json"
    try:
        saved = json.loads(config.read_text())
    except (OSError, ValueError):  # no such file, or not JSON: the policy's own loader says what is wrong
        return False
    return isinstance(saved, dict) and isinstance(saved.get("type"), str) and "policy_type" not in saved


def with_recognised_policy(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with ``policy=lerobot`` added where ``policy.path`` alone names a LeRobot checkpoint,
    so ``robot-rl learner policy.path=CK`` runs it as every command with ``policy=lerobot`` would.
    A policy chosen explicitly (``policy=...``) is left as given."""
    keys = {item.split("=", 1)[0].lstrip("+~"): item.split("=", 1)[-1] for item in overrides if "=" in item}
    if "policy" in keys or not keys.get("policy.path") or not is_lerobot_checkpoint(keys["policy.path"]):
        return list(overrides)
    return ["policy=lerobot", *overrides]
