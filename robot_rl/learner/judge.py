"""``SuccessJudge``: one success detector per task, trained online from the verdicts that arrive.

Verdicts come from three sources (``VerdictSource``): an operator (a person said so), the task
(the sim's ground truth, or a scripted check) and the detector itself. Only the first two teach:
a detector that learned from its own verdicts would only grow surer of its mistakes. Each task's
detector is fit once the task has ``min_labelled`` verdicts with ``min_per_outcome`` of each
outcome, and fit again from scratch after every ``retrain_every`` new ones (a fresh fit calibrates
its threshold on every labelled episode's out-of-fold score, the newest's among them). An episode
nobody judged gets the detector's verdict with its confidence, or none while its task's detector is
not trained.

With ``files`` (``LabelledEpisodeFiles``: the store's ``judged/`` folder) every labelled episode it takes
is written to disk as well, and ``restore`` takes them back after a restart and fits each task's detector
on them: a restarted learner judges as it did before it stopped, without asking its operators again.

Fitting takes seconds to a minute or two on a CPU (``calibration_folds`` + 1 head fits); ``learn``
fits on the calling thread, so the learner calls it from a thread that may wait (never the one that
acks robots).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from robot_rl.core.types import VerdictSource
from robot_rl.learner.detector_config import DetectorConfig
from robot_rl.learner.detector_episodes import Calibration, LabelledEpisode, PreparedEpisode, Verdict, prepare
from robot_rl.learner.labelled_files import LabelledEpisodeFiles

if TYPE_CHECKING:
    from robot_rl.learner.detector import TaskDetector

__all__ = ["SuccessJudge", "VerdictSource"]

log = logging.getLogger(__name__)

# Labelled episodes kept per task, the newest (in memory, and on disk with ``files``): ~250 kB each in memory
# (a few frames at the detector's 64x64), ~100 kB on disk, and more than a fit on a CPU gets through in a minute.
MAX_LABELLED = 500


@dataclass
class _Task:
    """One task's labelled episodes and the detector last fit on them."""

    episodes: list[PreparedEpisode] = field(default_factory=list)
    detector: TaskDetector | None = None
    received: int = 0  # judged episodes taken so far (the oldest beyond max_labelled are dropped)
    received_at_fit: int = 0


class SuccessJudge:
    """Per-task success detectors that learn from operators' and tasks' verdicts (see the module doc).

    >>> judge = SuccessJudge(DetectorConfig())
    >>> judge.learn(LabelledEpisode("push", frames, success=True), VerdictSource.operator)
    >>> judge.judge("push", frames)   # a Verdict, or None while "push" has no trained detector
    """

    def __init__(self, config: DetectorConfig, max_labelled: int = MAX_LABELLED,
                 files: LabelledEpisodeFiles | None = None) -> None:
        self.config = config
        self.max_labelled = max_labelled  # per task: the newest are kept (memory stays bounded)
        self.files = files
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()  # the tasks' state: judge() reads it while learn() fits
        self._fitting = threading.Lock()  # one learn() at a time, so no fit is started twice

    def learn(self, episode: LabelledEpisode, source: VerdictSource) -> Calibration | None:
        """Take one judged episode; fit its task's detector when due. Returns the new calibration
        when it fit one. A detector's own verdict teaches nothing and is refused."""
        if source is VerdictSource.detector:
            raise ValueError("a detector's verdict cannot train the detector (it would learn its own mistakes)")
        prepared = prepare(episode, self.config)
        with self._fitting:
            self._keep(episode.task, prepared)
            with self._lock:
                task = self._tasks.setdefault(episode.task, _Task())
                task.episodes = [*task.episodes, prepared][-self.max_labelled:]
                task.received += 1
                episodes = list(task.episodes)
            if not self._fit_due(task, episodes):
                return None
            return self._fit(episode.task, task, episodes)

    def _keep(self, task: str, prepared: PreparedEpisode) -> None:
        """Write a labelled episode to ``files``; a disk that refuses it costs a restart's memory of it, not
        the detector's learning it now."""
        if self.files is None:
            return
        try:
            self.files.save(task, prepared)
        except OSError as exc:
            log.warning("success detector: a labelled episode of %r could not be kept in %s (%s); a restarted "
                        "learner will not have it", task, self.files.folder, exc)

    def restore(self) -> dict[str, Calibration]:
        """Take back the labelled episodes ``files`` holds (a restart) and fit each task's detector that has
        enough of them. Returns the calibrations it fit."""
        if self.files is None:
            return {}
        fitted = {}
        with self._fitting:
            for name, stored in self.files.load().items():
                with self._lock:
                    task = self._tasks.setdefault(name, _Task())
                    task.episodes = [*stored, *task.episodes][-self.max_labelled:]
                    task.received += len(stored)
                    episodes = list(task.episodes)
                log.info("success detector for %r: %d labelled episodes taken back from %s", name, len(stored),
                         self.files.folder)
                if self._fit_due(task, episodes):
                    fitted[name] = self._fit(name, task, episodes)
        return fitted

    def _fit(self, name: str, task: _Task, episodes: list[PreparedEpisode]) -> Calibration:
        # Imported here, at a task's first fit: the model's libraries would add 6-7 s of CPU to every learner start.
        from robot_rl.learner.detector import TaskDetector

        detector = TaskDetector(self.config)
        calibration = detector.fit(episodes)
        with self._lock:
            task.detector, task.received_at_fit = detector, task.received
        log.info("success detector for %r fit on %d labelled episodes: %d-fold cross-validated accuracy %.1f%%, "
                 "threshold %.2f, sure beyond +-%.2f", name, calibration.trained_episodes, calibration.folds,
                 100 * calibration.heldout_accuracy, calibration.threshold, calibration.margin)
        return calibration

    def _fit_due(self, task: _Task, episodes: list[PreparedEpisode]) -> bool:
        outcomes = np.array([e.success for e in episodes])
        enough = (len(episodes) >= self.config.min_labelled and outcomes.sum() >= self.config.min_per_outcome
                  and (~outcomes).sum() >= self.config.min_per_outcome)
        return enough and (task.detector is None or task.received - task.received_at_fit >= self.config.retrain_every)

    def judge(self, task: str, frames: Mapping[str, np.ndarray]) -> Verdict | None:
        """The verdict of ``task``'s detector on an episode nobody judged; None while it has none."""
        detector = self.detector(task)
        return None if detector is None else detector.predict(frames)

    def detector(self, task: str) -> TaskDetector | None:
        with self._lock:
            entry = self._tasks.get(task)
            return None if entry is None else entry.detector

    def labelled(self, task: str) -> int:
        """How many judged episodes of ``task`` the judge holds."""
        with self._lock:
            entry = self._tasks.get(task)
            return 0 if entry is None else len(entry.episodes)

    def calibrations(self) -> dict[str, Calibration]:
        """Each trained task's calibration (held-out accuracy, threshold, margin): what the console shows."""
        with self._lock:
            return {name: entry.detector.calibration for name, entry in self._tasks.items()
                    if entry.detector is not None and entry.detector.calibration is not None}
