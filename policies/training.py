"""Supervised (optionally weighted) training of a trainable policy on in-memory episodes.

``fit`` is the small, dependable loop used by behaviour cloning and by reward-weighted
fine-tuning (episodes carry a ``weight``): AdamW, warm-up then cosine or constant LR,
gradient clipping, tqdm progress. Normalisation statistics are taken from the episodes
the first time a policy is trained, and kept afterwards so fine-tuned weights stay
compatible with the running robots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from robot_rl.policies.episodes import EpisodeSampler
from robot_rl.policies.trainable import TrainablePolicy


def auto_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the base LR at ``step``: linear warm-up, then constant or cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")


def fit(
    policy: TrainablePolicy,
    episodes: Sequence[dict],
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-4,
    device: str | torch.device | None = None,
    seed: int = 0,
    progress: bool = True,
    log_every: int = 50,
    *,
    weight_decay: float = 1e-4,
    grad_clip: float = 1.0,
    schedule: str = "cosine",
    warmup_steps: int = 0,
) -> dict:
    """Train ``policy`` in place on ``episodes`` for ``steps`` optimiser steps; return training stats.

    The policy is left on ``device`` (default: ``auto_device()``) in eval mode. Returned
    stats: ``losses`` (mean loss per logging window), ``initial_loss``, ``final_loss``,
    ``steps``, ``seconds``, ``steps_per_s``, ``device``, ``batch_size``.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    device = torch.device(device) if device is not None else auto_device()
    torch.manual_seed(seed)
    sampler = EpisodeSampler(episodes, policy, seed=seed)
    if policy.needs_statistics():
        policy.fit_statistics(*sampler.all_states_and_actions(), [ep["instruction"] for ep in sampler.episodes])
    policy.to(device).train()

    trainable = list(policy.trainable_parameters())
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps, warmup_steps, schedule))

    window: list[float] = []
    logged: list[float] = []
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=f"fit {type(policy).__name__}", disable=not progress, dynamic_ncols=True)
    for step in bar:
        batch = sampler.sample(batch_size)
        loss, _ = policy.compute_loss(batch, batch.pop("weight"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
        optimizer.step()
        scheduler.step()
        window.append(loss.item())
        if len(window) == log_every or step == steps - 1:
            logged.append(float(np.mean(window)))
            window.clear()
            bar.set_postfix(loss=f"{logged[-1]:.4f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
    seconds = time.perf_counter() - start
    policy.eval()
    return {
        "losses": logged,
        "initial_loss": logged[0],
        "final_loss": logged[-1],
        "steps": steps,
        "batch_size": batch_size,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "device": str(device),
    }
