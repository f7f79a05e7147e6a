"""Critics over action chunks: V(s) and Q(s, a_{t:t+H}) at chunk boundaries.

Observation features come from the policy itself: the FlowVLA context tokens (images +
instruction + state), mean-pooled and detached, next to the normalised state. Reusing
the policy's encoder costs one forward pass instead of a second vision tower, which on
a CPU learner is most of the price of a critic; detaching keeps the critic's errors out
of the policy's representation (the policy is trained only by its flow-matching loss).

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

from robot_rl.core.errors import ConfigError
from robot_rl.policies.flow_vla import FlowVLA
from robot_rl.policies.flow_vla.encoders import images_to_float


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


def require_flow_vla(policy: object, algorithm: str) -> None:
    """Refuse, in one line, a policy whose context encoder (the critic's features) and flow sampling
    (best-of-N candidates) these critics cannot use."""
    if not isinstance(policy, FlowVLA):
        raise ConfigError(
            f"learner algorithm {algorithm!r} needs policy=flow_vla (its critic reads the policy's context "
            f"encoder); {type(policy).__name__} trains with learner=bc, learner=hgdagger or learner=rwr")


def feature_dim(policy: FlowVLA) -> int:
    return policy.config.d_model + policy.config.state_dim


def instruction_embeddings(policy: FlowVLA, batch: dict[str, Any]) -> torch.Tensor:
    """[B, text_dim] embeddings, computed once per batch and shared by every encoder pass."""
    if "instruction_embedding" in batch:
        return torch.as_tensor(batch["instruction_embedding"], dtype=torch.float32).to(policy.device)
    return policy.text_encoder.encode_batch(list(batch["instruction"])).to(policy.device)


@dataclass
class CriticInputs:
    """What a critic update reads from one batch: encoder outputs for now and for the next chunk."""

    batch: dict[str, Any]  # the batch with its instruction embedding filled in (encoded once)
    context: torch.Tensor
    features: torch.Tensor
    next_context: torch.Tensor
    next_features: torch.Tensor


def critic_inputs(policy: FlowVLA, batch: dict[str, Any]) -> CriticInputs:
    """Encode the instruction once, then the observation and the next observation (``next.`` keys)."""
    text = instruction_embeddings(policy, batch)
    batch = {**batch, "instruction_embedding": text}
    context, features = observation_features(policy, batch, text)
    next_context, next_features = observation_features(policy, batch, text, prefix="next.")
    return CriticInputs(batch, context, features, next_context, next_features)


@torch.no_grad()
def observation_features(policy: FlowVLA, batch: dict[str, Any], text: torch.Tensor,
                         prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(context tokens [B, L, d], critic features [B, d + state_dim]) of the observation under ``prefix``.

    ``prefix`` "" reads ``state`` / ``images.<cam>`` (the chunk's start), "next." reads
    ``next.state`` / ``next.images.<cam>`` (the next chunk boundary).
    """
    config = policy.config
    frames = []
    for cam in config.cameras:
        key = f"{prefix}images.{cam}"
        if key not in batch:
            raise KeyError(f"batch is missing {key!r}; critics need it "
                           "(see robot_rl.learner.rewards.transition_fields)")
        frames.append(images_to_float(torch.as_tensor(batch[key]).to(policy.device), config.image_size))
    state = policy.normalizer.normalize_state(
        torch.as_tensor(batch[f"{prefix}state"], dtype=torch.float32).to(policy.device))
    context = policy.encode_context(torch.stack(frames, dim=1), state, text)
    return context, torch.cat([context.mean(dim=1), state], dim=-1)


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
