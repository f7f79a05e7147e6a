"""State-offset augmentation: teach the policy to use a rolled-forward state with a current image.

At run time the edge does not give the policy the measured joint state but the state the
arm will be in when the new chunk starts: the commanded target ``d`` ticks ahead (see
robot_rl/edge/node.py's docstring). The image is still the current one. A training sample at time
``t`` with offset ``o`` mimics exactly that:

    state  = action[t + o - 1]        (the commanded position o ticks ahead; the measured
                                        state[t] when o == 0)
    chunk  = action[t + o : t + o + H] (what to do from the moment the chunk starts)
    images = images[t]                 (what the camera sees now)

Steps past the episode end repeat the last action and are flagged ``action_is_pad`` so they
carry no loss. Offsets are clipped so at least one target step is real.

Robot episodes also say where the runtime *held* the arm (no chunk to execute yet: a stall,
or the wait for the first chunk after a hand-back). A held command is the runtime's, not the
policy's: a chunk that runs into one is cut there (the rest is padding), so the policy never
learns to freeze mid-task from its own recorded episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_rl.policies.base import ObservationHistory


@dataclass(frozen=True)
class OffsetIndices:
    """Where one augmented sample reads from in its episode (all indices into [0, T))."""

    state_from_action: bool  # True: state = action[state_index]; False: state = state[state_index]
    state_index: int
    image_index: int
    action_indices: np.ndarray  # [H] int, clamped to T - 1
    action_is_pad: np.ndarray  # [H] bool, True past the episode end

    @property
    def offset(self) -> int:
        return int(self.action_indices[0]) - self.image_index


def offset_indices(episode_length: int, t: int, offset: int, chunk_size: int) -> OffsetIndices:
    """Indices for the sample at time ``t`` with state offset ``offset`` (clipped to the episode)."""
    if not 0 <= t < episode_length:
        raise IndexError(f"t={t} is outside the episode [0, {episode_length})")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    offset = min(offset, episode_length - 1 - t)  # keep the first target step inside the episode
    start = t + offset
    raw = np.arange(start, start + chunk_size)
    if offset == 0:
        state_from_action, state_index = False, t
    else:
        state_from_action, state_index = True, start - 1
    return OffsetIndices(
        state_from_action=state_from_action,
        state_index=state_index,
        image_index=t,
        action_indices=np.minimum(raw, episode_length - 1),
        action_is_pad=raw >= episode_length,
    )


def build_sample(episode: dict, t: int, offset: int, chunk_size: int, cameras: tuple[str, ...],
                 history: ObservationHistory | None = None) -> dict:
    """One training sample (numpy) from an episode dict with 'state', 'action', 'images.<cam>'; ``chunk_size``
    target actions, ``history.past_actions`` of them before the chunk start (None: the current observation only)."""
    history = history or ObservationHistory()
    future = chunk_size - history.past_actions
    if future < 1:
        raise ValueError(f"a target of {chunk_size} actions leaves none after {history.past_actions} past ones")
    idx = offset_indices(len(episode["action"]), t, offset, future)
    source = episode["action"] if idx.state_from_action else episode["state"]
    is_pad = idx.action_is_pad
    held = episode.get("held")
    if held is not None:
        is_pad = is_pad | (np.cumsum(np.asarray(held, dtype=bool)[idx.action_indices]) > 0)
    sample = {
        "state": np.asarray(source[idx.state_index], dtype=np.float32),
        "actions": np.asarray(episode["action"][idx.action_indices], dtype=np.float32),
        "action_is_pad": is_pad,
        "offset": idx.offset,
    }
    for cam in cameras:
        sample[f"images.{cam}"] = episode[f"images.{cam}"][idx.image_index]
    if history.past_actions:
        before = int(idx.action_indices[0]) - np.arange(history.past_actions, 0, -1)
        past_pad = before < 0
        before = np.maximum(before, 0)
        if held is not None:
            past_pad = past_pad | np.asarray(held, dtype=bool)[before]
        sample["actions"] = np.concatenate([np.asarray(episode["action"][before], dtype=np.float32),
                                            sample["actions"]])
        sample["action_is_pad"] = np.concatenate([past_pad, sample["action_is_pad"]])
    if history.steps > 1:
        past = np.maximum(t - np.arange(history.steps - 1, 0, -1), 0)
        sample["past.state"] = np.asarray(episode["state"][past], dtype=np.float32)
        for cam in cameras:
            sample[f"past.images.{cam}"] = episode[f"images.{cam}"][past]
    return sample


def offset_probabilities(max_offset: int, weights: tuple[float, ...] | None = None) -> np.ndarray:
    """Probability of each offset 0..max_offset: uniform unless ``weights`` are given."""
    if weights is None:
        return np.full(max_offset + 1, 1.0 / (max_offset + 1))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (max_offset + 1,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"offset weights must be {max_offset + 1} non-negative numbers with a positive sum, "
                         f"got {weights}")
    return w / w.sum()


def sample_offsets(rng: np.random.Generator, n: int, max_offset: int,
                   weights: tuple[float, ...] | None = None) -> np.ndarray:
    """Draw ``n`` offsets independently (one per sample)."""
    return rng.choice(max_offset + 1, size=n, p=offset_probabilities(max_offset, weights))
