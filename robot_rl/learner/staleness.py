"""Bounded staleness: how much a sample made by an old policy may still count.

Robots keep acting while the learner trains, so a batch mixes steps produced by many
published policy versions. Steps from a policy many versions behind describe behaviour
the current policy no longer has: their rewards and advantages are off-policy by that
much. Asynchronous RL systems (RLinf, AReaL) therefore bound the staleness: samples more
than K versions old are dropped, or here optionally down-weighted geometrically.

Only streams whose actions came from the policy are bounded (``online`` by default):
human interventions and demonstrations are not the policy's behaviour at any version.
The bound's settings are ``robot_rl.learner.algorithms.config.StalenessConfig``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from robot_rl.learner.algorithms.config import StalenessConfig
from robot_rl.learner.streams import STREAMS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StalenessResult:
    """Per-sample weight multipliers and what the bound did, for logging."""

    weights: torch.Tensor  # [B] float, 1 for fresh or exempt samples
    histogram: dict[int, int]  # staleness (versions behind) -> samples, over bounded samples of known version
    dropped: int
    downweighted: int

    def metrics(self, prefix: str = "staleness/") -> dict[str, float]:
        counts = self.histogram
        total = sum(counts.values())
        out = {f"{prefix}dropped": float(self.dropped), f"{prefix}downweighted": float(self.downweighted),
               f"{prefix}mean": sum(k * v for k, v in counts.items()) / total if total else 0.0,
               f"{prefix}max": float(max(counts, default=0))}
        out.update({f"{prefix}count_{k}": float(v) for k, v in sorted(counts.items())})
        return out


def bound_staleness(versions: torch.Tensor, current_version: int, config: StalenessConfig,
                    bounded: torch.Tensor | None = None) -> StalenessResult:
    """Weights for samples produced by policy ``versions`` when the learner is at ``current_version``.

    ``bounded`` [B] bool marks the samples the bound applies to (default: all). Samples
    of unknown version (< 0, e.g. before the first publish) are never penalised. A sample
    newer than ``current_version`` (the trainer has not noted a publish yet) counts as fresh.
    """
    versions = torch.as_tensor(versions, dtype=torch.int64).reshape(-1)
    applies = versions >= 0
    if bounded is not None:
        applies &= torch.as_tensor(bounded, dtype=torch.bool).reshape(-1)
    staleness = (current_version - versions).clamp_min(0)
    weights = torch.ones(len(versions), dtype=torch.float32)
    if config.max_staleness is None:  # unbounded: no sample is over
        over = torch.zeros_like(applies)
    else:
        over = applies & (staleness > config.max_staleness)
        if config.mode == "drop":
            weights[over] = 0.0
        else:
            weights[over] = config.decay ** (staleness[over] - config.max_staleness).to(torch.float32)
    histogram = dict(Counter(staleness[applies].tolist()))
    dropped = int(over.sum()) if config.mode == "drop" else 0
    return StalenessResult(weights=weights, histogram=histogram, dropped=dropped,
                           downweighted=int(over.sum()) - dropped)


class StalenessBound:
    """Holds the bound's config and the learner's current policy version for an algorithm.

    The trainer tells it the version of every publish (``current_version``); a batch may
    also carry ``current_policy_version``. Until either is known the bound is skipped and
    that is logged once, since it means the trainer was not wired to report versions.
    """

    def __init__(self, config: StalenessConfig) -> None:
        self.config = config
        self.current_version: int | None = None
        self._warned = False

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        n = len(batch["actions"])
        current = batch.get("current_policy_version", self.current_version)
        versions = batch.get("policy_version")
        if current is None or versions is None:
            if not self._warned and self.config.max_staleness is not None:
                missing = "batch['policy_version']" if versions is None else "the current policy version"
                log.warning("staleness bound skipped: %s is unknown (set algorithm.set_policy_version() "
                            "after each publish and give batches a 'policy_version' field)", missing)
                self._warned = True
            return torch.ones(n), {"staleness/known": 0.0}
        stream = batch.get("stream")
        bounded = None
        if stream is not None:
            allowed = torch.tensor([STREAMS.index(s) for s in self.config.streams], dtype=torch.int64)
            bounded = torch.isin(torch.as_tensor(stream, dtype=torch.int64), allowed)
        result = bound_staleness(versions, int(current), self.config, bounded)
        return result.weights, {"staleness/known": 1.0, **result.metrics()}
