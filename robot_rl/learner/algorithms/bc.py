"""Weighted behaviour cloning: the flow-matching loss of FlowVLA, weighted per sample.

With all weights 1 it is behaviour cloning on the mixed replay (``bc``, and ``hgdagger``,
which samples only corrections and demonstrations); the reward- and advantage-weighted
algorithms reuse its step and only change the weights they give it.
"""

from __future__ import annotations

from typing import Any

import torch

from robot_rl.learner.algorithms.base import Algorithm
from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.flow_vla import FlowVLA


class WeightedBC[ParamsT](Algorithm[ParamsT]):
    """``bc`` (params: ``WeightedBCConfig``); generic in its params so the weighted algorithms
    built on its step carry their own."""

    def __init__(self, params: ParamsT, policy: FlowVLA, config: TrainerConfig, device: torch.device) -> None:
        super().__init__(params, policy, config, device)
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.optimizer}

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        noise, flow_time = self._draw_noise(batch)
        weights = batch.get("weight")
        loss, per_sample = self.policy.compute_loss(
            batch, None if weights is None else weights.to(self.device), noise=noise, flow_time=flow_time)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return {"loss": float(loss.item()), "grad_norm": float(grad_norm.item()),
                "loss_max": float(per_sample.max().item())}

    def _draw_noise(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow noise and times from the algorithm's own generator (same law as the model's)."""
        config = self.policy.config
        n = len(batch["actions"])
        noise = torch.randn((n, config.chunk_size, config.action_dim), generator=self.generator)
        u = torch.rand(n, generator=self.generator)
        # "beta": Beta(1.5, 1) by inverse CDF (u ** (1/1.5)), mapped like FlowVLA._sample_flow_time.
        flow_time = 1.0 - u.pow(1.0 / 1.5) * 0.999 if config.flow_time_sampling == "beta" else u
        return noise.to(self.device), flow_time.to(self.device)
