"""Synthetic labelled episodes for the success detector's tests: a "place" a detector can learn in seconds."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from robot_rl.learner.detector_episodes import LabelledEpisode

SIZE = 48  # camera frames (resized to the detector's input size)
TICKS = 12


def synthetic_episode(rng: np.random.Generator, success: bool, takeover_at: int | None = None,
                      near_miss: bool = False) -> LabelledEpisode:
    """A "cube" (bright square) starts at a random spot on the left and is carried right: in a success
    into the "bowl" strip at the right edge, in a failure only part of the way, as a place task's
    frames would show; a ``near_miss`` failure stops just short of the bowl."""
    start = np.array([rng.integers(4, 36), rng.integers(2, 12)])
    reach = (34, 38) if success else (27, 31) if near_miss else (14, 26)
    end = np.array([rng.integers(4, 36), rng.integers(*reach)])
    frames = np.full((TICKS, SIZE, SIZE, 3), 40, dtype=np.uint8)
    frames += rng.integers(0, 20, size=frames.shape, dtype=np.uint8)  # sensor noise
    for t in range(TICKS):
        y, x = np.round(start + (end - start) * min(1.0, t / (TICKS - 4))).astype(int)
        frames[t, y:y + 8, x:x + 8] = (220, 60, 60)
    flags = None
    if takeover_at is not None:
        flags = np.zeros(TICKS, dtype=bool)
        flags[takeover_at:] = True
    return LabelledEpisode("place", {"front": frames}, success, flags)


def episodes(seed: int, count: int) -> list[LabelledEpisode]:
    rng = np.random.default_rng(seed)
    return [synthetic_episode(rng, success=bool(i % 2)) for i in range(count)]


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """The classifier's trainable part is tiny: on a shared box, more threads per op only wait on each
    other (a fit takes 20x longer with two threads under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
