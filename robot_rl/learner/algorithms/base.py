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


class Algorithm[ParamsT](ABC):
    """One gradient update of the policy from a sampled batch.

    Built by ``ALGORITHMS.build(params, policy, config, device)``: ``params`` is the algorithm's
    own config (``robot_rl.learner.algorithms.configs``), ``config`` the trainer's shared one.
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
