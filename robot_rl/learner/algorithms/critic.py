"""Critics over action chunks: V(s) and Q(s, a_{t:t+H}) at chunk boundaries.

Observation features come from one of two encoders (``observation_encoder``):

* **FlowVLA's own context** (images + instruction + state), mean-pooled and detached, next to
  the normalised state. Reusing the policy's encoder costs one forward pass instead of a second
  vision tower, which on a CPU learner is most of the price of a critic; detaching keeps the
  critic's errors out of the policy's representation (the policy is trained only by its loss).
* **An encoder of the critic's own** for every other policy (a LeRobot ACT, Diffusion, SmolVLA):
  a small CNN over the cameras, the frozen sentence encoder's instruction embedding and the
  state, trained with the critic. It never reads the policy, so ``awr`` weights any policy.

The heads are small MLPs with LayerNorm, which keeps Q-values from blowing up when
offline data is mixed with online data (Ball et al. 2023, RLPD).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robot_rl.policies.flow_vla import FlowVLA
from robot_rl.policies.flow_vla.encoders import ImageEncoder, images_to_float
from robot_rl.policies.text_encoder import TEXT_EMBEDDING_DIM, InstructionEncoder
from robot_rl.policies.trainable import TrainablePolicy


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Initialise networks from ``seed`` without disturbing torch's global random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def mlp(in_dim: int, hidden: int, depth: int, out_dim: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(in_dim if i == 0 else hidden, hidden), nn.LayerNorm(hidden), nn.ReLU()]
    layers.append(nn.Linear(hidden if depth else in_dim, out_dim))
    return nn.Sequential(*layers)


@dataclass
class CriticInputs:
    """What a critic update reads from one batch: encoder outputs for now and for the next chunk."""

    batch: dict[str, Any]  # the batch (FlowVLA's: with its instruction embedding filled in, encoded once)
    features: torch.Tensor  # [B, dim]; carries gradients into an encoder of the critic's own
    next_features: torch.Tensor  # [B, dim], no gradients (a TD target)


@dataclass
class ContextCriticInputs(CriticInputs):
    """With FlowVLA's context tokens [B, L, d], from which ``rl`` samples its candidate chunks."""

    context: torch.Tensor
    next_context: torch.Tensor


class PolicyContextEncoder:
    """Critic features from FlowVLA's context encoder: mean-pooled context tokens and the normalised state."""

    def __init__(self, policy: FlowVLA) -> None:
        self.policy = policy
        self.dim = policy.config.d_model + policy.config.state_dim

    def modules(self) -> dict[str, nn.Module]:
        return {}  # nothing of its own to train or checkpoint

    def parameters(self) -> list[nn.Parameter]:
        return []

    def __call__(self, batch: dict[str, Any]) -> ContextCriticInputs:
        """Encode the instruction once, then the observation and the next observation (``next.`` keys)."""
        policy = self.policy
        text = (torch.as_tensor(batch["instruction_embedding"], dtype=torch.float32).to(policy.device)
                if "instruction_embedding" in batch
                else policy.text_encoder.encode_batch(list(batch["instruction"])).to(policy.device))
        batch = {**batch, "instruction_embedding": text}
        context, features = self._features(batch, text)
        next_context, next_features = self._features(batch, text, prefix="next.")
        return ContextCriticInputs(batch, features, next_features, context, next_context)

    @torch.no_grad()
    def _features(self, batch: dict[str, Any], text: torch.Tensor,
                  prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
        """(context tokens [B, L, d], critic features [B, d + state_dim]) of the observation under ``prefix``."""
        policy, config = self.policy, self.policy.config
        frames = [images_to_float(torch.as_tensor(observation_field(batch, f"{prefix}images.{cam}"))
                                  .to(policy.device), config.image_size) for cam in config.cameras]
        state = policy.normalizer.normalize_state(
            torch.as_tensor(batch[f"{prefix}state"], dtype=torch.float32).to(policy.device))
        context = policy.encode_context(torch.stack(frames, dim=1), state, text)
        return context, torch.cat([context.mean(dim=1), state], dim=-1)


class OwnObservationEncoder(nn.Module):
    """Critic features that read no policy: a small CNN over the cameras (FiLM by the instruction, as
    FlowVLA's, so the features say where the named cube is), the instruction embedding and the state.

    The state enters through a linear map and LayerNorm: joint units differ between robots (degrees,
    radians, 0-100 grippers), and LayerNorm makes the features independent of their scale.
    """

    def __init__(self, cameras: tuple[str, ...], state_dim: int, *, image_size: int = 64, width: int = 64,
                 text_encoder: InstructionEncoder | None = None) -> None:
        super().__init__()
        self.cameras, self.image_size = cameras, image_size
        self._text_encoder = text_encoder  # frozen and shared: not a submodule
        self.images = ImageEncoder(len(cameras), (16, 32, 32), 2, width, film_dim=TEXT_EMBEDDING_DIM)
        self.text = nn.Linear(TEXT_EMBEDDING_DIM, width)
        self.state = nn.Sequential(nn.Linear(state_dim, width), nn.LayerNorm(width))
        self.dim = 3 * width

    @property
    def text_encoder(self) -> InstructionEncoder:
        if self._text_encoder is None:
            self._text_encoder = InstructionEncoder.shared()
        return self._text_encoder

    def forward(self, batch: dict[str, Any], text: torch.Tensor, prefix: str = "") -> torch.Tensor:
        device = text.device
        frames = torch.stack([images_to_float(torch.as_tensor(observation_field(batch, f"{prefix}images.{cam}"))
                                              .to(device), self.image_size) for cam in self.cameras], dim=1)
        state = torch.as_tensor(batch[f"{prefix}state"], dtype=torch.float32).to(device)
        return torch.cat([self.images(frames, text).mean(dim=1), self.text(text), self.state(state)], dim=-1)


class OwnEncoderFeatures:
    """``OwnObservationEncoder`` as a feature source: gradients into it for now, none for the TD target."""

    def __init__(self, encoder: OwnObservationEncoder) -> None:
        self.encoder = encoder
        self.dim = encoder.dim

    def modules(self) -> dict[str, nn.Module]:
        return {"critic_encoder": self.encoder}

    def parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters())

    def __call__(self, batch: dict[str, Any]) -> CriticInputs:
        device = next(self.encoder.parameters()).device
        text = self.encoder.text_encoder.encode_batch(list(batch["instruction"])).to(device)
        features = self.encoder(batch, text)
        with torch.no_grad():
            next_features = self.encoder(batch, text, prefix="next.")
        return CriticInputs(batch, features, next_features)


def observation_encoder(policy: TrainablePolicy, device: torch.device) -> PolicyContextEncoder | OwnEncoderFeatures:
    """FlowVLA's context for a FlowVLA; an encoder of the critic's own for any other policy."""
    if isinstance(policy, FlowVLA):
        return PolicyContextEncoder(policy)
    return OwnEncoderFeatures(OwnObservationEncoder(policy.cameras, policy.state_dim).to(device))


def observation_field(batch: dict[str, Any], key: str) -> Any:
    if key not in batch:
        raise KeyError(f"batch is missing {key!r}; critics need it (see robot_rl.learner.rewards.transition_fields)")
    return batch[key]


class ValueNetwork(nn.Module):
    """V(s) at a chunk boundary."""

    num_updates: torch.Tensor  # a buffer, registered below

    def __init__(self, in_dim: int, hidden: int = 256, depth: int = 2) -> None:
        super().__init__()
        self.net = mlp(in_dim, hidden, depth)
        # Updates done so far: a buffer so checkpoints (and exact resume) carry it.
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.int64))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)


class ChunkQEnsemble(nn.Module):
    """Q_j(s, a_{t:t+H}) for j < ``size``: one value for a whole normalised action chunk (Q-chunking)."""

    num_updates: torch.Tensor  # a buffer, registered below

    def __init__(self, in_dim: int, chunk_size: int, action_dim: int, hidden: int = 256, depth: int = 2,
                 size: int = 2) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"ensemble size must be >= 1, got {size}")
        self.members = nn.ModuleList(mlp(in_dim + chunk_size * action_dim, hidden, depth) for _ in range(size))
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.int64))

    def forward(self, features: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """features [B, F], chunks [B, H, A] -> Q [size, B]."""
        x = torch.cat([features, chunks.flatten(1)], dim=-1)
        return torch.stack([member(x).squeeze(-1) for member in self.members])


def frozen_copy[M: nn.Module](module: M) -> M:
    """A target network: same weights, no gradients."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source (slow-moving TD targets, Lillicrap et al. 2016)."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, tau)
