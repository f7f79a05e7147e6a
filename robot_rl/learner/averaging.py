"""An exponential moving average of the policy's weights: what the learner publishes and checkpoints.

Why: the robots act with whichever weights were published last, and a single SGD iterate
carries the noise of its last few batches (32 samples each, a few of them robot steps).
Publishing the average over the last ~1 / (1 - decay) updates instead (Polyak-Ruppert
averaging, as an EMA) keeps the robots off that noise without slowing learning by more than
that horizon: at decay 0.99 and ~4 updates/s, ~25 s. Flow and diffusion policies are trained
this way (openpi fine-tunes pi0 with an EMA of decay 0.99; Diffusion Policy, Chi et al. 2023).

Gradients still go to the training weights; the average only follows them. Buffers (the
normaliser's statistics) are copied, not averaged: they are set once, not learned.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightAverage[M: nn.Module]:
    """``module`` is a frozen copy of the policy that ``update`` moves towards the training weights."""

    def __init__(self, policy: M, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the weight average's decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        self.module = copy.deepcopy(policy).eval()
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, policy: nn.Module) -> None:
        """average <- decay * average + (1 - decay) * training weights; buffers copied as they are."""
        averaged: list[torch.Tensor] = list(self.module.parameters())
        training = [p.detach() for p in policy.parameters()]
        if len(averaged) != len(training):
            raise ValueError("the weight average and the policy have different parameter lists")
        torch._foreach_lerp_(averaged, training, 1.0 - self.decay)
        for mine, theirs in zip(self.module.buffers(), policy.buffers(), strict=True):
            mine.copy_(theirs)
