"""Closed episodes from staging into the dataset: the replay store's commit thread.

A closed episode's segments are already durable (staged and fsynced, so acked); committing moves
them into the LeRobotDataset v3 and then out of staging. The order is what makes a crash at any
point safe:

1. an ``intent`` line in the ``Ledger`` (fsynced) names the dataset index the episode will get;
2. the dataset writer (``store_writer``, in its own process by default) writes the episode from
   its staged wire frames, unfinalized; a write that fails gets an ``abort`` line and the episode
   stays staged;
3. one ``finalize`` makes every episode written so far readable; a crash before it is rolled back
   on the next open (``repair_interrupted_write``), and the intents say nothing was written;
4. only then each episode's ``commit`` line, and its staged segments are released.

A crash between 3 and 4 leaves an intent whose episode the dataset holds: restart recovery
(``learner/recovery.py``) completes its commit. Nothing is released before the finalize, so an
acked segment is always either staged or in the finalized dataset.

Episodes queued behind a busy writer, or arriving within ``commit_linger_s`` of each other, are
written as one batch (up to ``commit_batch``) with one finalize: re-opening and finalizing the
dataset per episode would cost the writer most of its time. A ``flush`` ends the linger at once.
With ``background_commit`` off (tests, tools) an episode is committed as it closes, inline.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import numpy as np

from robot_rl.bridges.zmq.spool import Spool
from robot_rl.core.priority import lower_own_priority
from robot_rl.learner.config import StoreConfig
from robot_rl.learner.index_feed import IndexFeed
from robot_rl.learner.ledger import CommitRecord, Ledger
from robot_rl.learner.metrics import OutcomeTracker
from robot_rl.learner.open_episodes import EpisodeBook, OpenEpisode
from robot_rl.learner.store_writer import EpisodeWriter
from robot_rl.learner.stored_frames import StoredEpisode

if TYPE_CHECKING:  # the judge brings torch, LeRobot's classifier and transformers: a learner that judges loads them
    from robot_rl.learner.judging import EpisodeJudging

log = logging.getLogger(__name__)

LINGER_POLL_S = 0.05  # how often a lingering writer looks whether a flush wants it to stop waiting


class _NoJob(enum.Enum):
    """The writer's queue had nothing in time (a sentinel type checkers can tell from a job)."""

    NO_JOB = enum.auto()


_NO_JOB: Final = _NoJob.NO_JOB


@dataclass(frozen=True)
class WriterBacklog:
    """What the dataset writer has still to write: closed episodes queued, bytes staged on disk (open
    episodes' included) and not yet in the dataset."""

    episodes: int
    staged_bytes: int


@dataclass(frozen=True)
class _Saved:
    """An episode written to the dataset, not yet finalized: what its release needs."""

    episode: OpenEpisode
    record: CommitRecord
    keys: list[str]  # its staged segments
    outcome: dict[str, np.ndarray] | None  # None: no steps, nothing in the dataset


class Committer:
    """Writes closed episodes to the dataset (on the ``store-commit`` thread with ``background_commit``).

    ``lock`` is the store's: it guards the ledger, the staging log and ``episodes``, which the
    ingest path changes too. It is not held while the writer writes.
    """

    def __init__(self, config: StoreConfig, *, dataset_root: Path, lock: threading.RLock, ledger: Ledger,
                 staging: Spool, episodes: EpisodeBook, feed: IndexFeed, outcomes: OutcomeTracker,
                 judging: EpisodeJudging | None = None) -> None:
        self._config = config
        self._dataset_root = dataset_root
        self._lock = lock
        self._ledger = ledger
        self._staging = staging
        self._episodes = episodes
        self._feed = feed
        self._outcomes = outcomes
        self._judging = judging
        self._writer: EpisodeWriter | None = None  # once the store knows its layout (``open``)
        self._jobs: queue.Queue[OpenEpisode | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._draining = 0  # flush() calls under way: the writer stops lingering for them
        # Robots are held back until what is queued is written (the index's memory budget): no episode
        # will come to join a lingering batch, so the writer writes what it has at once.
        self.robots_waiting = False
        self._behind_said_at = 2 * config.commit_batch  # closed episodes queued that make _say_if_behind warn
        self._thread: threading.Thread | None = None
        if config.background_commit:
            # Started before the store is restored: the episodes staged before a restart are written
            # behind the learner's back, so it serves robots within seconds however long the backlog.
            self._thread = threading.Thread(target=self._loop, name="store-commit", daemon=True)
            self._thread.start()

    def open(self, writer: EpisodeWriter) -> None:
        """The dataset writer, opened once the store knows its layout (no episode closes before)."""
        self._writer = writer

    def submit(self, episode: OpenEpisode) -> None:
        """A closed episode, to be written (queued, or at once without a thread). Called under the lock."""
        if self._thread is None:
            self._commit([episode])
            return
        self._idle.clear()
        self._jobs.put(episode)
        self._say_if_behind()

    def queued(self) -> int:
        """Closed episodes waiting for the writer."""
        return self._jobs.qsize()

    def writing(self) -> bool:
        """Closed episodes are queued or being written: frames the index holds will become evictable."""
        return not self._idle.is_set()

    def backlog(self) -> WriterBacklog:
        with self._lock:
            return WriterBacklog(self._jobs.qsize(), self._episodes.staged_bytes())

    def flush(self, timeout_s: float) -> bool:
        """Wait until every closed episode is in the dataset; a lingering writer stops waiting for more."""
        if self._thread is None:
            return True
        with self._lock:
            self._draining += 1
        try:
            return self._idle.wait(timeout_s)
        finally:
            with self._lock:
                self._draining -= 1

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _say_if_behind(self) -> None:
        """Warn when closed episodes pile up before the writer (two batches' worth, then each doubling):
        the staged segments wait on disk, not in memory, but a writer that never catches up ends in
        robots held back at max_staged_bytes_per_robot."""
        waiting = self._jobs.qsize()
        if waiting < self._behind_said_at:
            if waiting <= self._config.commit_batch:
                self._behind_said_at = 2 * self._config.commit_batch
            return
        self._behind_said_at = 2 * waiting
        log.warning("the dataset writer is %d episodes behind (%.0f MB staged on disk): it cannot keep up with "
                    "what the robots send (robots are held back once max_staged_bytes_per_robot is staged); fewer "
                    "robots or cameras, or a learner with more cores", waiting, self._episodes.staged_bytes() / 1e6)

    def _loop(self) -> None:
        lower_own_priority(self._config.commit_nice)
        while True:
            batch, stop = self._next_batch()
            self._feed.index.wait_loaded()  # a restarted store's dataset is read into the index before it grows
            self._feed.wait_backlog()  # and its staged segments, before any of them is released
            if batch:
                self._commit(batch)
            if stop:
                self._idle.set()
                return
            if self._jobs.empty():
                self._idle.set()

    def _next_batch(self) -> tuple[list[OpenEpisode], bool]:
        """The next closed episode plus those queued behind it or arriving within ``commit_linger_s``
        (up to ``commit_batch``): one dataset open/finalize per batch, whether the writer fell
        behind or episodes trickle in. A ``flush`` ends the wait at once."""
        batch: list[OpenEpisode] = []
        job = self._jobs.get()
        linger_until = time.monotonic() + self._config.commit_linger_s
        while job is not None:
            batch.append(job)
            if len(batch) >= self._config.commit_batch:
                return batch, False
            next_job = self._next_job_before(linger_until)
            if next_job is _NO_JOB:
                return batch, False
            job = next_job
        return batch, True

    def _next_job_before(self, deadline: float) -> OpenEpisode | None | Literal[_NoJob.NO_JOB]:
        """The next queued job (None: stop), waiting until ``deadline`` unless someone is flushing;
        ``_NO_JOB`` if none came."""
        while True:
            try:
                return self._jobs.get_nowait()
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            # Plain reads, no lock (ingest holds it while it fsyncs).
            if remaining <= 0 or self._draining > 0 or self.robots_waiting:
                return _NO_JOB
            try:
                return self._jobs.get(timeout=min(remaining, LINGER_POLL_S))
            except queue.Empty:
                continue

    def _commit(self, batch: Sequence[OpenEpisode]) -> None:
        try:
            self._commit_batch(batch)
        except Exception:
            # Disk trouble at the finalize, or the writer process gone: the batch stays staged and is
            # committed on the next start (the segments were acknowledged once staged).
            log.exception("could not store %d episode(s); they stay staged", len(batch))

    def _commit_batch(self, episodes: Sequence[OpenEpisode]) -> None:
        """Write the episodes, finalize the dataset once, then commit them and release their staging.

        Until the finalize they are not readable from the dataset (``repair_interrupted_write``
        rolls a crash back to the last finalize), so they stay staged until then.
        """
        writer = self._writer
        assert writer is not None, "an episode closed before the store knew its layout"
        saved = [written for episode in episodes if (written := self._write_unfinalized(writer, episode)) is not None]
        writer.finalize()  # raises on disk trouble: then nothing of the batch is released
        for episode in saved:
            self._release(episode)

    def _write_unfinalized(self, writer: EpisodeWriter, episode: OpenEpisode) -> _Saved | None:
        """Save one episode without finalizing; None if it could not be written (it stays staged)."""
        keys = episode.staging_keys()
        # The success detector's verdict on an episode nobody judged (None: it has one, or no detector
        # can judge it yet): on its last step in the sampling index and in the dataset.
        verdict = self._judging.verdict(episode.index_key) if self._judging is not None else None
        if verdict is not None:
            self._feed.verdict(episode.index_key, verdict)
        try:
            staged = self._staged_frames(keys)
        except Exception:
            log.exception("episode %d of robot %s: staged segments unreadable; it stays staged",
                          episode.episode_id, episode.robot_id)
            return None
        has_steps = sum(episode.seqs.values()) > 0
        record = CommitRecord(episode.robot_id, episode.episode_id, episode.fragment,
                              writer.num_episodes if has_steps else -1, tuple(sorted(episode.seqs)))
        if not has_steps:
            return _Saved(episode, record, keys, None)
        with self._lock:
            self._ledger.write_intent(record)
        try:
            # On failure the recorder finalizes what the batch saved before this episode.
            written = writer.write(episode.robot_id, episode.episode_id, staged, verdict)
        except Exception as exc:  # noqa: BLE001 - RecordingError is a bug (validated at ingest), else disk trouble
            log.error("episode %d of robot %s could not be written (%s); it stays staged",
                      episode.episode_id, episode.robot_id, exc)
            with self._lock:
                self._ledger.write_abort(record)
            return None
        return _Saved(episode, record, keys, written.outcome)

    def _release(self, saved: _Saved) -> None:
        """The episode is in the finalized dataset: commit line, then its staged segments go."""
        episode, record = saved.episode, saved.record
        with self._lock:
            self._ledger.write_commit(record)
            for key in saved.keys:
                self._staging.ack(key)
            self._episodes.release_staged_bytes(episode)
        if saved.outcome is not None:
            self._outcomes.add_columns(episode.robot_id, episode.episode_id, saved.outcome)
            self._feed.stored(episode.index_key, StoredEpisode(str(self._dataset_root), self._config.repo_id,
                                                               record.index))
        log.info("stored episode %d of robot %s (fragment %d): %d steps from %d segments, dataset episode %d",
                 episode.episode_id, episode.robot_id, episode.fragment,
                 0 if saved.outcome is None else len(saved.outcome["success"]), len(saved.keys), record.index)

    def _staged_frames(self, keys: Sequence[str]) -> list[list[bytes]]:
        """The segments as they arrived; the writer decodes them (in its own process, by default)."""
        staged = []
        for key in keys:
            with self._lock:
                frames = self._staging.get(key)
            if frames is None:
                raise RuntimeError(f"staged segment {key} is missing from the staging log")
            staged.append(frames)
        return staged
