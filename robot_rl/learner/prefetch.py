"""The next training batch, drawn while the current update runs.

Why: a batch's frames may have to be read back from the dataset (episodes whose frames left the
sampling index's memory: decoded on ``FrameReader``'s worker processes), and copying frames into a
batch takes time of its own; done while the model updates, an update never waits for either in
steady state. On CUDA the batch's tensors are pinned, so their copy to the GPU is a DMA the host
does not wait for.

Exactness: a batch is a function of the index's content and the sampler's generator state when it
is drawn. The prefetcher remembers the generator state from before the batch it holds, so a
checkpoint records the state that draws the next batch the trainer will train on
(``next_rng_state``), and a learner resumed from it draws that same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch


def pin_batch(batch: dict) -> dict:
    """The batch with its tensors in page-locked memory (for a non-blocking copy to a GPU)."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class BatchPrefetcher:
    """Holds at most one batch drawn ahead, by ``draw(rng)`` on a thread of its own."""

    def __init__(self, draw: Callable[[np.random.Generator], dict], rng: np.random.Generator, *, pin: bool) -> None:
        self._draw = draw
        self._rng = rng
        self._pin = pin
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainer-prefetch")
        self._pending: Future[dict] | None = None
        self._state_before: dict[str, Any] | None = None  # the generator's state before the pending batch

    def next(self) -> dict:
        """The batch drawn ahead (or one drawn now), and the one after it starts drawing."""
        if self._pending is not None:
            pending, self._pending, self._state_before = self._pending, None, None
            batch = pending.result()  # a failed draw raises here, as drawing in place would
        else:
            batch = self._drawn()
        self._state_before = dict(self._rng.bit_generator.state)
        self._pending = self._pool.submit(self._drawn)
        return batch

    def _drawn(self) -> dict:
        batch = self._draw(self._rng)
        return pin_batch(batch) if self._pin else batch

    def next_rng_state(self) -> dict[str, Any]:
        """The generator state that draws the next batch the trainer will get (what a checkpoint records)."""
        if self._pending is not None and self._state_before is not None:
            return dict(self._state_before)
        return dict(self._rng.bit_generator.state)

    def discard(self) -> None:
        """Drop the batch drawn ahead and put the generator back where it was before it (a resume sets a new
        state, or the index's content changed in a way the batch must see)."""
        if self._pending is None:
            return
        wait([self._pending])  # its draw has finished with the generator (a failed one is dropped with it)
        assert self._state_before is not None
        self._rng.bit_generator.state = self._state_before
        self._pending, self._state_before = None, None
