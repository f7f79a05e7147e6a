"""Reward-weighted regression on the flow-matching loss: the Hi-ORS recipe.

Hi-ORS (human-in-the-loop online rejection sampling) fine-tunes a VLA with plain
supervised learning on its own rollouts, filtered and weighted by outcome:

- rejection sampling: policy-driven steps of failed episodes are dropped (or down-weighted);
- human corrections (intervention segments) are weighted up: they show what to do exactly
  where the policy went wrong (as in HG-DAgger);
- the policy's own kept steps are weighted by exp(R / beta) of their episode's return R
  (reward-weighted regression, Peters & Schaal 2007, weights whole rollouts by their return),
  normalised to mean 1 over the kept samples and clipped, so a few lucky samples cannot take
  over the batch. The episode's return, not the step's return-to-go: with a discounted success
  reward the return-to-go grows towards the end of every successful episode, so weighting by
  it would teach the last few centimetres of a push more than the approach that decides it.
- human and demonstration steps are expert labels and get their stream's multiplier alone
  (``score_streams``): the return of the episode a correction belongs to carries the takeover
  penalty the *policy's* mistake earned, and weighting the correction by it would suppress
  exactly the steps that show how to recover (it gave corrections a quarter of a
  demonstration's weight, BENCHMARKS.md "learning").

The effective sample size of the weights is logged to show how far the update is from plain
behaviour cloning (ESS = batch size).

This module also holds what the three weighted algorithms share (``WeightedFlowAlgorithm``):
the staleness bound, rejection of failed attempts, and the guarded weighted policy step.
Their settings are in ``robot_rl.learner.algorithms.config``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from robot_rl.core.types import VerdictSource, source_code
from robot_rl.learner.algorithms.bc import WeightedBC
from robot_rl.learner.algorithms.config import RejectionConfig, RWRConfig, StalenessConfig
from robot_rl.learner.config import TrainerConfig
from robot_rl.learner.staleness import StalenessBound
from robot_rl.learner.streams import STREAMS
from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)

ONLINE, INTERVENTION, DEMONSTRATION = (STREAMS.index(s) for s in ("online", "intervention", "demonstration"))
DETECTOR = source_code(VerdictSource.detector)  # ``episode_success_source`` of a success detector's verdict


# ---------------------------------------------------------------- weights


def effective_sample_size(weights: torch.Tensor) -> float:
    """(sum w)^2 / sum w^2 (Kish): B for equal weights, 1 when a single sample carries all weight."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    total_sq = float(w.pow(2).sum())
    return float(w.sum()) ** 2 / total_sq if total_sq > 0 else 0.0


def exponential_weights(scores: torch.Tensor, beta: float, max_weight: float,
                        log_factors: torch.Tensor | None = None) -> torch.Tensor:
    """w_i ∝ exp(s_i / beta) * factor_i, normalised to mean 1 over w > 0, then clipped at ``max_weight``.

    ``log_factors`` (log of per-sample multipliers, -inf = rejected) enter the exponent so
    that very small or large scores never overflow. All samples rejected -> all zeros.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    logits = torch.as_tensor(scores, dtype=torch.float64) / beta
    if log_factors is not None:
        logits = logits + torch.as_tensor(log_factors, dtype=torch.float64)
    kept = torch.isfinite(logits)
    weights = torch.zeros_like(logits)
    if kept.any():
        weights[kept] = torch.exp(logits[kept] - logits[kept].max())
        weights[kept] = weights[kept] / weights[kept].mean()
    return weights.clamp(max=max_weight).to(torch.float32)


def weight_metrics(weights: torch.Tensor, prefix: str = "") -> dict[str, float]:
    ess = effective_sample_size(weights)
    return {f"{prefix}ess": ess, f"{prefix}ess_fraction": ess / max(len(weights), 1),
            f"{prefix}weight_max": float(weights.max()) if len(weights) else 0.0,
            f"{prefix}kept_fraction": float((weights > 0).float().mean()) if len(weights) else 0.0}


# ---------------------------------------------------------------- shared base


class BoundedParams(Protocol):
    """The params of a weighted algorithm: they carry its staleness bound."""

    staleness: StalenessConfig


class WeightedFlowAlgorithm[BoundedT: BoundedParams](WeightedBC[BoundedT]):
    """A weighted flow-matching policy step plus the staleness bound of ``params.staleness``;
    subclasses choose the weights."""

    def __init__(self, params: BoundedT, policy: TrainablePolicy, config: TrainerConfig, device: torch.device) -> None:
        super().__init__(params, policy, config, device)
        self.staleness = StalenessBound(params.staleness)

    def set_policy_version(self, version: int) -> None:
        """The trainer calls this after each publish: staleness is measured against it."""
        self.staleness.current_version = int(version)

    def base_weights(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """The sampler's own per-sample ``weight`` (1 if absent) times the staleness bound's."""
        stale, metrics = self.staleness(batch)
        incoming = batch.get("weight")
        if incoming is not None:
            stale = stale * torch.as_tensor(incoming, dtype=torch.float32).cpu()
        return stale, metrics

    def policy_step(self, batch: dict[str, Any], weights: torch.Tensor) -> dict[str, float]:
        """One weighted flow-matching step; skipped (no optimiser state change) when every weight is 0."""
        weights = weights.detach().to(torch.float32).cpu()
        metrics = weight_metrics(weights)
        if float(weights.sum()) <= 0:
            # Still draw the loss's randomness so the generator advances exactly as in a normal update.
            self.draw_randomness(batch)
            return {"loss": 0.0, "grad_norm": 0.0, "loss_max": 0.0, "skipped": 1.0, **metrics}
        return {**super().update({**batch, "weight": weights}), "skipped": 0.0, **metrics}


def _warn_once(owner: object, key: str, message: str) -> None:
    seen = owner.__dict__.setdefault("_warned", set())
    if key not in seen:
        seen.add(key)
        log.warning(message)


# ---------------------------------------------------------------- RWR


def outcome_factors(stream: torch.Tensor, success: torch.Tensor | None, finished: torch.Tensor | None,
                    failures: str, failure_weight: float = 0.1, drop_unfinished: bool = True,
                    verdicts: torch.Tensor | None = None) -> torch.Tensor:
    """Rejection sampling's multipliers [B] (float64): online steps of failed episodes get 0 ("drop"),
    ``failure_weight`` ("downweight") or 1 ("keep"); online steps whose outcome is unknown (the episode
    runs on, or ended with nobody to judge it) get 0 when ``drop_unfinished``. ``verdicts``
    (``verdict_factors``) then scales online steps of finished episodes by how sure their verdict is.
    Human and demonstration steps always get 1."""
    stream = torch.as_tensor(stream, dtype=torch.int64)
    factors = torch.ones(len(stream), dtype=torch.float64)
    online = stream == ONLINE
    finished = torch.ones_like(online) if finished is None else torch.as_tensor(finished, dtype=torch.bool)
    if drop_unfinished:
        factors[online & ~finished] = 0.0
    if success is not None and failures != "keep":
        failed = online & finished & ~torch.as_tensor(success, dtype=torch.bool)
        factors[failed] *= 0.0 if failures == "drop" else failure_weight
    if verdicts is not None:
        judged = online & finished
        factors[judged] *= torch.as_tensor(verdicts, dtype=torch.float64)[judged]
    return factors


def verdict_factors(batch: dict[str, Any], min_confidence: float) -> torch.Tensor | None:
    """Per-sample multipliers [B] (float64) of the episodes' verdicts: a success detector's verdict counts
    as much as its confidence, or not at all below ``min_confidence``; a person's or the task's fully.
    None when the batch says nothing of who judged (every verdict then counts fully)."""
    if "episode_success_source" not in batch or "episode_success_confidence" not in batch:
        return None
    source = torch.as_tensor(batch["episode_success_source"], dtype=torch.int64)
    confidence = torch.as_tensor(batch["episode_success_confidence"], dtype=torch.float64)
    factors = torch.ones(len(source), dtype=torch.float64)
    detector = source == DETECTOR
    factors[detector] = torch.where(confidence[detector] >= min_confidence, confidence[detector], 0.0)
    return factors


def batch_outcomes(batch: dict[str, Any], rescued_is_failure: bool) -> torch.Tensor | None:
    """Per-sample success used for rejection: the policy's own (autonomous) one unless told otherwise."""
    if rescued_is_failure and "autonomous_success" in batch:
        return batch["autonomous_success"]
    return batch.get("episode_success")


def rejection_factors(rejection: RejectionConfig, batch: dict[str, Any]) -> torch.Tensor:
    """Multipliers [B] (float32) of ``rejection``: 0 for rejected online steps, 1 for the rest
    (unknown outcome: kept only when failures are kept)."""
    return outcome_factors(batch["stream"], batch_outcomes(batch, rejection.rescued_is_failure),
                           batch.get("episode_finished"), rejection.failures, rejection.failure_weight,
                           drop_unfinished=rejection.failures != "keep",
                           verdicts=verdict_factors(batch, rejection.min_detector_confidence)).to(torch.float32)


def rwr_weights(scores: torch.Tensor, stream: torch.Tensor, success: torch.Tensor | None,
                finished: torch.Tensor | None, config: RWRConfig, verdicts: torch.Tensor | None = None) -> torch.Tensor:
    """Hi-ORS weights [B]: rejection of failed online steps, stream multipliers, and clipped
    exp(R / beta) (mean 1 over the kept samples of ``config.score_streams``); ``verdicts``
    (``verdict_factors``) weighs each online step by how sure its episode's verdict is."""
    factors = outcome_factors(stream, success, finished, config.failures, config.failure_weight,
                              config.drop_unfinished, verdicts)
    stream = torch.as_tensor(stream, dtype=torch.int64)
    factors[stream == INTERVENTION] *= config.intervention_weight
    factors[stream == DEMONSTRATION] *= config.demonstration_weight
    scored = torch.zeros(len(stream), dtype=torch.bool)
    for name in config.score_streams:
        scored |= stream == STREAMS.index(name)
    weights = factors.to(torch.float32)
    if scored.any():
        scores = torch.as_tensor(scores, dtype=torch.float32)
        weights[scored] = exponential_weights(scores[scored], config.beta, config.max_weight,
                                              torch.log(factors[scored]))
    return weights


class RWR(WeightedFlowAlgorithm[RWRConfig]):
    """Reward-weighted regression on the flow-matching loss (Hi-ORS). Uses batch fields
    ``stream``, ``return`` (else ``reward``), ``autonomous_success`` (or ``episode_success``),
    ``episode_finished``, ``policy_version``, and ``episode_success_source`` / ``_confidence``."""

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        stale, stale_metrics = self.base_weights(batch)
        success = batch_outcomes(batch, self.params.rescued_is_failure)
        weights = rwr_weights(self._scores(batch), batch["stream"], success, batch.get("episode_finished"),
                              self.params, verdict_factors(batch, self.params.min_detector_confidence))
        if success is None:
            _warn_once(self, "success", "rwr: batches carry no 'episode_success' field; failed episodes cannot be "
                                        "rejected (add robot_rl.learner.rewards.transition_fields to the sampler)")
        metrics = self.policy_step(batch, weights * stale)
        if success is not None:
            metrics["batch_success_fraction"] = float(torch.as_tensor(success, dtype=torch.float32).mean())
        return {**metrics, **stale_metrics}

    def _scores(self, batch: dict[str, Any]) -> torch.Tensor:
        field = "episode_return" if self.params.score == "episode_return" else "return"
        if field in batch:
            return torch.as_tensor(batch[field], dtype=torch.float32)
        if "return" in batch:
            _warn_once(self, field, f"rwr: batches carry no {field!r} field; weighting by the return-to-go")
            return torch.as_tensor(batch["return"], dtype=torch.float32)
        _warn_once(self, "return", "rwr: batches carry no 'return' field; weighting by the per-step 'reward' "
                                   "instead (add robot_rl.learner.rewards.transition_fields to the sampler)")
        return torch.as_tensor(batch["reward"], dtype=torch.float32)


def require_fields(batch: dict[str, Any], names: tuple[str, ...], who: str) -> None:
    """Fail early, naming every missing per-sample field and where it comes from."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise KeyError(f"{who} needs batch field(s) {missing}; the sampler adds them with "
                       "robot_rl.learner.rewards.transition_fields")
