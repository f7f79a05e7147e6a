"""Random training batches from in-memory episodes, with state-offset augmentation.

An episode is a dict of numpy arrays: ``images.<cam>`` [T,H,W,3] uint8, ``state`` [T,S],
``action`` [T,A] (the commanded actions), ``instruction`` str and optionally ``weight``
(a float used by reward-weighted learning; 1.0 when absent). Every time step of every
episode is equally likely to be drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from robot_rl.policies.augment import build_sample, sample_offsets
from robot_rl.policies.trainable import TrainablePolicy


def validate_episode(episode: dict, policy: TrainablePolicy, index: int) -> int:
    """Return the episode length T, or raise ValueError saying which episode and key is wrong."""
    where = f"episode {index}"
    for key in ("state", "action", "instruction", *(f"images.{c}" for c in policy.cameras)):
        if key not in episode:
            raise ValueError(f"{where} has no {key!r} (keys: {sorted(episode)})")
    length = len(episode["action"])
    if length == 0:
        raise ValueError(f"{where} is empty")
    shapes = {"state": (length, policy.state_dim), "action": (length, policy.action_dim)}
    for key, shape in shapes.items():
        if np.shape(episode[key]) != shape:
            raise ValueError(f"{where}: {key!r} has shape {np.shape(episode[key])}, expected {shape}")
    for cam in policy.cameras:
        shape = np.shape(episode[f"images.{cam}"])
        if len(shape) != 4 or shape[0] != length or shape[-1] != 3:
            raise ValueError(f"{where}: 'images.{cam}' has shape {shape}, expected [{length}, H, W, 3]")
    return length


class EpisodeSampler:
    """Draws augmented batches: uniform over (episode, t), offsets from the config's distribution."""

    def __init__(self, episodes: Sequence[dict], policy: TrainablePolicy, seed: int = 0):
        if not episodes:
            raise ValueError("no episodes to train on")
        self.episodes = list(episodes)
        self.chunk_size, self.cameras, self.offsets = policy.training_horizon, policy.cameras, policy.state_offsets
        self.history = policy.observation_history
        lengths = [validate_episode(ep, policy, i) for i, ep in enumerate(self.episodes)]
        self.episode_of = np.repeat(np.arange(len(lengths)), lengths)
        self.time_of = np.concatenate([np.arange(n) for n in lengths])
        self.rng = np.random.default_rng(seed)

    @property
    def num_steps(self) -> int:
        return len(self.time_of)

    def sample(self, batch_size: int) -> dict:
        picks = self.rng.integers(0, self.num_steps, size=batch_size)
        offsets = sample_offsets(self.rng, batch_size, self.offsets.max_offset, self.offsets.weights)
        samples = [
            build_sample(self.episodes[self.episode_of[p]], int(self.time_of[p]), int(o),
                         self.chunk_size, self.cameras, self.history)
            for p, o in zip(picks, offsets, strict=True)
        ]
        batch = collate(samples)
        batch["instruction"] = [self.episodes[self.episode_of[p]]["instruction"] for p in picks]
        batch["weight"] = torch.tensor([float(self.episodes[self.episode_of[p]].get("weight", 1.0)) for p in picks])
        return batch

    def all_states_and_actions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every state and action of every episode, for normalisation statistics."""
        return (np.concatenate([ep["state"] for ep in self.episodes]),
                np.concatenate([ep["action"] for ep in self.episodes]))


def collate(samples: list[dict]) -> dict:
    """Stack per-sample numpy dicts into a batch of tensors (images stay uint8 until the model)."""
    return {key: torch.as_tensor(np.stack([s[key] for s in samples])) for key in samples[0]}
