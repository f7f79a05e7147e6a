"""Published versions scored on held-out scenes while the main job runs.

Why: the live success of a 30-episode window, watched and rescued by the operator, moves by
+-17 points on its own (BENCHMARKS.md "learning"), so it cannot show what the learner is doing to
the weights. Here the newest published weights are copied (``Trainer.save_deployed``, a few
milliseconds under the trainer's lock) and scored alone, without an operator, on the first
``scenes`` of the held-out range, the same scenes every time, so points of different versions
compare, and a subset of the scenes the final check scores the start and the final weights on.

The scoring runs in one child process for the whole run (``robot_rl.app.evaluation`` reading
weight directories from stdin), at nice 19 with one thread: on a machine the robots share, it
takes only the CPU they leave, so the robots are not slowed; it skips to the newest version
whenever it is free, so it never queues up behind the learner.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from robot_rl.app.evaluation import HeldoutJob, family_scores

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.learner.trainer import Trainer

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often a free scorer looks for a newer version


@dataclass(frozen=True)
class HeldoutPoint:
    """One published version's success alone on the held-out scenes, and where the run stood then."""

    version: int
    updates: int
    episodes: int  # live episodes finished (all robots) when the weights were copied
    wall_s: float  # since the robots started
    success: float
    ci95: tuple[float, float]  # Wilson 95 % interval
    scenes: int
    # per task family (the families rotate over the scenes): {family: {success, ci95, scenes}}
    by_family: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HeldoutMonitor:
    """``HeldoutMonitor(trainer, cfg, directory, scenes, episodes).start()``; ``points``; ``stop()``."""

    def __init__(self, trainer: Trainer, cfg: RobotRLConfig, directory: Path, scenes: int,
                 episodes: Callable[[], int], every_updates: int = 1,
                 clock: Callable[[], float] = time.monotonic, policy_options: dict[str, Any] | None = None) -> None:
        """``every_updates``: a version is scored only once the trainer is this many updates past the
        last one scored (the first: past the start); ``policy_options``: the trained policy's
        ``loading_options()`` (a LeRobot policy's camera_map, joint_names and tokenizer), for the scorer's loads."""
        if scenes < 1 or every_updates < 1:
            raise ValueError(f"the held-out monitor needs scenes >= 1 and every_updates >= 1, got {scenes}, "
                             f"{every_updates}")
        self.every_updates = every_updates
        self.trainer = trainer
        self.directory = Path(directory)
        self.scenes = scenes
        self._cfg = cfg
        self._policy_options = dict(policy_options or {})
        self._episodes = episodes
        self._clock = clock
        self._t0 = clock()
        self._points: list[HeldoutPoint] = []
        self.failed_versions: list[int] = []  # copies the scorer could not score (its log says why)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._child: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    @property
    def points(self) -> list[HeldoutPoint]:
        with self._lock:
            return list(self._points)

    def start(self) -> HeldoutMonitor:
        """Start the scorer (the clock of ``wall_s`` starts now: call it as the robots start)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        job = self.directory / "job.json"
        job.write_text(HeldoutJob.of(self._cfg, self.scenes, self._policy_options).to_json())
        self._t0 = self._clock()
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with open(self.directory / "scorer.log", "w") as errors:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "robot_rl.app.evaluation", str(job), "held-out", "-"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, env=env,
                # Out of the terminal's process group: a Ctrl-C stops the run, which ends this scorer itself.
                preexec_fn=lambda: os.nice(19), start_new_session=True)
        self._thread = threading.Thread(target=self._run, name="heldout-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[HeldoutPoint]:
        """Stop scoring (a version being scored is abandoned) and end the child; the points so far."""
        self._stop.set()
        child = self._child
        if child is not None:
            if child.stdin is not None:
                child.stdin.close()
            child.kill()
            child.wait(30)
        if self._thread is not None:
            self._thread.join(30)
        return self.points

    def _run(self) -> None:
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        scored, scored_at = 0, 0  # the start (version 0, update 0) is the final check's
        while not self._stop.wait(POLL_S):
            step = self.trainer.step
            if self.trainer.version <= scored or step < scored_at + self.every_updates:
                continue
            scored_at = step
            try:
                scored, point = self._score(child.stdin, child.stdout)
            except (OSError, ValueError) as exc:  # the child ended (stop, or a crash its log shows)
                if not self._stop.is_set():
                    log.error("held-out scoring of published versions stopped: %s (see %s)", exc,
                              self.directory / "scorer.log")
                return
            if point is not None:
                with self._lock:
                    self._points.append(point)
                log.info("held-out: v%d (update %d) %.0f %% on %d scenes", point.version, point.updates,
                         100 * point.success, point.scenes)

    def _score(self, requests: IO[str], answers: IO[str]) -> tuple[int, HeldoutPoint | None]:
        """Copy the newest weights and score them: (their version, the point; None if scoring failed)."""
        wall_s = self._clock() - self._t0
        episodes = int(self._episodes())
        target = self.directory / "weights"
        updates, version = self.trainer.save_deployed(target)
        requests.write(f"{target}\n")
        requests.flush()
        line = answers.readline()
        if not line:
            raise ValueError("the scorer process ended")
        result = json.loads(line)
        if "error" in result:
            log.warning("held-out scoring of v%d failed: %s", version, result["error"])
            self.failed_versions.append(version)
            return version, None
        low, high = result["ci95"]
        return version, HeldoutPoint(version, updates, episodes, round(wall_s, 1), float(result["success"]),
                                     (float(low), float(high)), int(result["episodes"]), family_scores(result))
