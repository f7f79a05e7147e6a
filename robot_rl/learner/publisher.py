"""Turn the trainer's weights into versioned wire snapshots (safetensors + sha256).

Separate from the trainer so the cadence rule (every N updates or T seconds,
whichever comes first) and the serialisation can be tested without sockets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import torch

from robot_rl.bridges.zmq.weights import (
    TRANSFER_DTYPES,
    SnapshotBuffers,
    WeightsBlob,
    non_finite_tensor_in,
    snapshot_buffer,
)
from robot_rl.core.errors import ConfigError
from robot_rl.policies.trainable import published_state

log = logging.getLogger(__name__)

PublishFn = Callable[[WeightsBlob], None]


class NonFiniteWeightsError(ConfigError):
    """Weights holding NaN/inf: a robot would refuse every chunk they compute and hold its arm."""


def snapshot(policy: torch.nn.Module, version: int, config_hash: str, transfer_dtype: str = "auto",
             buffers: SnapshotBuffers | None = None) -> WeightsBlob:
    """A wire snapshot of what ``policy`` publishes (``published_state``: a frozen part stays home),
    written once into the buffer every robot is served from; floats cast to ``transfer_dtype``
    ("auto": the policy's own float type, so a bf16 policy travels in bf16 and a float32 one loses
    nothing). NaN/inf weights raise ``NonFiniteWeightsError``: a robot would refuse every chunk.
    ``buffers``: where the buffer comes from and goes back to once the server drops the version."""
    tensors = published_state(policy)
    dtype = wire_dtype(tensors.values()) if transfer_dtype == "auto" else transfer_dtype
    metadata = {"version": str(version), "config_hash": config_hash}
    buffers = buffers or SnapshotBuffers(keep_free=0)  # nothing kept: each snapshot in a fresh buffer
    data = snapshot_buffer(tensors, transfer_dtype=dtype, metadata=metadata, allocate=buffers.allocate)
    bad = non_finite_tensor_in(data)  # the bytes robots would load, cast included
    if bad is not None:
        buffers.recycle(data)
        raise NonFiniteWeightsError(f"weight {bad!r} holds NaN/inf in {dtype}; weights v{version} are not published")
    return WeightsBlob(version=version, data=data, config_hash=config_hash, dtype=dtype, on_retire=buffers.recycle)


def wire_dtype(tensors: Iterable[torch.Tensor]) -> str:
    """The float type all of ``tensors``' floats share, if it is one the wire carries; else float32."""
    kinds = {str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(TRANSFER_DTYPES) else "float32"


class PublishSchedule:
    """Decides when to publish: ``every_updates`` updates or ``every_s`` seconds since the last one."""

    def __init__(self, every_updates: int, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_updates = every_updates
        self.every_s = every_s
        self.clock = clock
        self._updates_since = 0
        self._last_s = clock()

    def note_update(self) -> bool:
        """Count one update; True if it is time to publish (the caller then calls ``published``)."""
        self._updates_since += 1
        return self._updates_since >= self.every_updates or self.clock() - self._last_s >= self.every_s

    def published(self) -> None:
        self._updates_since = 0
        self._last_s = self.clock()
