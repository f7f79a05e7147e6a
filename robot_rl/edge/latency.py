"""Simulated inference latency, so a 2-core CPU in virtual time can stand in for a slow VLA.

Distributions (all seeded, so benchmarks are reproducible):
  constant   always ``mean_ms``
  uniform    uniform in [mean - jitter, mean + jitter], floored at 0
  lognormal  median ``mean_ms``, multiplicative spread sigma = jitter / mean (long right
             tail, like a GPU that sometimes gets preempted)
  measured   the policy's real compute time (``compute_s`` passed to ``sample_s``)
"""

from __future__ import annotations

import math

import numpy as np

from robot_rl.edge.config import LATENCY_DISTRIBUTIONS, EdgeConfig


class LatencyModel:
    """Draws the latency of one simulated inference, in seconds."""

    def __init__(self, mean_ms: float = 0.0, jitter_ms: float = 0.0, distribution: str = "constant", seed: int = 0):
        if distribution not in LATENCY_DISTRIBUTIONS:
            raise ValueError(f"latency distribution must be one of {LATENCY_DISTRIBUTIONS}, got {distribution!r}")
        if mean_ms < 0 or jitter_ms < 0:
            raise ValueError(f"latency mean and jitter must be >= 0 ms, got {mean_ms} and {jitter_ms}")
        if distribution == "lognormal" and mean_ms == 0:
            raise ValueError("a lognormal latency needs simulated_latency_ms > 0 (it is the median)")
        self.mean_ms = mean_ms
        self.jitter_ms = jitter_ms
        self.distribution = distribution
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_config(cls, config: EdgeConfig) -> LatencyModel:
        return cls(config.simulated_latency_ms, config.latency_jitter_ms, config.latency_distribution,
                   config.latency_seed)

    def sample_s(self, compute_s: float = 0.0) -> float:
        if self.distribution == "measured":
            return max(0.0, compute_s)
        if self.distribution == "constant" or self.jitter_ms == 0:
            ms = self.mean_ms
        elif self.distribution == "uniform":
            ms = self._rng.uniform(self.mean_ms - self.jitter_ms, self.mean_ms + self.jitter_ms)
        else:  # lognormal
            sigma = self.jitter_ms / self.mean_ms
            ms = self.mean_ms * math.exp(sigma * self._rng.standard_normal())
        return max(0.0, float(ms)) / 1000.0
