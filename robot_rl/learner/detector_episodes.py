"""What the success detector learns from and says, without its model: labelled episodes, the frames
it reads from them at its input size, its verdicts and calibrations.

Apart from ``robot_rl.learner.detector`` (LeRobot's classifier, transformers, scikit-learn) because the
learner takes verdicts, resizes every arriving frame and keeps labelled episodes from its start, but
fits a model only once a task has ``min_labelled`` verdicts: importing the model's libraries costs a
learner 6-7 s of CPU, which would otherwise lengthen every start and every restart after a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from robot_rl.learner.detector_config import DetectorConfig

# LeRobot's ``OBS_IMAGE``: the classifier reads its image inputs under this prefix. Written out, not
# imported: ``lerobot.utils`` costs 2.6 s to import (a test holds the two equal).
IMAGE_KEY_PREFIX = "observation.image"
START_SUFFIX = "_start"  # the classifier input that holds a camera's first frame of the episode


@dataclass(frozen=True)
class Verdict:
    """The detector's judgement of one episode."""

    success: bool
    confidence: float  # 0.5..1: how far the score lies on its side of the threshold (1: at 0 or 1)
    sure: bool  # outside the calibrated margin: may stand in for a person's verdict
    score: float  # the classifier's probability of success (mean over its heads and the last frames)


@dataclass
class LabelledEpisode:
    """An episode someone (an operator, the sim's task) judged, as the detector learns from it."""

    task: str
    frames: Mapping[str, np.ndarray]  # camera -> uint8 [T, H, W, 3]
    success: bool
    is_intervention: np.ndarray | None = None  # bool [T]: a human drove that tick


@dataclass(frozen=True)
class Calibration:
    """What fitting one task's detector found on its labelled episodes' out-of-fold scores."""

    threshold: float  # score at or above which an episode is judged a success
    margin: float  # how far from the threshold a verdict is sure (inf: never)
    # Share of the labelled episodes judged right when each one's out-of-fold score meets a threshold
    # set without its fold's verdicts (``cross_validated_accuracy``): an estimate for unseen episodes,
    # unlike the accuracy on the very scores the threshold was tuned on.
    heldout_accuracy: float
    heldout_episodes: int  # episodes scored out of fold (all labelled ones)
    trained_episodes: int  # episodes the judging head was fit on (all labelled ones)
    folds: int


@dataclass
class TrainingSamples:
    """Classifier inputs and labels, frames resized: input key -> uint8 [N, S, S, 3]; labels float [N]."""

    images: dict[str, np.ndarray]
    labels: np.ndarray

    @staticmethod
    def concat(parts: Sequence[TrainingSamples]) -> TrainingSamples:
        keys = parts[0].images
        return TrainingSamples({k: np.concatenate([p.images[k] for p in parts]) for k in keys},
                               np.concatenate([p.labels for p in parts]))


# ---------------------------------------------------------------- frames -> classifier inputs


def input_keys(config: DetectorConfig) -> list[str]:
    """The classifier's image inputs: each camera's frame, then (``compare_with_start``) its first frame."""
    keys = [f"{IMAGE_KEY_PREFIX}.{cam}" for cam in config.cameras]
    if config.compare_with_start:
        keys += [f"{IMAGE_KEY_PREFIX}.{cam}{START_SUFFIX}" for cam in config.cameras]
    return keys


def resize(frames: np.ndarray, size: int) -> np.ndarray:
    """uint8 [N, H, W, 3] -> uint8 [N, size, size, 3] (area-averaged, as a camera at that size would see).
    OpenCV's area filter: the learner resizes every arriving frame with it, on the threads that ack robots,
    and it costs a ninth of torch's antialiased bilinear one (24 against 219 ms for 30 frames of 640x480)."""
    frames = np.asarray(frames)
    if frames.shape[1:3] == (size, size) or not len(frames):
        return frames.reshape(len(frames), size, size, 3)
    return np.stack([cv2.resize(np.ascontiguousarray(frame), (size, size), interpolation=cv2.INTER_AREA)
                     for frame in frames]).reshape(len(frames), size, size, 3)


def _frames_at(frames: Mapping[str, np.ndarray], ticks: np.ndarray, config: DetectorConfig) -> dict[str, np.ndarray]:
    """The classifier inputs for ``ticks`` of one episode (each paired with the episode's first frame)."""
    size = config.image_size
    out: dict[str, np.ndarray] = {}
    for cam in config.cameras:
        if cam not in frames:
            raise KeyError(f"the success detector reads camera {cam!r}; the episode has {sorted(frames)}")
        out[f"{IMAGE_KEY_PREFIX}.{cam}"] = resize(np.asarray(frames[cam])[ticks], size)
        if config.compare_with_start:
            start = resize(np.asarray(frames[cam])[:1], size)
            out[f"{IMAGE_KEY_PREFIX}.{cam}{START_SUFFIX}"] = np.repeat(start, len(ticks), axis=0)
    return out


def _episode_length(frames: Mapping[str, np.ndarray]) -> int:
    lengths = {len(v) for v in frames.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"episode frames must be non-empty and equally long per camera, got lengths {lengths}")
    return lengths.pop()


def verdict_ticks(length: int, config: DetectorConfig) -> np.ndarray:
    """The last frames, which carry the episode's outcome."""
    return np.arange(max(0, length - config.verdict_frames), length)


def training_samples(episode: LabelledEpisode, config: DetectorConfig) -> TrainingSamples:
    """One labelled episode's samples (see the module doc): last frames labelled with its outcome,
    early frames and the frames before each takeover negative."""
    n = _episode_length(episode.frames)
    last = verdict_ticks(n, config)
    early_end = max(1, int(n * config.early_fraction))
    early = np.unique(np.linspace(0, early_end - 1, config.early_negatives).round().astype(np.int64))
    early = early[early < last[0]]
    before_takeover: list[np.ndarray] = []
    if episode.is_intervention is not None and config.takeover_negatives:
        flags = np.asarray(episode.is_intervention, dtype=bool).reshape(-1)
        for start in np.flatnonzero(flags[1:] & ~flags[:-1]) + 1:
            lo = max(0, int(start) - config.takeover_window)
            driven = lo + np.flatnonzero(~flags[lo:start])  # ticks the policy drove
            if len(driven):
                pick = np.linspace(0, len(driven) - 1, config.takeover_negatives).round().astype(np.int64)
                before_takeover.append(driven[np.unique(pick)])
    negatives = np.unique(np.concatenate([early, *before_takeover])) if before_takeover else early
    negatives = negatives[~np.isin(negatives, last)]
    ticks = np.concatenate([last, negatives]).astype(np.int64)
    labels = np.concatenate([np.full(len(last), float(episode.success)), np.zeros(len(negatives))])
    return TrainingSamples(_frames_at(episode.frames, ticks, config), labels.astype(np.float32))


def verdict_inputs(frames: Mapping[str, np.ndarray], config: DetectorConfig) -> dict[str, np.ndarray]:
    """The classifier inputs an episode is judged on: its last frames."""
    return _frames_at(frames, verdict_ticks(_episode_length(frames), config), config)


@dataclass(frozen=True)
class PreparedEpisode:
    """A labelled episode reduced to what fitting reads (resized frames): kept in memory by an online
    learner instead of whole episodes, and fit again and again without resizing anew."""

    success: bool
    samples: TrainingSamples
    verdict_inputs: dict[str, np.ndarray]


def prepare(episode: LabelledEpisode, config: DetectorConfig) -> PreparedEpisode:
    return PreparedEpisode(bool(episode.success), training_samples(episode, config),
                           verdict_inputs(episode.frames, config))
