"""Weighted behaviour cloning: the policy's own training loss (FlowVLA's flow matching, a LeRobot
policy's loss), weighted per sample.

With all weights 1 it is behaviour cloning on the mixed replay (``bc``, and ``hgdagger``,
which samples only corrections and demonstrations); the reward- and advantage-weighted
algorithms reuse its step and only change the weights they give it.
"""

from __future__ import annotations

from typing import Any

import torch

from robot_rl.learner.algorithms.base import Algorithm, guarded_step
from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.trainable import TrainablePolicy


class WeightedBC[ParamsT](Algorithm[ParamsT]):
    """``bc`` (params: ``WeightedBCConfig``); generic in its params so the weighted algorithms
    built on its step carry their own."""

    def __init__(self, params: ParamsT, policy: TrainablePolicy, config: TrainerConfig, device: torch.device) -> None:
        super().__init__(params, policy, config, device)
        self.trainable = list(policy.trainable_parameters())
        self.optimizer = torch.optim.AdamW(self.trainable, lr=config.lr, weight_decay=config.weight_decay)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.optimizer}

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        randomness = self.draw_randomness(batch)
        weights = batch.get("weight")
        loss, per_sample = self.policy.compute_loss(
            batch, None if weights is None else weights.to(self.device), **randomness)
        grad_norm = guarded_step(self.optimizer, loss, self.trainable, self.config.grad_clip)
        return {"loss": float(loss.item()), "grad_norm": float(grad_norm.item()),
                "loss_max": float(per_sample.max().item())}

    def draw_randomness(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The loss's randomness (flow noise and times, ...) from the algorithm's own generator."""
        return self.policy.draw_training_randomness(len(batch["actions"]), self.generator)
