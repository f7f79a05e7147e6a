"""Mean/std normalisation of joint states and actions, stored inside the model.

The statistics are buffers, so they travel in ``state_dict()`` and ``model.safetensors``:
a hot-swapped set of weights always comes with the statistics it was trained with.
Robot units (degrees, gripper 0..100) go in; the network only ever sees ~N(0, 1) values.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MIN_STD = 1e-2  # a joint that never moved in the data must not blow up to huge normalised values


class Normalizer(nn.Module):
    def __init__(self, state_dim: int, action_dim: int):
        super().__init__()
        self.register_buffer("state_mean", torch.zeros(state_dim))
        self.register_buffer("state_std", torch.ones(state_dim))
        self.register_buffer("action_mean", torch.zeros(action_dim))
        self.register_buffer("action_std", torch.ones(action_dim))
        self.register_buffer("is_fitted", torch.tensor(False))

    @property
    def fitted(self) -> bool:
        return bool(self.is_fitted.item())

    @torch.no_grad()
    def fit(self, states: np.ndarray, actions: np.ndarray) -> None:
        """Set statistics from [N, state_dim] states and [N, action_dim] actions (robot units)."""
        states = np.asarray(states, dtype=np.float64)
        actions = np.asarray(actions, dtype=np.float64)
        if states.ndim != 2 or states.shape[1] != self.state_mean.numel() or len(states) == 0:
            raise ValueError(f"states must be [N>0, {self.state_mean.numel()}], got {states.shape}")
        if actions.ndim != 2 or actions.shape[1] != self.action_mean.numel() or len(actions) == 0:
            raise ValueError(f"actions must be [N>0, {self.action_mean.numel()}], got {actions.shape}")
        for buf, value in (
            (self.state_mean, states.mean(0)),
            (self.state_std, np.maximum(states.std(0), MIN_STD)),
            (self.action_mean, actions.mean(0)),
            (self.action_std, np.maximum(actions.std(0), MIN_STD)),
        ):
            buf.copy_(torch.as_tensor(value, dtype=buf.dtype))
        self.is_fitted.fill_(True)

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        return (state - self.state_mean) / self.state_std

    def normalize_action(self, action: torch.Tensor) -> torch.Tensor:
        return (action - self.action_mean) / self.action_std

    def unnormalize_action(self, action: torch.Tensor) -> torch.Tensor:
        return action * self.action_std + self.action_mean

    def to_dict(self) -> dict[str, list[float] | bool]:
        """Readable copy for config.json (the authoritative values live in model.safetensors)."""
        return {
            "fitted": self.fitted,
            "state_mean": self.state_mean.tolist(),
            "state_std": self.state_std.tolist(),
            "action_mean": self.action_mean.tolist(),
            "action_std": self.action_std.tolist(),
        }
