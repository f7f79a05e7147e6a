"""Mean/std normalisation of joint states and actions, stored inside the model.

The statistics are buffers, so they travel in ``state_dict()`` and ``model.safetensors``:
a hot-swapped set of weights always comes with the statistics it was trained with.
Robot units (degrees, gripper 0..100) go in; the network only ever sees ~N(0, 1) values.

Instruction embeddings are standardised too (when the model is configured to): a sentence
encoder maps a task's instructions to nearly parallel unit vectors ("push the red cube to the
left" vs "... to the right": cosine 0.987; red vs green: ~0.88), so what tells the tasks apart
is ~1 % of each vector. Scaled per dimension by its spread over the training instructions,
those differences become O(1), as large as the image and state features they compete with.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MIN_STD = 1e-2  # a joint that never moved in the data must not blow up to huge normalised values
# A text dimension that barely varies over the training instructions is scaled no more than the
# typical one: an unseen instruction must not turn a near-constant dimension into a huge input.
TEXT_STD_FLOOR = 0.5  # x the mean per-dimension spread


class Normalizer(nn.Module):
    # The buffers registered below (text_* only when the model normalises instructions).
    text_mean: torch.Tensor
    text_std: torch.Tensor
    state_mean: torch.Tensor
    state_std: torch.Tensor
    action_mean: torch.Tensor
    action_std: torch.Tensor
    is_fitted: torch.Tensor

    def __init__(self, state_dim: int, action_dim: int, text_dim: int | None = None):
        super().__init__()
        self.normalizes_text = text_dim is not None
        if text_dim is not None:
            self.register_buffer("text_mean", torch.zeros(text_dim))
            self.register_buffer("text_std", torch.ones(text_dim))
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

    @torch.no_grad()
    def fit_text(self, embeddings: np.ndarray) -> None:
        """Set instruction statistics from the [K, text_dim] embeddings of the K *distinct* training
        instructions (each counted once: a frequent instruction must not define the centre)."""
        if not self.normalizes_text:
            raise RuntimeError("this Normalizer was built without text statistics (normalize_instruction: false)")
        embeddings = np.asarray(embeddings, dtype=np.float64)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.text_mean.numel() or len(embeddings) == 0:
            raise ValueError(f"embeddings must be [K>0, {self.text_mean.numel()}], got {embeddings.shape}")
        if len(embeddings) < 2:  # one instruction: nothing to tell apart, just centre it
            std = np.ones(embeddings.shape[1])
        else:
            spread = embeddings.std(0)
            std = np.maximum(spread, TEXT_STD_FLOOR * spread.mean() + 1e-8)
        self.text_mean.copy_(torch.as_tensor(embeddings.mean(0), dtype=self.text_mean.dtype))
        self.text_std.copy_(torch.as_tensor(std, dtype=self.text_std.dtype))

    def normalize_text(self, text: torch.Tensor) -> torch.Tensor:
        if not self.normalizes_text:
            return text
        return (text - self.text_mean) / self.text_std

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
