"""Learning algorithms the trainer can run, by name (``trainer.algorithm`` in the config)."""

from __future__ import annotations

import torch

from robot_rl.policies.flow_vla import FlowVLA
from robot_rl.learner.algorithms.awr import AWR
from robot_rl.learner.algorithms.base import Algorithm
from robot_rl.learner.algorithms.bc import WeightedBC
from robot_rl.learner.algorithms.rl import ChunkQLearning
from robot_rl.learner.algorithms.rwr import RWR
from robot_rl.learner.config import TrainerConfig

ALGORITHMS: dict[str, type[Algorithm]] = {"bc": WeightedBC, "rwr": RWR, "awr": AWR, "rl": ChunkQLearning}


def make_algorithm(policy: FlowVLA, config: TrainerConfig, device: torch.device) -> Algorithm:
    try:
        cls = ALGORITHMS[config.algorithm]
    except KeyError:
        raise ValueError(f"unknown trainer.algorithm {config.algorithm!r}; available: {sorted(ALGORITHMS)}") from None
    return cls(policy, config, device)


__all__ = ["ALGORITHMS", "AWR", "RWR", "Algorithm", "ChunkQLearning", "WeightedBC", "make_algorithm"]
