"""The ChunkPolicy protocol: observation + state + instruction -> H future actions.

Chunked prediction is what makes asynchronous control possible: while the robot
executes one chunk, the next is being computed. The state argument is separate
from the observation so the edge can pass a *rolled-forward* state (where the arm
will be when the chunk starts) together with the current images.
"""

from __future__ import annotations

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
