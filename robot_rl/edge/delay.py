"""DelayEstimator: how many ticks pass between asking for a chunk and being able to use it.

Roll-forward needs this number *before* the chunk is computed, so it is estimated
from recent inferences. A high quantile rather than the mean: under-estimating the
delay means the rolled-forward state is behind the robot and the old chunk may run
out (a stall); over-estimating by a tick only costs a slightly earlier request.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class DelayEstimator:
    """High quantile of the last ``window`` measured delays, in ticks; a prior until then."""

    def __init__(self, window: int = 10, quantile: float = 0.9, prior_ticks: int = 3) -> None:
        if window < 1:
            raise ValueError(f"delay window must be >= 1, got {window}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"delay quantile must be in (0, 1], got {quantile}")
        if prior_ticks < 0:
            raise ValueError(f"delay prior must be >= 0 ticks, got {prior_ticks}")
        self.window = window
        self.quantile = quantile
        self.prior_ticks = prior_ticks
        self._samples: deque[int] = deque(maxlen=window)

    @property
    def samples(self) -> list[int]:
        """The measured delays in the window, oldest first."""
        return list(self._samples)

    def observe(self, delay_ticks: int) -> None:
        """Record the delay d' of one finished inference (ticks elapsed since the request)."""
        if delay_ticks < 0:
            raise ValueError(f"a measured delay cannot be negative, got {delay_ticks}")
        self._samples.append(int(delay_ticks))

    def estimate(self) -> int:
        """The delay d to plan with: the empirical quantile (an observed value), or the prior."""
        if not self._samples:
            return self.prior_ticks
        value = np.quantile(np.asarray(self._samples), self.quantile, method="inverted_cdf")
        return int(math.ceil(float(value)))

