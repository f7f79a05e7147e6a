"""The TrainablePolicy protocol: what the learner trains and publishes, and the edge swaps in.

An abstract ``torch.nn.Module`` rather than a ``typing.Protocol``: both implementations are modules
(parameters, ``state_dict``, ``to``, ``train``), and the learner uses all of that; it also satisfies
the edge's ``ChunkPolicy``.

Two implementations: the project's ``FlowVLA`` and ``LeRobotChunkPolicy`` (any LeRobot
``PreTrainedPolicy`` with its own processors). The learner's algorithms, trainer, checkpoints
and publisher speak only this protocol, so a lab's ACT or SmolVLA checkpoint is fine-tuned by
the same ``bc`` / ``hgdagger`` / ``rwr`` code as our own model.

A training batch is the learner's (``robot_rl.learner.index``): ``images.<camera>`` uint8
[B, H, W, 3], ``state`` [B, state_dim] (the rolled-forward state of the offset augmentation),
``actions`` [B, training_horizon, action_dim] and ``action_is_pad`` [B, training_horizon] in robot units,
``instruction`` (list of str); a policy translates it to its own inputs.

Randomness of a loss (flow noise and times, a VAE's latent draw) comes from the algorithm's
own generator through ``draw_training_randomness``, so a resumed learner reproduces the next
update, and data-parallel ranks shard one draw instead of drawing their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class StateOffsets:
    """The state-offset augmentation a policy trains with (``policies.augment``): offsets
    0..max_offset ticks, so it can act from the rolled-forward state the edge gives it."""

    max_offset: int = 0
    weights: tuple[float, ...] | None = None  # relative probability per offset; None = uniform


class TrainablePolicy(nn.Module, ABC):
    """A ``ChunkPolicy`` that is also a ``torch.nn.Module`` the learner can update and publish.

    ``published_state_dict`` is what the wire carries (the learner publishes it, the edge copies it
    into its shadow policy between chunks); ``state_dict`` / ``load_state_dict`` (from ``nn.Module``)
    what checkpoints hold. ``save_pretrained`` writes the policy's native checkpoint (a LeRobot
    policy's is a LeRobot checkpoint).
    """

    # What the policy reads and writes (the features it consumes and produces).
    @property
    @abstractmethod
    def cameras(self) -> tuple[str, ...]:
        """Our camera names the policy reads, in its order."""

    @property
    @abstractmethod
    def state_dim(self) -> int: ...

    @property
    @abstractmethod
    def action_dim(self) -> int: ...

    @property
    @abstractmethod
    def chunk_size(self) -> int:
        """Actions per predicted chunk (what the edge executes)."""

    @property
    @abstractmethod
    def training_horizon(self) -> int:
        """Actions per training target: the chunk, or longer (Diffusion's ``horizon``)."""

    @property
    @abstractmethod
    def state_offsets(self) -> StateOffsets: ...

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @abstractmethod
    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray:
        """Images by camera (uint8 HxWx3), joint state -> float32[chunk_size, action_dim], robot units."""

    @abstractmethod
    def save_pretrained(self, directory: str | Path) -> None: ...

    def bind_joints(self, robot_joints: Sequence[str]) -> None:
        """Read states and write actions in the robot's joint order from now on. A policy that names no
        joints (FlowVLA) reads and writes the order it was trained in, which the edge checks by count."""

    @abstractmethod
    def config_hash(self) -> str:
        """Equal hashes mean the published weights fit (architecture and features)."""

    @abstractmethod
    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What the optimiser updates (a frozen backbone's parameters are left out)."""

    @abstractmethod
    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """What the learner publishes and robots load on a swap: the tensors training changes (a frozen
        part never travels: robots start from the same checkpoint)."""

    @abstractmethod
    def needs_statistics(self) -> bool:
        """True while the normalisation statistics are still to be fitted on training data."""

    @abstractmethod
    def fit_statistics(self, states: np.ndarray, actions: np.ndarray, instructions: Sequence[str]) -> None:
        """Fit the normalisation statistics on the stored steps (a fresh policy's first batch)."""

    @abstractmethod
    def draw_training_randomness(self, batch_size: int, generator: torch.Generator) -> dict[str, Any]:
        """Keyword arguments for ``compute_loss`` drawn from ``generator`` (tensors with one row per sample,
        or scalars), so the loss of a batch is a function of the batch and the generator's state."""

    # (sum_i w_i l_i / sum_i w_i, per-sample losses l [B]) of ``compute_loss(batch, weights, **randomness)``;
    # a zero weight removes a sample entirely. An attribute, not a method signature: each policy names
    # its own randomness (FlowVLA: noise, flow_time; LeRobot: seed), and data-parallel training shadows it.
    compute_loss: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def weighted_mean(per_sample: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """sum(w_i * l_i) / sum(w_i): exact, so a zero weight removes a sample's influence entirely.

    All-zero weights give a zero loss (and zero gradients) instead of NaN.
    """
    if weights is None:
        return per_sample.mean()
    w = torch.as_tensor(weights, dtype=per_sample.dtype, device=per_sample.device)
    if w.shape != per_sample.shape:
        raise ValueError(f"weights must have shape {tuple(per_sample.shape)} (one per sample), got {tuple(w.shape)}")
    if (w < 0).any() or not torch.isfinite(w).all():
        raise ValueError("weights must be finite and non-negative")
    return (w * per_sample).sum() / w.sum().clamp_min(torch.finfo(w.dtype).tiny)


def published_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a weight swap carries: a trainable policy's ``published_state_dict``, any other
    module's whole state dict."""
    published = getattr(module, "published_state_dict", None)
    return published() if published is not None else module.state_dict()
