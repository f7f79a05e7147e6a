"""The success detectors' labelled episodes on disk, so a restarted learner's detectors start where they were.

Why: a detector learns only from the verdicts people (or the task) gave. A learner that restarted with an
empty judge would ask its operators again about every episode until each task had ``min_labelled`` new
verdicts, and its detectors would have forgotten the hundreds they had. The store's dataset holds every
verdict, but the frames a detector reads would have to be decoded back from camera-size video; what
``prepare`` keeps of an episode (a few frames at the detector's 64x64, ~100 kB packed) is written beside the
dataset as it is learnt, and read back at start.

One ``.npz`` per labelled episode (numpy arrays only, read with ``allow_pickle=False``), written under a
temporary name and renamed, so a crash leaves a whole file or none. Each names the detector settings it
was prepared under (``prepared_under``): one prepared under others (another camera, another image size)
is left out, since its frames are not what today's detector reads. A file that does not read is left out
and said once. Per task only the newest ``keep`` stay on disk, as the judge keeps only as many in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import PreparedEpisode, TrainingSamples

log = logging.getLogger(__name__)

JUDGED_FOLDER = "judged"  # inside the learner's store root, beside the dataset and its ledger
SUFFIX = ".npz"
SAMPLE_PREFIX = "sample/"
VERDICT_PREFIX = "verdict/"
# The settings that decide what ``prepare`` keeps of an episode (which frames, at what size).
PREPARING_SETTINGS = ("cameras", "compare_with_start", "backbone_channels", "verdict_frames", "early_negatives",
                      "early_fraction", "takeover_negatives", "takeover_window")


def prepared_under(config: DetectorConfig) -> str:
    """A short fingerprint of the settings that shape a prepared episode."""
    settings = {name: getattr(config, name) for name in PREPARING_SETTINGS}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=list).encode()).hexdigest()[:16]


class LabelledEpisodeFiles:
    """A folder of labelled, prepared episodes: ``save`` each as it is learnt, ``load`` them at start."""

    def __init__(self, folder: str | Path, config: DetectorConfig, keep: int) -> None:
        self.folder = Path(folder)
        self.fingerprint = prepared_under(config)
        self.keep = keep
        self._by_task: dict[str, list[Path]] = {}  # oldest first
        # Numbered on from the newest file there, loaded or not: a save never overwrites one.
        self._next = max((_number(path) + 1 for path in self.folder.glob(f"*{SUFFIX}")), default=0)

    def load(self) -> dict[str, list[PreparedEpisode]]:
        """Every task's newest ``keep`` episodes saved under today's settings, oldest first."""
        self._by_task = {}
        if not self.folder.is_dir():
            return {}
        loaded: dict[str, list[PreparedEpisode]] = {}
        unreadable: list[str] = []
        other_settings = 0
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            try:
                task, fingerprint, episode = _read(path)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
                unreadable.append(f"{path.name} ({type(exc).__name__})")
                continue
            if fingerprint != self.fingerprint:
                other_settings += 1
                continue
            loaded.setdefault(task, []).append(episode)
            self._by_task.setdefault(task, []).append(path)
        if unreadable:
            log.warning("success detector: %d labelled episode file(s) in %s do not read and are left out: %s",
                        len(unreadable), self.folder, ", ".join(unreadable[:5]))
        if other_settings:
            log.warning("success detector: %d labelled episode(s) in %s were prepared under other detector settings "
                        "(learner.detector cameras or image size) and are left out", other_settings, self.folder)
        for task in self._by_task:
            self._prune(task)
            loaded[task] = loaded[task][-self.keep:]
        return loaded

    def save(self, task: str, episode: PreparedEpisode) -> Path:
        """Write one learnt episode (atomically), then drop the task's oldest beyond ``keep``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self._next:09d}{SUFFIX}"
        self._next += 1
        arrays: dict[str, Any] = {"task": np.array(task), "prepared_under": np.array(self.fingerprint),
                                  "success": np.array(episode.success), "labels": episode.samples.labels,
                                  **{SAMPLE_PREFIX + key: value for key, value in episode.samples.images.items()},
                                  **{VERDICT_PREFIX + key: value for key, value in episode.verdict_inputs.items()}}
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as file:
            np.savez_compressed(file, **arrays)  # the start frame repeats on every row: it packs to little
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        self._by_task.setdefault(task, []).append(path)
        self._prune(task)
        return path

    def _prune(self, task: str) -> None:
        paths = self._by_task[task]
        for old in paths[:-self.keep]:
            old.unlink(missing_ok=True)
        self._by_task[task] = paths[-self.keep:]


def _number(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return -1


def _read(path: Path) -> tuple[str, str, PreparedEpisode]:
    with np.load(path, allow_pickle=False) as stored:
        arrays: Mapping[str, np.ndarray] = {key: stored[key] for key in stored.files}
    samples = {key[len(SAMPLE_PREFIX):]: value for key, value in arrays.items() if key.startswith(SAMPLE_PREFIX)}
    verdict = {key[len(VERDICT_PREFIX):]: value for key, value in arrays.items() if key.startswith(VERDICT_PREFIX)}
    labels = arrays["labels"]
    if not samples or not verdict or any(len(images) != len(labels) for images in samples.values()):
        raise ValueError("its frames and labels do not match")
    episode = PreparedEpisode(bool(arrays["success"]), TrainingSamples(samples, labels.astype(np.float32)), verdict)
    return str(arrays["task"]), str(arrays["prepared_under"]), episode
