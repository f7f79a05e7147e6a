"""Advantage-weighted regression with a critic over action chunks.

AWR (Peng et al. 2019) fits a value function V(s) to returns of the data, then does
weighted behaviour cloning with weights clip(exp(A / beta), w_max), A = target - V(s):
actions that did better than the policy usually does at that state are imitated more.
For a flow-matching VLA the "log-likelihood" is replaced by the flow-matching loss, as
in pi0.6*'s RECAP, which conditions on (rather than weights by) the same advantage.

Everything lives at chunk boundaries: V is evaluated at the observation a chunk was
predicted from, and its target mixes two returns, both in ``robot_rl.learner.rewards``:

    target = mc_mix * G_MC + (1 - mc_mix) * (R_chunk + gamma^H * V_target(s_{t+H}))

the Monte-Carlo return-to-go (unbiased, high variance) and the one-chunk TD target
(low variance, biased by V). Mixing Monte-Carlo returns into bootstrapped targets
stabilises learning from sparse rewards (Ostrovski et al. 2017); it is the two-point
special case of a lambda-return. While an episode is still open its Monte-Carlo return
is unknown, so such samples use the TD target alone; a sample whose next boundary is not
recorded yet has no target and keeps the neutral weight 1.

Before weighting, online steps of failed attempts are rejected as in Hi-ORS
(``rejection``): with the critic still inaccurate, standardised advantages give half of
every batch weights above 1, failures included, so the policy would imitate its own
failures. ``rejection.failures: keep`` restores plain AWR.
"""

from __future__ import annotations

from typing import Any

import torch

from robot_rl.learner.algorithms.base import guarded_step
from robot_rl.learner.algorithms.config import AWRConfig
from robot_rl.learner.algorithms.critic import ValueNetwork, frozen_copy, observation_encoder, polyak_update, seeded
from robot_rl.learner.algorithms.rwr import WeightedFlowAlgorithm, rejection_factors, require_fields
from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.trainable import TrainablePolicy

AWR_FIELDS = ("return", "chunk_reward", "chunk_discount", "transition_valid", "episode_finished", "next.state")


def value_targets(returns: torch.Tensor, chunk_reward: torch.Tensor, chunk_discount: torch.Tensor,
                  next_value: torch.Tensor, finished: torch.Tensor, valid: torch.Tensor,
                  mc_mix: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets [B], has_target [B] bool): MC/TD mix for finished episodes, TD alone for open ones."""
    td = chunk_reward + chunk_discount * next_value
    targets = torch.where(finished, mc_mix * returns + (1.0 - mc_mix) * td, td)
    has_target = valid | finished
    return torch.where(has_target, targets, torch.zeros_like(targets)), has_target


def advantage_weights(advantages: torch.Tensor, has_target: torch.Tensor, beta: float, max_weight: float,
                      normalize: bool) -> torch.Tensor:
    """clip(exp(A / beta), max_weight) where a target exists, 1 (neutral) elsewhere."""
    a = advantages.to(torch.float32)
    if normalize and int(has_target.sum()) > 1:
        kept = a[has_target]
        a = (a - kept.mean()) / (kept.std() + 1e-6)
    weights = torch.exp(a / beta).clamp(max=max_weight)
    return torch.where(has_target, weights, torch.ones_like(weights))


class AWR(WeightedFlowAlgorithm[AWRConfig]):
    """AWR on the policy's own loss with a chunk-boundary value critic trained alongside (its features:
    FlowVLA's context, or an encoder of its own for any other policy; ``critic.observation_encoder``)."""

    def __init__(self, params: AWRConfig, policy: TrainablePolicy, config: TrainerConfig,
                 device: torch.device) -> None:
        super().__init__(params, policy, config, device)
        with seeded(config.seed):
            self.encoder = observation_encoder(policy, device)
            self.value = ValueNetwork(self.encoder.dim, self.params.critic_hidden, self.params.critic_depth)
        self.value.to(device)
        self.value_target = frozen_copy(self.value)
        self.critic_parameters = [*self.value.parameters(), *self.encoder.parameters()]
        self.critic_optimizer = torch.optim.AdamW(self.critic_parameters, lr=self.params.critic_lr)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "value": self.critic_optimizer}

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {"value": self.value, "value_target": self.value_target, **self.encoder.modules()}

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        require_fields(batch, AWR_FIELDS, "awr")
        stale, stale_metrics = self.base_weights(batch)
        inputs = self.encoder(batch)
        batch, features, next_features = inputs.batch, inputs.features, inputs.next_features

        def field_(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.as_tensor(batch[name], dtype=dtype).to(self.device)

        with torch.no_grad():
            targets, has_target = value_targets(
                field_("return"), field_("chunk_reward"), field_("chunk_discount"), self.value_target(next_features),
                field_("episode_finished", torch.bool), field_("transition_valid", torch.bool), self.params.mc_mix)
        value = self.value(features)
        critic_metrics = self._critic_step(value, targets, has_target.float() * stale.to(self.device))
        advantages = targets - value.detach()
        kept = rejection_factors(self.params.rejection, batch).to(self.device)
        # Standardised among the samples that may be imitated: which of those did better.
        weights = advantage_weights(advantages, has_target & (kept > 0), self.params.beta, self.params.max_weight,
                                    self.params.normalize_advantages) * kept
        metrics = self.policy_step(batch, weights.cpu() * stale)
        known = has_target.any()
        return {**metrics, **critic_metrics, **stale_metrics,
                "advantage_mean": float(advantages[has_target].mean()) if known else 0.0,
                "value_mean": float(value.detach().mean())}

    def _critic_step(self, value: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        loss = (mask * (value - targets).pow(2)).sum() / mask.sum().clamp_min(1.0)
        guarded_step(self.critic_optimizer, loss, self.critic_parameters, self.config.grad_clip)
        polyak_update(self.value_target, self.value, self.params.tau)
        self.value.num_updates += 1
        return {"value_loss": float(loss.item()), "target_fraction": float((mask > 0).float().mean())}
