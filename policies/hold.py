"""``policy=hold``: a dry-run policy that keeps the arm where it is.

For checking a new set-up (cameras, teleop, recording, e-stop) before trusting a model with the
arm: every action of every chunk is the state it was given. With the scripted operator in the sim
it also exercises takeovers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_rl.core.registry import POLICIES


@POLICIES.register("hold", builder="robot_rl.policies.hold:HoldPolicy")
@dataclass
class HoldPolicyConfig:
    chunk_size: int = 20  # actions per chunk: how often the edge asks again

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"policy.chunk_size must be >= 1, got {self.chunk_size}")


class HoldPolicy:
    """A ``ChunkPolicy`` whose every action is the state it was given."""

    def __init__(self, config: HoldPolicyConfig | None = None) -> None:
        self.chunk_size = (config or HoldPolicyConfig()).chunk_size

    def predict_chunk(self, observation: dict, state: np.ndarray, instruction: str) -> np.ndarray:
        return np.repeat(np.asarray(state, dtype=np.float32)[None], self.chunk_size, axis=0)

    def save_pretrained(self, directory: str | Path) -> None:
        raise NotImplementedError("the hold policy has no weights")
