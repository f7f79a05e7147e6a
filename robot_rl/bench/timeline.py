"""The learner's weights saved every N seconds of robot time, to score them on unseen scenes afterwards.

Why: the live success of a 20-episode window cannot tell 65 % from 80 % (its standard error
is ~10 points), so "wall clock to 80 %" read off it measures episodes per minute as much as
learning (BENCHMARKS.md "learning": no learning also touched 80 %). Saving the
weights at the same robot times in every arm and scoring each copy later on fixed held-out
scenes, without the operator, gives each arm a held-out curve over wall clock; the
async/sync comparison reads its time to 80 % off that curve.

The copy is the learner's current weights (``Trainer.save_deployed``): in the synchronous
loop, a copy taken during a train phase is ahead of what its robots run until the next round.
Saving takes a few milliseconds under the trainer's lock, so it barely delays training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from robot_rl.learner.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """One saved copy of the weights and where the arm stood when it was taken."""

    wall_s: float  # robot time since the robots started
    updates: int
    version: int
    episodes: int  # episodes finished by then (all robots)
    weights: str  # a directory FlowVLA.from_pretrained loads

    def to_dict(self) -> dict:
        return asdict(self)


class WeightsTimeline:
    """A thread that saves the trainer's weights every ``every_s`` seconds into ``directory``."""

    def __init__(self, trainer: Trainer, directory: Path, every_s: float, episodes: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not every_s > 0:
            raise ValueError(f"the weights timeline needs every_s > 0, got {every_s}")
        self.trainer = trainer
        self.directory = Path(directory)
        self.every_s = float(every_s)
        self._episodes = episodes
        self._clock = clock
        self._t0 = clock()
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> WeightsTimeline:
        self._t0 = self._clock()
        self._thread = threading.Thread(target=self._run, name="weights-timeline", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Snapshot]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30.0)
        return list(self.snapshots)

    def take(self) -> Snapshot:
        """Save the weights now (the thread calls it every ``every_s``; callable by hand in tests)."""
        wall_s = self._clock() - self._t0
        target = self.directory / f"t{int(round(wall_s)):05d}s"
        updates, version = self.trainer.save_deployed(target)
        snapshot = Snapshot(round(wall_s, 1), updates, version, int(self._episodes()), str(target))
        self.snapshots.append(snapshot)
        log.info("weights timeline: %s at %.0f s (update %d)", target.name, wall_s, updates)
        return snapshot

    def _run(self) -> None:
        k = 1
        while not self._stop.wait(max(self._t0 + k * self.every_s - self._clock(), 0.0)):
            try:
                self.take()
            except Exception:  # a full disk must not end the arm; the curve just has a gap
                log.exception("weights timeline: could not save the weights")
            k += 1


def first_heldout_reaching(points: list[dict], threshold: float) -> dict | None:
    """The first scored snapshot whose held-out success is >= ``threshold`` (None: none did)."""
    for point in points:
        if point.get("success") is not None and point["success"] >= threshold:
            return point
    return None
