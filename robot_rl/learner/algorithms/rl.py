"""Off-policy actor-critic for the flow-matching VLA: a chunked critic with best-of-N distillation.

The method combines two published recipes for RL with generative, chunked policies:

- **Critic — Q-chunking** (Li, Zhou & Levine 2025, "Reinforcement Learning with Action
  Chunking"): Q(s_t, a_{t:t+H}) scores a whole action chunk, the unit the VLA actually
  executes, and is trained with the chunked H-step backup
      y = sum_{k<H} gamma^k r_{t+k} + gamma^H * max_{i<N} min_j Q'_j(s_{t+H}, a^i),  a^i ~ pi(.|s_{t+H})
  i.e. the value of the implicit best-of-N policy (their QC-BFN variant), with a clipped
  double-Q ensemble (Fujimoto et al. 2018) and Polyak-averaged target networks. An H-step
  backup propagates a sparse success reward H times faster than a one-step one, and is
  unbiased here because the chunk was executed open-loop.
- **Actor — policy-agnostic RL** (Mark et al. 2024, PA-RL): sample N chunks from the flow
  policy (plus the chunk in the data), keep the one the critic scores highest, and distil
  it into the policy with the ordinary flow-matching loss. No gradient flows through the
  ODE sampler, the update is the same supervised loss the VLA was trained with, and the
  edge keeps running the plain flow policy (it never needs the critic).

Why this rather than DSRL (noise-space SAC on a frozen policy): the policy itself improves,
so published weights carry the improvement to robots without shipping a second network,
and the human interventions and demonstrations keep acting as a behaviour-cloning anchor.

Staleness: the critic is off-policy by construction (any executed chunk is a valid
transition), so the bound applies only to the behaviour-cloning term, which would pull
the policy towards what old versions did. For the same reason the behaviour-cloning term
skips online steps of failed attempts (``rejection``, as in Hi-ORS): an anchor that
imitates failures pulls the policy back towards them.
"""

from __future__ import annotations

from typing import Any

import torch

from robot_rl.learner.algorithms.base import guarded_step
from robot_rl.learner.algorithms.config import RLConfig
from robot_rl.learner.algorithms.critic import (
    ChunkQEnsemble,
    PolicyContextEncoder,
    frozen_copy,
    polyak_update,
    require_flow_vla,
    seeded,
)
from robot_rl.learner.algorithms.rwr import WeightedFlowAlgorithm, rejection_factors, require_fields
from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.flow_vla import FlowVLA

RL_FIELDS = ("chunk_reward", "chunk_discount", "transition_valid", "next.state")


def pessimistic_q(q: torch.Tensor) -> torch.Tensor:
    """Min over the ensemble (first dim): the clipped double-Q estimate."""
    return q.min(dim=0).values


def chunked_td_target(chunk_reward: torch.Tensor, chunk_discount: torch.Tensor, next_q: torch.Tensor) -> torch.Tensor:
    """y = R_chunk + discount * max_i min_j Q'_j(s', a^i); ``next_q`` is [ensemble, N, B].

    ``chunk_discount`` is gamma^H, or 0 where the episode terminated inside the chunk.
    """
    return chunk_reward + chunk_discount * pessimistic_q(next_q).max(dim=0).values


def best_of_n(q: torch.Tensor) -> torch.Tensor:
    """Index [B] of the candidate with the highest pessimistic Q; ``q`` is [ensemble, N, B]."""
    return pessimistic_q(q).argmax(dim=0)


def gather_chunks(candidates: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """candidates [N, B, H, A], index [B] -> the chosen chunk per sample [B, H, A]."""
    return candidates[index, torch.arange(candidates.shape[1], device=candidates.device)]


class ChunkQLearning(WeightedFlowAlgorithm[RLConfig]):
    """Q-chunking critic + best-of-N distillation into the flow policy (see the module docstring)."""

    policy: FlowVLA  # its critic reads FlowVLA's context encoder, its candidates FlowVLA's sampler

    def __init__(self, params: RLConfig, policy: FlowVLA, config: TrainerConfig, device: torch.device) -> None:
        require_flow_vla(policy, "rl")
        super().__init__(params, policy, config, device)
        self.encoder = PolicyContextEncoder(policy)
        with seeded(config.seed):
            self.critic = ChunkQEnsemble(self.encoder.dim, policy.chunk_size, policy.action_dim,
                                         params.critic_hidden, params.critic_depth, params.ensemble_size)
        self.critic.to(device)
        self.critic_target = frozen_copy(self.critic)
        self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=params.critic_lr)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "critic": self.critic_optimizer}

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {"critic": self.critic, "critic_target": self.critic_target}

    # ------------------------------------------------------------ update

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        require_fields(batch, RL_FIELDS, "rl")
        stale, stale_metrics = self.base_weights(batch)
        inputs = self.encoder(batch)
        batch, features, next_features = inputs.batch, inputs.features, inputs.next_features
        context, next_context = inputs.context, inputs.next_context
        data_chunks = self.policy.normalizer.normalize_action(
            torch.as_tensor(batch["actions"], dtype=torch.float32).to(self.device))

        critic_metrics = self._critic_step(batch, features, next_context, next_features, data_chunks)
        best, actor_metrics = self._best_chunks(context, features, data_chunks)
        distill = int(self.critic.num_updates) > self.params.warmup_updates
        actor_batch, weights = self._actor_batch(batch, best, stale, distill)
        metrics = self.policy_step(actor_batch, weights)
        return {**metrics, **critic_metrics, **actor_metrics, **stale_metrics, "distilling": float(distill)}

    def _critic_step(self, batch: dict[str, Any], features: torch.Tensor, next_context: torch.Tensor,
                     next_features: torch.Tensor, data_chunks: torch.Tensor) -> dict[str, float]:
        """Chunked TD backup of every ensemble member towards the shared clipped target."""
        def field_(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.as_tensor(batch[name], dtype=dtype).to(self.device)

        with torch.no_grad():
            next_q = self._score(self.critic_target, next_features, self.sample_candidates(next_context))
            targets = chunked_td_target(field_("chunk_reward"), field_("chunk_discount"), next_q)
        mask = field_("transition_valid", torch.bool).float()
        q = self.critic(features, data_chunks)
        loss = (mask * (q - targets).pow(2)).sum() / mask.sum().clamp_min(1.0)
        guarded_step(self.critic_optimizer, loss, list(self.critic.parameters()), self.config.grad_clip)
        polyak_update(self.critic_target, self.critic, self.params.tau)
        self.critic.num_updates += 1
        return {"critic_loss": float(loss.item()), "q_mean": float(q.detach().mean()),
                "td_target_mean": float(targets.mean())}

    @torch.no_grad()
    def _best_chunks(self, context: torch.Tensor, features: torch.Tensor,
                     data_chunks: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The highest-Q chunk per sample among N policy samples (and the recorded chunk)."""
        candidates = self.sample_candidates(context)
        if self.params.include_data_chunk:
            candidates = torch.cat([candidates, data_chunks[None]], dim=0)
        q = self._score(self.critic, features, candidates)
        index = best_of_n(q)
        pessimistic = pessimistic_q(q)
        metrics = {"best_q_mean": float(pessimistic.max(dim=0).values.mean()),
                   "candidate_q_mean": float(pessimistic.mean())}
        if self.params.include_data_chunk:
            metrics["best_is_data_fraction"] = float((index == len(candidates) - 1).float().mean())
        return gather_chunks(candidates, index), metrics

    def _actor_batch(self, batch: dict[str, Any], best: torch.Tensor, stale: torch.Tensor,
                     distill: bool) -> tuple[dict[str, Any], torch.Tensor]:
        """Recorded chunks (BC anchor, staleness-bounded) followed, once distilling, by the best chunks."""
        keys = ["state", "actions", "instruction_embedding", *(f"images.{cam}" for cam in self.policy.config.cameras)]
        no_pad = torch.zeros(best.shape[:2], dtype=torch.bool, device=self.device)
        actor = {k: torch.as_tensor(batch[k]).to(self.device) for k in keys}
        actor["action_is_pad"] = torch.as_tensor(batch.get("action_is_pad", no_pad)).to(self.device)
        weights = self.params.bc_weight * stale * rejection_factors(self.params.rejection, batch)
        if not distill:
            return actor, weights
        chosen = {**actor, "actions": self.policy.normalizer.unnormalize_action(best), "action_is_pad": no_pad}
        actor = {k: torch.cat([actor[k], chosen[k]]) for k in actor}
        return actor, torch.cat([weights, torch.full_like(weights, self.params.distill_weight)])

    # ------------------------------------------------------------ helpers

    @torch.no_grad()
    def sample_candidates(self, context: torch.Tensor) -> torch.Tensor:
        """N normalised chunks per context from the flow policy: [N, B, H, A], noise from our generator."""
        n, b = self.params.num_candidates, context.shape[0]
        noise = torch.randn((n * b, self.policy.chunk_size, self.policy.action_dim), generator=self.generator)
        chunks = self.policy.sample(context.repeat(n, 1, 1), noise.to(self.device),
                                    self.params.candidate_integration_steps)
        return chunks.reshape(n, b, *chunks.shape[1:])

    @staticmethod
    def _score(critic: ChunkQEnsemble, features: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Q of every candidate chunk: candidates [N, B, H, A] -> [ensemble, N, B]."""
        n, b = candidates.shape[:2]
        q = critic(features.repeat(n, 1), candidates.reshape(n * b, *candidates.shape[2:]))
        return q.reshape(q.shape[0], n, b)
