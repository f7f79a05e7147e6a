"""A replay store's state rebuilt from its files at start: ledger, dataset, staging, quarantine.

Nothing the store knows lives only in memory; at start it reads back, in this order:

1. the ledger's commit lines: which segments are in the dataset (so a re-sent one is a duplicate);
2. its intents without a commit line (a crash between the dataset write and the commit line),
   each resolved against the dataset, which the writer has already rolled back to its last
   finalize if a write was cut short: the dataset holds the episode, so the commit is completed
   and its staging released; or it does not, and the episode is still staged;
3. committed episodes the dataset no longer holds (its files damaged after a finalize): said
   loudly, since they were acked and nothing can bring them back;
4. the dataset's episodes into the sampling index: with ``background_commit`` on a thread of its
   own (``store-load``), behind a store that already takes segments, so a restart does not grow
   with the store (the trainer and the commit thread wait for it: ``SamplingIndex.loading``);
   started before staging is read, because what the staged backlog adds to the dataset later is
   indexed from staging;
5. the staging log: the episodes acked but not yet committed, reopened as they were; those
   complete, or with a pending intent, go straight back to the writer. A staged segment that no
   longer passes the checks moves to the ``quarantine`` spool beside staging, so start-up goes on
   instead of failing on it at every restart. Their images are decoded into the sampling index
   on the index thread, behind the serving learner, so a restart does not grow with the backlog
   a slow writer left either.

Demonstrations (``StoreConfig.demonstrations``) are read into the index before any of this,
whether or not the store's layout is known yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

from robot_rl.bridges.zmq.protocol import ProtocolError, Segment, decode_message
from robot_rl.bridges.zmq.segments import check_segment
from robot_rl.bridges.zmq.spool import Spool
from robot_rl.core.errors import CorruptFileError
from robot_rl.data.reader import iter_episode_arrays
from robot_rl.learner.config import StoreConfig
from robot_rl.learner.index import DEMO_ROBOT, EntryKey, SamplingIndex, dataset_episode_to_columns
from robot_rl.learner.index_feed import Backlog, IndexFeed
from robot_rl.learner.ledger import CommitRecord, Ledger
from robot_rl.learner.metrics import OutcomeTracker
from robot_rl.learner.open_episodes import EpisodeBook, EpisodeKey, parse_staging_key, staging_key
from robot_rl.learner.store_writer import EpisodeWriter
from robot_rl.learner.stored_frames import LEFT_OUT, StoredEpisode

log = logging.getLogger(__name__)


def load_demonstrations(config: StoreConfig, index: SamplingIndex) -> None:
    """The demonstration dataset's episodes into the sampling index, their frames left on disk."""
    if not config.demonstrations:
        return
    count = 0
    for i, episode in enumerate(iter_episode_arrays(config.demonstrations, config.demonstrations_repo_id)):
        key = (DEMO_ROBOT, i, 0)
        index.append(key, dataset_episode_to_columns(episode, index.cameras, robot_episode=False),
                     episode["instruction"])
        index.mark_stored(key, StoredEpisode(str(config.demonstrations), config.demonstrations_repo_id,
                                             episode["episode_index"]))
        count += 1
    log.info("preloaded %d demonstration episodes from %s", count, config.demonstrations)


class Recovery:
    """Restores one store once its dataset writer is open; called under the store's lock."""

    def __init__(self, config: StoreConfig, *, dataset_root: Path, ledger: Ledger, staging: Spool,
                 episodes: EpisodeBook, writer: EpisodeWriter, feed: IndexFeed, outcomes: OutcomeTracker,
                 counters: Counter[str]) -> None:
        self._config = config
        self._root = Path(config.root)
        self._dataset_root = dataset_root
        self._ledger = ledger
        self._staging = staging
        self._episodes = episodes
        self._writer = writer
        self._feed = feed
        self._index = feed.index
        self._outcomes = outcomes
        self._counters = counters
        self._loader: threading.Thread | None = None  # the dataset into the index, with background_commit

    def restore(self) -> list[EpisodeKey]:
        """Rebuild the store's state from disk; returns the reopened episodes to close at once."""
        for record in self._ledger.commits:
            self._episodes.remember_commit(record)
        self._resolve_intents()
        self._report_lost_commits()
        self._start_index_load()  # before staging: what the backlog adds to the dataset is indexed from staging
        return self._load_staging()

    def join(self) -> None:
        """Wait for the dataset's read into the index (the writer waits for it; it takes seconds)."""
        if self._loader is not None:
            self._loader.join()
            self._loader = None

    def _resolve_intents(self) -> None:
        """A crash between dataset write and commit line: the dataset says which happened."""
        for record in list(self._ledger.pending_intents):
            if self._writer.num_episodes > record.index:
                log.info("episode %d of robot %s was written before a crash; completing its commit",
                         record.episode_id, record.robot_id)
                self._ledger.write_commit(record)
                self._episodes.remember_commit(record)
                for seq in record.seqs:
                    self._staging.ack(staging_key(record.robot_id, record.episode_id, seq))

    def _report_lost_commits(self) -> None:
        """Committed (acked, released from staging) episodes the dataset no longer holds: its files
        were damaged after a finalize (a truncated or garbled parquet) and opening it rolled them
        back. Nothing here can bring them back; it is said loudly, never only as a repair warning."""
        stored = self._writer.num_episodes
        lost = [r for r in self._ledger.commits if r.index >= stored]
        if not lost:
            return
        self._counters["episodes_lost_to_damage"] = len(lost)
        names = ", ".join(f"{r.robot_id}/{r.episode_id} (dataset episode {r.index})" for r in lost[:10])
        log.error("DATA LOST: the dataset at %s holds %d episodes, but %d committed episodes were acked after "
                  "it: %s%s. Its files were damaged after they were written (see the repair warning above and "
                  "%s.interrupted); restore them from a backup to get the episodes back", self._dataset_root,
                  stored, len(lost), names, " ..." if len(lost) > 10 else "", self._dataset_root)

    def _start_index_load(self) -> None:
        """Read the dataset's episodes into the sampling index: with ``background_commit`` on a thread of
        its own, so that a restarted learner serves robots before it has read a store of any size (the
        trainer waits for it: ``SamplingIndex.loaded``). The writer waits too, so the read sees a dataset
        no one writes to."""
        count = self._writer.num_episodes
        if count == 0:
            return
        by_index = {r.index: r for r in self._ledger.commits if r.index >= 0}
        if not self._config.background_commit:
            self._load_dataset_into_index(by_index)
            return
        self._index.loading()
        self._loader = threading.Thread(target=self._load_in_background, args=(count, by_index),
                                        name="store-load", daemon=True)
        self._loader.start()

    def _load_in_background(self, count: int, by_index: dict[int, CommitRecord]) -> None:
        started = time.monotonic()
        try:
            self._load_dataset_into_index(by_index)
        except CorruptFileError as exc:  # named and explained in one line; a traceback adds nothing
            log.error("could not read the dataset into the sampling index: %s; robots are still stored, but "
                      "training waits", exc)
            self._index.loaded(error=str(exc))
            return
        except Exception as exc:
            log.exception("could not read the dataset at %s into the sampling index; robots are still stored, "
                          "but training waits", self._dataset_root)
            self._index.loaded(error=f"{type(exc).__name__}: {exc}")
            return
        self._index.loaded()
        log.info("sampling index: %d stored episodes read in %.1f s behind the serving learner; streams %s",
                 count, time.monotonic() - started, self._index.counts())

    def _load_dataset_into_index(self, by_index: dict[int, CommitRecord]) -> None:
        for episode in iter_episode_arrays(self._dataset_root, self._config.repo_id,
                                           on_unreadable=self._quarantine_stored_episode):
            record = by_index.get(episode["episode_index"])
            if record is None:
                log.warning("dataset episode %d has no ledger entry; indexing it as online data",
                            episode["episode_index"])
                key = ("~unledgered", int(episode["episode_index"]), 0)
            else:
                key = (record.robot_id, record.episode_id, record.fragment)
            columns = dataset_episode_to_columns(episode, self._index.cameras)
            self._index.append(key, columns, episode["instruction"])
            self._index.mark_stored(key, StoredEpisode(str(self._dataset_root), self._config.repo_id,
                                                       episode["episode_index"]))  # memory stays bounded
            self._outcomes.add_columns(key[0], key[1], columns)

    def _quarantine_stored_episode(self, index: int, path: Path, exc: Exception) -> None:
        """A stored episode whose rows or frames do not decode stays out of the sampling index (the
        others load, training goes on); said in one line, counted in ``episodes_quarantined``."""
        self._counters["episodes_quarantined"] += 1
        log.error("%s", CorruptFileError(path, f"dataset episode {index} does not decode ({type(exc).__name__}: "
                                         f"{exc})", LEFT_OUT))

    def _load_staging(self) -> list[EpisodeKey]:
        """Re-open the episodes whose segments were staged but not committed before the restart; returns
        those to close now: complete, or cut short by a crash during their commit (a pending intent).

        Each staged segment is checked here in everything but its pixels (``check_segment``) and its
        images are decoded into the sampling index on the index thread (``IndexFeed.backlog``): a
        writer far behind leaves up to ``max_staged_bytes_per_robot`` staged per robot, and decoding
        all of it before serving made a restart as slow as the backlog is long. The pixels decoded
        once already, when the segment arrived, and staging's crc keeps its bytes."""
        pending_intents = {(r.robot_id, r.episode_id, r.fragment) for r in self._ledger.pending_intents}
        order: list[tuple[EntryKey, str]] = []
        for key, frames in list(self._staging.pending()):
            robot_id, episode_id, seq = parse_staging_key(key)
            if self._episodes.is_committed((robot_id, episode_id), seq):
                self._staging.ack(key)  # committed, but released too late before the crash
                continue
            try:
                segment = decode_message(frames)
                if not isinstance(segment, Segment):
                    raise ProtocolError(f"a staged {segment.TYPE!r} message is no segment")
                check_segment(segment)
            except ProtocolError as exc:
                self._quarantine(key, frames, exc)
                continue
            episode = self._episodes.track(robot_id, episode_id, seq, segment.num_steps, segment.episode_done)
            self._episodes.add_staged_bytes(episode, sum(len(f) for f in frames))
            order.append((episode.index_key, key))
        if order:
            self._feed.backlog(Backlog(self._staging.reader([key for _, key in order]), order))
        return [key for key, episode in self._episodes.open.items()
                if episode.complete or episode.index_key in pending_intents]

    def _quarantine(self, key: str, frames: list[bytes], exc: ProtocolError) -> None:
        """A staged segment that no longer passes the checks (staged by a learner whose checks were
        looser, or its bytes changed on disk) moves from staging to the ``quarantine`` spool beside
        it, so start-up goes on and does not fail on it again at every restart; it stays there to be
        looked at (``Spool(root / "quarantine").pending()``)."""
        with Spool(self._root / "quarantine") as quarantine:
            if key not in quarantine:
                quarantine.append(key, frames)
        self._staging.ack(key)
        self._counters["quarantined_segments"] += 1
        log.error("staged segment %s does not pass the checks (%s); moved to %s, not stored", key, exc,
                  self._root / "quarantine")
