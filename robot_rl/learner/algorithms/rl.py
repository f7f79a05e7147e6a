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

The candidates come from each policy's own sampler with noise from the algorithm's generator:
FlowVLA integrates from the context tokens its critic features were pooled from (one encoding),
LeRobot's flow policies (SmolVLA, pi0, pi0.5) through their ``predict_action_chunk(noise=)``; a
policy without a flow sampler (ACT, Diffusion) is refused. A LeRobot policy's critic reads an
encoder of its own (``critic.observation_encoder``), trained with it.

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

from robot_rl.core.errors import ConfigError
from robot_rl.learner.algorithms.base import guarded_step
from robot_rl.learner.algorithms.config import RLConfig
from robot_rl.learner.algorithms.critic import (
    ChunkQEnsemble,
    ContextCriticInputs,
    CriticInputs,
    frozen_copy,
    observation_encoder,
    polyak_update,
    seeded,
)
from robot_rl.learner.algorithms.rwr import WeightedFlowAlgorithm, rejection_factors, require_fields
from robot_rl.learner.config import TrainerConfig
from robot_rl.policies.flow_vla import FlowVLA
from robot_rl.policies.trainable import TrainablePolicy

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


class FlowVLACandidates:
    """FlowVLA's sampler, integrating ``steps`` Euler steps from the context tokens the critic's
    features were pooled from (``PolicyContextEncoder``: the observation is encoded once)."""

    def __init__(self, policy: FlowVLA, steps: int | None) -> None:
        self.policy, self.steps = policy, steps
        self.noise_shape = (policy.chunk_size, policy.action_dim)

    def __call__(self, inputs: CriticInputs, noise: torch.Tensor, next_observation: bool) -> torch.Tensor:
        assert isinstance(inputs, ContextCriticInputs), "FlowVLA's critic features come with its context"
        context = inputs.next_context if next_observation else inputs.context
        return self.policy.sample(context.repeat(noise.shape[0] // context.shape[0], 1, 1), noise, self.steps)

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        return self.policy.normalizer.normalize_action(actions)

    def unnormalize(self, chunks: torch.Tensor) -> torch.Tensor:
        return self.policy.normalizer.unnormalize_action(chunks)


class LeRobotFlowCandidates:
    """A LeRobot flow policy's own sampler (SmolVLA, pi0, pi0.5: ``sample_normalized_chunks``) on the batch's
    observations repeated once per candidate; it integrates its own number of steps (``num_steps``)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.noise_shape = policy.flow_noise_shape

    def __call__(self, inputs: CriticInputs, noise: torch.Tensor, next_observation: bool) -> torch.Tensor:
        prefix = "next." if next_observation else ""
        n = noise.shape[0] // len(inputs.features)  # candidate i of sample j is row i * B + j
        keys = [f"{prefix}state", *(f"{prefix}images.{camera}" for camera in self.policy.cameras)]
        tiled: dict[str, Any] = {key: _tile(inputs.batch[key], n) for key in keys}
        tiled["instruction"] = list(inputs.batch["instruction"]) * n
        return self.policy.sample_normalized_chunks(tiled, noise, prefix)

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        return self.policy.normalize_actions(actions)

    def unnormalize(self, chunks: torch.Tensor) -> torch.Tensor:
        return self.policy.unnormalize_actions(chunks)


def _tile(rows: Any, n: int) -> torch.Tensor:
    """[B, ...] -> [n * B, ...], the B rows n times over."""
    tensor = torch.as_tensor(rows)
    return tensor.repeat(n, *([1] * (tensor.ndim - 1)))


def flow_candidates(policy: TrainablePolicy, steps: int | None) -> FlowVLACandidates | LeRobotFlowCandidates:
    """Where ``rl`` draws its candidate chunks from; a policy without a flow sampler is refused in one line."""
    if isinstance(policy, FlowVLA):
        return FlowVLACandidates(policy, steps)
    if getattr(policy, "has_flow_sampler", False):
        return LeRobotFlowCandidates(policy)
    raise ConfigError(
        f"learner algorithm 'rl' needs a policy with a flow sampler for its best-of-N candidates (policy=flow_vla, "
        f"or a LeRobot smolvla, pi0 or pi05); {type(policy).__name__} trains with learner=bc, hgdagger, rwr or awr")


class ChunkQLearning(WeightedFlowAlgorithm[RLConfig]):
    """Q-chunking critic + best-of-N distillation into the flow policy (see the module docstring)."""

    def __init__(self, params: RLConfig, policy: TrainablePolicy, config: TrainerConfig, device: torch.device) -> None:
        self.candidates = flow_candidates(policy, params.candidate_integration_steps)
        super().__init__(params, policy, config, device)
        with seeded(config.seed):
            self.encoder = observation_encoder(policy, device)  # FlowVLA's context, else an encoder of its own
            self.critic = ChunkQEnsemble(self.encoder.dim, policy.chunk_size, policy.action_dim,
                                         params.critic_hidden, params.critic_depth, params.ensemble_size)
        self.critic.to(device)
        self.critic_target = frozen_copy(self.critic)
        self.critic_parameters = [*self.critic.parameters(), *self.encoder.parameters()]
        self.critic_optimizer = torch.optim.AdamW(self.critic_parameters, lr=params.critic_lr)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "critic": self.critic_optimizer}

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {"critic": self.critic, "critic_target": self.critic_target, **self.encoder.modules()}

    # ------------------------------------------------------------ update

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        require_fields(batch, RL_FIELDS, "rl")
        stale, stale_metrics = self.base_weights(batch)
        inputs = self.encoder(batch)
        batch = inputs.batch
        data_chunks = self.candidates.normalize(torch.as_tensor(batch["actions"], dtype=torch.float32).to(self.device))

        critic_metrics = self._critic_step(inputs, data_chunks)
        best, actor_metrics = self._best_chunks(inputs, data_chunks)
        distill = int(self.critic.num_updates) > self.params.warmup_updates
        actor_batch, weights = self._actor_batch(batch, best, stale, distill)
        metrics = self.policy_step(actor_batch, weights)
        return {**metrics, **critic_metrics, **actor_metrics, **stale_metrics, "distilling": float(distill)}

    def _critic_step(self, inputs: CriticInputs, data_chunks: torch.Tensor) -> dict[str, float]:
        """Chunked TD backup of every ensemble member towards the shared clipped target."""
        def field_(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.as_tensor(inputs.batch[name], dtype=dtype).to(self.device)

        with torch.no_grad():
            next_q = self._score(self.critic_target, inputs.next_features,
                                 self.sample_candidates(inputs, next_observation=True))
            targets = chunked_td_target(field_("chunk_reward"), field_("chunk_discount"), next_q)
        mask = field_("transition_valid", torch.bool).float()
        q = self.critic(inputs.features, data_chunks)
        loss = (mask * (q - targets).pow(2)).sum() / mask.sum().clamp_min(1.0)
        guarded_step(self.critic_optimizer, loss, self.critic_parameters, self.config.grad_clip)
        polyak_update(self.critic_target, self.critic, self.params.tau)
        self.critic.num_updates += 1
        return {"critic_loss": float(loss.item()), "q_mean": float(q.detach().mean()),
                "td_target_mean": float(targets.mean())}

    @torch.no_grad()
    def _best_chunks(self, inputs: CriticInputs, data_chunks: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The highest-Q chunk per sample among N policy samples (and the recorded chunk)."""
        candidates = self.sample_candidates(inputs, next_observation=False)
        if self.params.include_data_chunk:
            candidates = torch.cat([candidates, data_chunks[None]], dim=0)
        q = self._score(self.critic, inputs.features.detach(), candidates)
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
        text = "instruction_embedding" if "instruction_embedding" in batch else "instruction"  # FlowVLA's: encoded
        keys = ["state", "actions", *(f"images.{cam}" for cam in self.policy.cameras)]
        no_pad = torch.zeros(best.shape[:2], dtype=torch.bool, device=self.device)
        actor: dict[str, Any] = {k: torch.as_tensor(batch[k]).to(self.device) for k in keys}
        actor["action_is_pad"] = torch.as_tensor(batch.get("action_is_pad", no_pad)).to(self.device)
        actor[text] = torch.as_tensor(batch[text]).to(self.device) if text != "instruction" else list(batch[text])
        weights = self.params.bc_weight * stale * rejection_factors(self.params.rejection, batch)
        if not distill:
            return actor, weights
        chosen = {**actor, "actions": self.candidates.unnormalize(best), "action_is_pad": no_pad}
        actor = {k: actor[k] + chosen[k] if isinstance(actor[k], list) else torch.cat([actor[k], chosen[k]])
                 for k in actor}
        return actor, torch.cat([weights, torch.full_like(weights, self.params.distill_weight)])

    # ------------------------------------------------------------ helpers

    @torch.no_grad()
    def sample_candidates(self, inputs: CriticInputs, next_observation: bool) -> torch.Tensor:
        """N normalised chunks per observation (the next chunk's: ``next_observation``) from the policy's own
        sampler: [N, B, H, A], noise from our generator."""
        n, b = self.params.num_candidates, len(inputs.features)
        noise = torch.randn((n * b, *self.candidates.noise_shape), generator=self.generator)
        chunks = self.candidates(inputs, noise.to(self.device), next_observation)
        return chunks.reshape(n, b, *chunks.shape[1:])

    @staticmethod
    def _score(critic: ChunkQEnsemble, features: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Q of every candidate chunk: candidates [N, B, H, A] -> [ensemble, N, B]."""
        n, b = candidates.shape[:2]
        q = critic(features.repeat(n, 1), candidates.reshape(n * b, *candidates.shape[2:]))
        return q.reshape(q.shape[0], n, b)
