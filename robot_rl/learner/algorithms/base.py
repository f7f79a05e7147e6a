"""The interface every learning algorithm of the trainer implements.

The trainer owns the loop (sampling, publishing, checkpoints); an algorithm owns
only what one update needs: its optimiser(s), its own random generator and any extra
networks (critics, value heads). Keeping the generator inside the algorithm, rather
than using torch's global RNG, makes a resumed run reproduce the next update exactly
even when other threads of the process draw random numbers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.trainable import TrainablePolicy


class NonFiniteUpdateError(ArithmeticError):
    """A batch's loss or gradient is NaN/inf. Stepping on it would write NaN into every weight the
    optimiser touches (and into Adam's moments, so every later step too); nothing was changed."""


def guarded_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, parameters: list[torch.nn.Parameter],
                 grad_clip: float) -> torch.Tensor:
    """Backward, clip and step, unless the loss or the gradient norm is not finite: then the gradients
    are dropped and ``NonFiniteUpdateError`` raised. Checked after backward, so that under data-parallel
    training every rank sees the same all-reduced norm and every rank skips the same batch."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    if not (torch.isfinite(loss.detach()).all() and torch.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach().float().mean())
        raise NonFiniteUpdateError(f"loss {value:.4g}, gradient norm {float(grad_norm):.4g}")
    optimizer.step()
    return grad_norm


class Algorithm[ParamsT](ABC):
    """One gradient update of the policy from a sampled batch.

    Built by ``ALGORITHMS.build(params, policy, config, device)``: ``params`` is the algorithm's
    own config (``robot_rl.learner.algorithms.config``), ``config`` the trainer's shared one.
    """

    def __init__(self, params: ParamsT, policy: TrainablePolicy, config: TrainerConfig, device: torch.device) -> None:
        self.params = params
        self.policy = policy
        self.config = config
        self.device = device
        self.generator = torch.Generator(device="cpu").manual_seed(config.seed)

    @abstractmethod
    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """Apply one update; return scalar metrics (at least ``loss``)."""

    @abstractmethod
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser, by name, so checkpoints can save and restore them."""

    def set_policy_version(self, version: int) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """The trainer reports each published (or resumed) weights version; algorithms with a
        staleness bound measure sample age against it. Plain BC has no use for it."""

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """Trainable modules besides the policy (critics...), by name, for checkpoints."""
        return {}

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
