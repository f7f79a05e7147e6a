"""What the learner tells people about learning: episode outcomes per policy version, and training curves.

Two jobs, kept apart:

- ``OutcomeTracker`` records how every finished robot episode went (success, how much a
  human had to drive, which weights drove it). The replay store feeds it when it commits
  an episode, because only then is the outcome final. ``per_version()`` answers "is the
  policy getting better?": success and intervention rate per published version.
- ``LearningLogger`` writes TensorBoard event files (and optionally Weights & Biases):
  the algorithm's metrics (losses, effective sample size of the weights, the staleness
  histogram) every few updates, and the outcomes of newly finished episodes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_rl.learner.algorithms.config import ALGORITHMS
from robot_rl.learner.config import LearnerConfig

log = logging.getLogger(__name__)

STALENESS_COUNT = "staleness/count_"  # prefix of the per-staleness sample counts in algorithm metrics


@dataclass(frozen=True)
class EpisodeOutcome:
    """How one robot episode went."""

    robot_id: str
    episode_id: int
    policy_version: int  # the weights that drove most of its policy steps (-1: unknown)
    success: bool
    steps: int
    intervention_steps: int
    takeovers: int  # times a human took over from the policy
    finished_s: float  # monotonic time at which the learner stored it

    @property
    def intervention_rate(self) -> float:
        return self.intervention_steps / self.steps if self.steps else 0.0


def outcome_from_columns(robot_id: str, episode_id: int, success: np.ndarray, is_intervention: np.ndarray,
                         policy_version: np.ndarray, finished_s: float | None = None) -> EpisodeOutcome:
    """An episode's outcome from its per-step columns (as the store and the index hold them).

    Weights may be swapped mid-episode; the episode counts for the version that drove most
    of its policy steps (all steps when a human drove throughout).
    """
    flags = np.asarray(is_intervention, dtype=bool).reshape(-1)
    versions = np.asarray(policy_version, dtype=np.int64).reshape(-1)
    driving = versions[~flags] if (~flags).any() else versions
    version = Counter(driving.tolist()).most_common(1)[0][0] if len(driving) else -1
    takeovers = int((flags[1:] & ~flags[:-1]).sum()) + int(bool(len(flags)) and bool(flags[0]))
    return EpisodeOutcome(robot_id=robot_id, episode_id=int(episode_id), policy_version=int(version),
                          success=bool(np.asarray(success, dtype=bool).any()), steps=len(flags),
                          intervention_steps=int(flags.sum()), takeovers=takeovers,
                          finished_s=time.monotonic() if finished_s is None else finished_s)


@dataclass
class VersionStats:
    """Outcomes of the episodes one policy version drove."""

    episodes: int = 0
    successes: int = 0
    steps: int = 0
    intervention_steps: int = 0
    episodes_with_takeover: int = 0

    def add(self, outcome: EpisodeOutcome) -> None:
        self.episodes += 1
        self.successes += int(outcome.success)
        self.steps += outcome.steps
        self.intervention_steps += outcome.intervention_steps
        self.episodes_with_takeover += int(outcome.takeovers > 0)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def intervention_rate(self) -> float:
        """Share of control ticks a human drove."""
        return self.intervention_steps / self.steps if self.steps else 0.0


class OutcomeTracker:
    """Thread-safe list of finished episodes' outcomes: the store appends, loggers and progress displays read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: list[EpisodeOutcome] = []

    def add(self, outcome: EpisodeOutcome) -> None:
        with self._lock:
            self._outcomes.append(outcome)

    def add_columns(self, robot_id: str, episode_id: int, columns: Mapping[str, np.ndarray]) -> None:
        """A stored episode's outcome from its step columns (``success``, ``is_intervention``,
        ``policy_version``: what the dataset writer reports, and what the dataset holds)."""
        self.add(outcome_from_columns(robot_id, episode_id, columns["success"], columns["is_intervention"],
                                      columns["policy_version"]))

    def __len__(self) -> int:
        with self._lock:
            return len(self._outcomes)

    def outcomes(self, start: int = 0) -> list[EpisodeOutcome]:
        """Outcomes in the order they were stored, from position ``start`` on."""
        with self._lock:
            return self._outcomes[start:]

    def per_version(self) -> dict[int, VersionStats]:
        """Policy version -> its episodes' outcomes, in version order."""
        stats: dict[int, VersionStats] = {}
        for outcome in self.outcomes():
            stats.setdefault(outcome.policy_version, VersionStats()).add(outcome)
        return dict(sorted(stats.items()))


def staleness_values(metrics: Mapping[str, float]) -> np.ndarray:
    """The staleness of every bounded sample of a batch, rebuilt from the ``staleness/count_<k>`` metrics."""
    counts = {int(k[len(STALENESS_COUNT):]): int(v) for k, v in metrics.items() if k.startswith(STALENESS_COUNT)}
    return np.repeat(np.array(list(counts), dtype=np.int64), list(counts.values())) if counts else np.empty(0)


class LearningLogger:
    """TensorBoard (and optional W&B) curves of one learner run.

    ``log_update`` is called by the trainer after every update and writes every
    ``every_updates``-th; at the same time it writes the outcomes of the episodes
    stored since the last call. Writing happens on the trainer thread, never on the
    thread that acks robots.
    """

    def __init__(self, log_dir: str | Path, outcomes: OutcomeTracker | None = None, every_updates: int = 10,
                 wandb_project: str | None = None, run_config: Mapping[str, Any] | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.outcomes = outcomes
        self.every_updates = max(1, every_updates)
        self._writer = SummaryWriter(str(self.log_dir))
        self._wandb = _start_wandb(wandb_project, self.log_dir, run_config) if wandb_project else None
        self._seen_outcomes = 0
        self._per_version: dict[int, VersionStats] = {}
        self._lock = threading.Lock()

    def log_update(self, step: int, metrics: Mapping[str, float], version: int) -> None:
        if step % self.every_updates:
            return
        with self._lock:
            scalars = {f"train/{k}": float(v) for k, v in metrics.items() if not k.startswith(STALENESS_COUNT)}
            scalars["train/weights_version"] = float(version)
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, step)
            staleness = staleness_values(metrics)
            if len(staleness):
                bins = np.arange(staleness.max() + 2) - 0.5  # one bin per whole version of lag
                self._writer.add_histogram("train/staleness", staleness, step, bins=bins)
            if self._wandb is not None:
                self._wandb.log(scalars, step=step)
            self._log_outcomes_locked()

    def close(self) -> None:
        with self._lock:
            self._log_outcomes_locked()
            self._writer.close()
            if self._wandb is not None:
                self._wandb.finish()
                self._wandb = None

    def _log_outcomes_locked(self) -> None:
        """Per episode (x = episodes stored): success, intervention rate; per version (x = version): their rates."""
        if self.outcomes is None:
            return
        new = self.outcomes.outcomes(self._seen_outcomes)
        touched: set[int] = set()
        for outcome in new:
            self._seen_outcomes += 1
            self._writer.add_scalar("episodes/success", float(outcome.success), self._seen_outcomes)
            self._writer.add_scalar("episodes/intervention_rate", outcome.intervention_rate, self._seen_outcomes)
            self._writer.add_scalar("episodes/policy_version", float(outcome.policy_version), self._seen_outcomes)
            self._per_version.setdefault(outcome.policy_version, VersionStats()).add(outcome)
            touched.add(outcome.policy_version)
        for version in sorted(touched):
            stats = self._per_version[version]
            values = {"per_version/success_rate": stats.success_rate,
                      "per_version/intervention_rate": stats.intervention_rate,
                      "per_version/episodes": float(stats.episodes)}
            for name, value in values.items():
                self._writer.add_scalar(name, value, version)
            if self._wandb is not None:
                self._wandb.log({**values, "per_version/version": version})
        if new:
            self._writer.flush()


def _start_wandb(project: str, log_dir: Path, run_config: Mapping[str, Any] | None) -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise RuntimeError(f"trainer.wandb_project={project!r} needs the wandb package (pip install wandb); "
                           "set trainer.wandb_project=null to log to TensorBoard only") from exc
    return wandb.init(project=project, dir=str(log_dir), config=dict(run_config or {}))


def make_logger(config: LearnerConfig, outcomes: OutcomeTracker | None) -> LearningLogger | None:
    """The logger ``config.trainer`` asks for (None when ``log_dir`` is ""); a W&B run records the
    algorithm, its settings and the trainer's main ones."""
    trainer = config.trainer
    directory = trainer.tensorboard_dir
    if directory is None:
        return None
    run_config = {"algorithm": ALGORITHMS.name_of(config.algorithm),
                  "algorithm_params": dataclasses.asdict(config.algorithm),
                  "rewards": dataclasses.asdict(trainer.rewards), "batch_size": trainer.batch_size, "lr": trainer.lr}
    return LearningLogger(directory, outcomes, trainer.log_every_updates, trainer.wandb_project, run_config)
