"""The ChunkPolicy protocol: observation + state + instruction -> H future actions.

Chunked prediction is what makes asynchronous control possible: while the robot
executes one chunk, the next is being computed. The state argument is separate
from the observation so the edge can pass a *rolled-forward* state (where the arm
will be when the chunk starts) together with the current images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


class InvalidChunkError(ValueError):
    """A predicted chunk that must not be executed (NaN/inf, wrong shape)."""


@runtime_checkable
class ChunkPolicy(Protocol):
    # Read-only: a policy may hold them as plain attributes or as properties (FlowVLA's come from its config).
    @property
    def chunk_size(self) -> int:
        """H, actions per chunk."""
        ...

    @property
    def action_dim(self) -> int: ...

    def predict_chunk(
        self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str
    ) -> np.ndarray:
        """Images by camera name (uint8 HxWx3), joint state (float32[action_dim]) -> float32[H, action_dim]."""
        ...

    def save_pretrained(self, directory: str | Path) -> None: ...


@runtime_checkable
class GuidedChunkPolicy(ChunkPolicy, Protocol):
    """A flow policy that can be guided onto a frozen prefix: real-time chunking (``edge.real_time_chunking``)."""

    def predict_chunk_guided(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                             prefix: np.ndarray, delay: int) -> np.ndarray:
        """A chunk starting now whose first ``delay`` actions agree with ``prefix`` [T, action_dim]."""
        ...


@dataclass(frozen=True)
class ObservationHistory:
    """How many observations a policy reads per prediction, and how its training target lines up with them
    (LeRobot's ``n_obs_steps``, ``observation_delta_indices`` and ``action_delta_indices``).

    ``steps`` observations one control tick apart, the newest last: the edge keeps the ones it saw at the
    ticks before a request, the learner's sampler the ones recorded before a sampled step. Diffusion Policy
    also regresses the action at each earlier observation (its target starts ``steps - 1`` ticks before
    the chunk, and it executes from the current observation on): ``past_actions``.
    """

    steps: int = 1
    past_actions: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.past_actions < 0:
            raise ValueError(f"ObservationHistory: steps must be >= 1 and past_actions >= 0, got {self}")


@dataclass(frozen=True)
class PastObservation:
    """What the robot saw at a tick before a request: its images by camera and its measured joint state."""

    images: dict[str, np.ndarray] = field(repr=False)
    state: np.ndarray = field(repr=False)


@runtime_checkable
class HistoryChunkPolicy(ChunkPolicy, Protocol):
    """A policy that reads the observations of the ticks before the request too (``observation_history``)."""

    @property
    def observation_history(self) -> ObservationHistory: ...

    def predict_chunk_with_history(self, history: Sequence[PastObservation], observation: dict[str, np.ndarray],
                                   state: np.ndarray, instruction: str) -> np.ndarray:
        """``predict_chunk`` from the observations of the ticks before (oldest first; fewer than
        ``observation_history.steps - 1`` at an episode's start) and the request's own."""
        ...


def validate_chunk(chunk: object, horizon: int | None, action_dim: int) -> np.ndarray:
    """Return ``chunk`` as float32[H, action_dim] or raise InvalidChunkError saying why."""
    arr = np.asarray(chunk, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != action_dim or (horizon is not None and arr.shape[0] != horizon):
        want = f"[{horizon if horizon is not None else 'H'}, {action_dim}]"
        raise InvalidChunkError(f"chunk has shape {tuple(arr.shape)}, expected {want}")
    if arr.shape[0] == 0:
        raise InvalidChunkError("chunk is empty")
    if not np.isfinite(arr).all():
        raise InvalidChunkError("chunk contains NaN/inf; it was rejected and not executed")
    return arr
