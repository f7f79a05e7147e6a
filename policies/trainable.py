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
``instruction`` (list of str); a policy translates it to its own inputs. A policy that reads past
observations (``observation_history``) also gets ``past.state`` [B, steps - 1, state_dim] and
``past.images.<camera>`` [B, steps - 1, H, W, 3], the recorded observations of the ticks before, oldest
first, and ``actions`` that start ``past_actions`` ticks before the chunk.

Randomness of a loss (flow noise and times, a VAE's latent draw) comes from the algorithm's
own generator through ``draw_training_randomness``, so a resumed learner reproduces the next
update, and data-parallel ranks shard one draw instead of drawing their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention
from torch import nn

from robot_rl.policies.base import ObservationHistory

FRAME_FITS = ("stretch", "pad_center", "pad_top_left")


@dataclass(frozen=True)
class StateOffsets:
    """The state-offset augmentation a policy trains with (``policies.augment``): offsets
    0..max_offset ticks, so it can act from the rolled-forward state the edge gives it."""

    max_offset: int = 0
    weights: tuple[float, ...] | None = None  # relative probability per offset; None = uniform


@dataclass(frozen=True)
class InputFrames:
    """The frame size a policy reads from one camera, and how a camera frame is brought to it.

    Why declared: a 640x480 frame is 921,600 bytes, the 64x64 FlowVLA reads 12,288. The learner keeps
    training frames at this size, resized once when they arrive, with the policy's own resize, so the
    model sees the same pixels it would have resized itself (up to rounding to uint8) and a batch does
    not move camera-size frames to be shrunk again at every update.
    """

    height: int
    width: int
    # "stretch": bilinear with antialiasing to (height, width) (FlowVLA's ``images_to_float``, and what
    # ACT or Diffusion are fed at their config's size); "pad_center": aspect kept, black bars centred
    # (pi0 / pi0.5: LeRobot's ``resize_with_pad_torch``); "pad_top_left": aspect kept, bars on the left
    # and top (SmolVLA: LeRobot's ``resize_with_pad``).
    fit: str = "stretch"

    def __post_init__(self) -> None:
        if self.height < 1 or self.width < 1:
            raise ValueError(f"InputFrames: size must be positive, got {self.height}x{self.width}")
        if self.fit not in FRAME_FITS:
            raise ValueError(f"InputFrames: fit must be one of {FRAME_FITS}, got {self.fit!r}")

    def apply(self, frames: np.ndarray) -> np.ndarray:
        """uint8 [N,H,W,3] camera frames -> uint8 [N,height,width,3]; frames already at the size pass as they are."""
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"InputFrames.apply: frames must be [N,H,W,3], got shape {frames.shape}")
        if frames.shape[1:3] == (self.height, self.width):
            return frames
        chw = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
        if self.fit == "pad_center":
            # lerobot (optional extra): the pi0 family's own resize of uint8 frames
            from lerobot.policies.common.vla_utils import resize_with_pad_torch

            out = resize_with_pad_torch(chw, self.height, self.width)
        else:
            x = chw.float() / 255.0
            if self.fit == "pad_top_left":
                # lerobot (optional extra): SmolVLA's own resize, on 0..1 floats as it is fed
                from lerobot.policies.common.vla_utils import resize_with_pad

                x = resize_with_pad(x, self.height, self.width, pad_value=0)
            else:
                x = F.interpolate(x, size=(self.height, self.width), mode="bilinear", align_corners=False,
                                  antialias=True)
            out = (x * 255.0).round().clamp(0, 255).to(torch.uint8)
        return out.permute(0, 2, 3, 1).contiguous().numpy()


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
    def input_frames(self) -> Mapping[str, InputFrames]:
        """By camera, the frame size the policy reads and its resize (``InputFrames``); a camera not named
        is read at the size it arrives."""
        return {}

    @property
    def observation_history(self) -> ObservationHistory:
        """How many observations one prediction reads (the learner samples that many, the edge keeps them)."""
        return ObservationHistory()

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

    def loading_options(self) -> dict[str, Any]:
        """What ``policies.loading.load_trainable`` needs beside the directory ``save_pretrained`` wrote to
        rebuild this policy in another process (a robot process, a held-out scorer): how it is bound to
        the robot, which a checkpoint does not hold (a LeRobot policy's ``camera_map`` and
        ``joint_names``). Plain values: they travel as JSON."""
        return {}

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
