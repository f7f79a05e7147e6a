"""The synchronous baseline: robots collect a round with the current weights, then the trainer
trains while they wait, publishes, and the next round starts.

The same learner service, store, sampling and algorithm as the asynchronous learner of the main
job, and the same edge runtime: only the overlap of acting and training differs, so ``bench
learning`` can tell what learning while the robots act is worth at equal robot time.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from robot_rl.app.local_run import _run_robot, collect_result
from robot_rl.learner.service import LearnerService

if TYPE_CHECKING:
    from robot_rl.app.config import LocalRunConfig
    from robot_rl.app.local_run import EpisodeCallback, LocalRunResult, OperatorFactory, RobotFactory
    from robot_rl.learner.config import LearnerConfig
    from robot_rl.learner.store import ReplayStore
    from robot_rl.learner.trainer import Trainer
    from robot_rl.policies.trainable import TrainablePolicy

log = logging.getLogger(__name__)


class SyncRounds:
    """Turn-taking for the synchronous baseline: robots collect a round, then the trainer trains, never both.

    Robots call ``robot_should_stop`` before each episode (it is ``run_edge``'s ``stop``):
    it hands out at most ``episodes_per_round`` episodes per round and blocks the robot
    while the round is full and the trainer works. The coordinator waits for the round
    (``wait_collected``), trains, then opens the next one (``next_round``).
    """

    def __init__(self, episodes_per_round: int, deadline_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.episodes_per_round = episodes_per_round
        self.deadline_s = deadline_s
        self.clock = clock
        self.round = 0
        self._claimed = 0
        self._finished = 0
        self._steps = 0  # steps of every finished episode, all rounds
        self._closed = False
        self._cond = threading.Condition()

    def _over(self) -> bool:
        return self._closed or self.clock() >= self.deadline_s

    def robot_should_stop(self) -> bool:
        """Before an episode: False (go) when the round has room; waits while it is full; True when over."""
        with self._cond:
            while not self._over():
                if self._claimed < self.episodes_per_round:
                    self._claimed += 1
                    return False
                self._cond.wait(0.05)
            return True

    def episode_finished(self, steps: int) -> None:
        with self._cond:
            self._finished += 1
            self._steps += steps
            self._cond.notify_all()

    def wait_collected(self) -> bool:
        """Wait until every episode of this round is done; False if the budget ended (or ``close``) first."""
        with self._cond:
            while self._finished < self.episodes_per_round:
                if self._over():
                    return False
                self._cond.wait(0.05)
            return True

    def next_round(self) -> None:
        with self._cond:
            self.round += 1
            self._claimed = self._finished = 0
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def steps_collected(self) -> int:
        with self._cond:
            return self._steps


def train_phase(trainer: Trainer, updates: int, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Run up to ``updates`` updates by hand (robots idle meanwhile); stops at the deadline. Returns how many."""
    done = 0
    while done < updates and clock() < deadline_s:
        if trainer.update_once() is None:  # too little data yet (no demonstrations preloaded)
            time.sleep(0.1)
            continue
        done += 1
    return done


def wait_ingested(store: ReplayStore, steps: int, timeout_s: float = 30.0) -> bool:
    """Wait until the store holds ``steps`` robot steps and no episode is half-received.

    Without it the trainer could miss the round's last segments, or see an episode whose
    outcome is not known yet (which ``rwr`` drops), and the loop would not be synchronous.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = store.stats()
        if stats["steps_ingested"] >= steps and stats["episodes_open"] == 0:
            return True
        time.sleep(0.02)
    log.warning("sync loop: the store did not receive all %d steps within %.0f s; training anyway", steps, timeout_s)
    return False


def run_sync(learner_config: LearnerConfig, policy: TrainablePolicy, run: LocalRunConfig,
             robot_factory: RobotFactory, *, collect_episodes: int, updates: int,
             operator_factory: OperatorFactory | None = None,
             on_episode: EpisodeCallback | None = None,
             on_start: Callable[[LearnerService], None] | None = None) -> LocalRunResult:
    """The synchronous collect-then-train loop on the real learner and edge runtime; like ``run_local``.

    The learner service runs without its training thread; this thread drives the
    trainer by hand between collect phases and publishes exactly once per round
    (``publish_every_updates`` = ``updates``), so every round's robots start on the
    newest weights (swapped in at their first chunk, as in the async learner).
    The robots run on threads whatever ``run.robots`` says: the phases take turns, so the
    trainer never shares the interpreter's lock with a robot that is acting.
    """
    if run.time_budget_s is None:
        raise ValueError("run_sync needs run.time_budget_s: the sync loop is compared at equal robot time")
    config = copy.deepcopy(learner_config)
    config.trainer.publish_every_updates = updates
    config.trainer.publish_every_s = math.inf
    learner = LearnerService(config, copy.deepcopy(policy), train=False).start()
    if on_start is not None:
        on_start(learner)
    deadline = time.monotonic() + run.time_budget_s  # counted from here, as in run_local
    rounds = SyncRounds(collect_episodes, deadline)

    def episode_done(robot_id: str, episode: Any, version: int) -> None:
        if on_episode is not None:
            on_episode(robot_id, episode, version)
        rounds.episode_finished(episode.num_steps)

    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    versions: dict[str, int] = {}

    def robot_thread(index: int) -> None:
        try:
            results.append(_run_robot(index, learner, policy, run, robot_factory, versions,
                                      rounds.robot_should_stop, operator_factory, episode_done))
        except BaseException as exc:  # reported after join
            log.exception("robot %d failed", index)
            errors.append(exc)
            rounds.close()

    threads = [threading.Thread(target=robot_thread, args=(i,), name=f"robot-{i}") for i in range(run.num_robots)]
    try:
        for t in threads:
            t.start()
        _coordinate(learner, rounds, updates, deadline)
    finally:
        rounds.close()  # robots waiting for a round stop; the others finish their episode
        for t in threads:
            if t.is_alive():
                t.join()
        learner.store.flush(120)
        learner.stop(checkpoint=True)
    return collect_result(learner, results, errors, versions, trained=True)


def _coordinate(learner: LearnerService, rounds: SyncRounds, updates: int, deadline_s: float) -> None:
    """Collect, train, publish, repeat, until the budget ends."""
    try:
        while rounds.wait_collected():
            wait_ingested(learner.store, rounds.steps_collected)
            if train_phase(learner.trainer, updates, deadline_s) < updates:
                break  # the budget ended mid-training: nothing left to act with the new weights
            if learner.trainer.version != rounds.round + 1:
                raise RuntimeError(f"sync round {rounds.round} did not publish (weights v{learner.trainer.version})")
            rounds.next_round()
    finally:
        rounds.close()  # robots waiting for a round stop now
