"""The replay store: every streamed step stored exactly once, on disk and in a sampling index.

Path of a segment (edge -> learner):

1. ``ingest`` decodes and validates it (layout, finite numbers), then checks the dedup
   key (robot_id, episode_id, seq) against what is staged or committed. A duplicate is
   acknowledged as such and dropped.
2. A new segment is appended to the *staging* log (``robot_rl.bridges.zmq.Spool``) as the very
   frames that arrived; the segments that arrived together share one fsync (group commit,
   ``ingest_many``). Only after that fsync may the learner ack them: they survive a crash.
   Then they go into the in-memory ``SamplingIndex`` -- with ``background_commit``, on its
   own thread (``store-index``, bounded queue), since staging, not the index, is the record;
   ``flush`` / ``flush_index`` wait for it.
3. When the episode is finished (``episode_done`` and no seq missing), or is cut short
   (the robot started a newer episode and none of this one's seqs is missing, or it went silent
   for ``episode_timeout_s``), it is
   *committed*: written to the LeRobotDataset v3 by ``EpisodeRecorder`` between an intent
   and a commit line of the ``Ledger``, then its staged records are released. The recorder
   runs in a process of its own by default (``store_writer``, ``StoreConfig.writer``), which
   takes the staged frames as they are: LeRobot's writing never holds the trainer's GIL. Episodes that
   queued up behind a busy writer, or that arrive within ``commit_linger_s`` of each other,
   are saved together and finalized once (``commit_batch``); their commit lines and releases
   follow that finalize.

Each committed robot episode's outcome (success, interventions, the policy version that
drove it) goes to ``outcomes``, which learning curves per policy version are made from.

On restart the store rebuilds everything from disk: committed seqs from the ledger,
half-done commits resolved against the dataset (which the recorder first rolls back to its
last finalize if a write was cut short), open episodes from staging, committed episodes into
the index from the dataset (demonstrations are preloaded at start-up). The dataset is read into the index
behind a store that already takes segments (``SamplingIndex.loading``): a restart does not
grow with the store; the trainer and the writer wait for that read, robots do not.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from robot_rl.bridges.zmq.codec import BusyError
from robot_rl.bridges.zmq.protocol import ProtocolError, Segment, decode_message, encode_message
from robot_rl.bridges.zmq.segments import OPTIONAL_ARRAYS, decode_segment
from robot_rl.bridges.zmq.spool import Spool
from robot_rl.core.errors import CorruptFileError
from robot_rl.core.priority import lower_own_priority
from robot_rl.core.types import Step
from robot_rl.data.validation import check_dataset
from robot_rl.learner.config import StoreConfig
from robot_rl.learner.index import (
    DEMO_ROBOT,
    SamplingIndex,
    dataset_episode_to_columns,
    fit_step_frames,
    steps_to_columns,
)
from robot_rl.learner.layout import RecordedLayout, differences, mismatch, pinned_layout, read_layout, write_layout
from robot_rl.learner.ledger import CommitRecord, Ledger
from robot_rl.learner.metrics import OutcomeTracker, outcome_from_columns
from robot_rl.learner.store_writer import RecorderSpec, make_writer
from robot_rl.learner.stored_frames import LEFT_OUT, FrameReader, StoredEpisode
from robot_rl.policies.trainable import InputFrames

log = logging.getLogger(__name__)

EpisodeKey = tuple[str, int]  # (robot_id, episode_id)
DECODE_WORKERS = 2  # threads decoding (validating) the images of a batch of segments
INDEX_QUEUE = 64  # decoded segments waiting for the index thread
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
class IngestResult:
    duplicate: bool
    num_steps: int


@dataclass
class _OpenEpisode:
    """An episode (fragment) whose segments are staged but not yet in the dataset."""

    robot_id: str
    episode_id: int
    fragment: int
    seqs: dict[int, int] = field(default_factory=dict)  # seq -> number of steps
    done_seq: int | None = None
    last_seen_s: float = field(default_factory=time.monotonic)
    # The first seq this fragment must hold: 0, or past the pieces already stored as truncated (the
    # robot went silent longer than episode_timeout_s, a network cut, and then sent the rest).
    first_seq: int = 0
    nbytes: int = 0  # staged bytes of its segments (StoreConfig.max_staged_bytes_per_robot)

    @property
    def complete(self) -> bool:
        return self.done_seq is not None and all(s in self.seqs for s in range(self.first_seq, self.done_seq + 1))

    @property
    def contiguous(self) -> bool:
        """No segment missing between its first and the last one received."""
        return all(s in self.seqs for s in range(self.first_seq, max(self.seqs, default=self.first_seq) + 1))


def _staging_key(robot_id: str, episode_id: int, seq: int) -> str:
    return json.dumps([robot_id, episode_id, seq])


class ReplayStore:
    """Exactly-once, crash-safe storage of streamed episodes plus the trainer's sampling index."""

    def __init__(self, config: StoreConfig, *, train_cameras: Sequence[str] | None = None,
                 input_frames: Mapping[str, InputFrames] | None = None,
                 decode_workers: int = DECODE_WORKERS) -> None:
        """``train_cameras``: the cameras the policy reads (what the sampling index keeps) when
        ``config.cameras`` does not say which are recorded; ``input_frames``: the size the policy reads
        them at (the index keeps them at it; ``TrainablePolicy.input_frames``)."""
        self.config = config
        root = self.root = Path(config.root)
        root.mkdir(parents=True, exist_ok=True)
        self.dataset_root = root / "dataset"
        # Read before anything opens them: a damaged file is one CorruptFileError naming it, not a
        # traceback at start or a trainer that waits forever for an index its loader could not fill.
        check_dataset(self.dataset_root)
        if config.demonstrations:
            check_dataset(config.demonstrations)
        self.layout = self._known_layout(root)
        cameras = config.cameras or train_cameras or (self.layout.cameras if self.layout else None)
        if not cameras:
            raise ValueError("ReplayStore: say which cameras to train on (learner.store.cameras, or the policy's)")
        self._decoder = (ThreadPoolExecutor(decode_workers, thread_name_prefix="store-decode")
                         if decode_workers > 1 else None)
        self.writer: Any = None  # opened once the layout is known (at start, or at the first robot's hello)
        fits = {cam: fit for cam, fit in (input_frames or {}).items() if cam in cameras}
        self.frame_reader = FrameReader(fits, config.index_read_workers)
        self.index = SamplingIndex(cameras, fits, memory_budget=config.index_memory_bytes(), reader=self.frame_reader)
        self.outcomes = OutcomeTracker()
        self.counters: Counter[str] = Counter()
        self._lock = threading.RLock()  # staging spool, ledger and the dedup maps
        self._ledger = Ledger(root / "ledger.jsonl")
        self._staging = Spool(root / "staging")
        self._committed: dict[EpisodeKey, set[int]] = {}
        self._fragments: Counter[EpisodeKey] = Counter()
        self._open: dict[EpisodeKey, _OpenEpisode] = {}
        self._open_of_robot: dict[str, EpisodeKey] = {}
        self._staged_bytes: Counter[str] = Counter()  # robot -> bytes staged and not yet in the dataset
        self._held_back: set[str] = set()  # robots past max_staged_bytes_per_robot (said once each time)
        self._staging_failing = 0  # segments refused since the staging log last took a write (said once)
        self._behind_said_at = 2 * config.commit_batch  # closed episodes queued that make _say_if_behind warn
        self._jobs: queue.Queue[_OpenEpisode | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._draining = 0  # flush() calls under way: the writer stops lingering for them
        self._committer: threading.Thread | None = None
        self._index_jobs: queue.Queue[tuple[str, tuple, Sequence[Step] | StoredEpisode | None] | None] | None = None
        self._indexer: threading.Thread | None = None
        self._loader: threading.Thread | None = None  # the dataset into the index, after a restart
        self._load_demonstrations()
        if config.background_commit:
            # Started before the store is restored: the episodes staged before a restart are written
            # behind the learner's back, so it serves robots within seconds however long the backlog.
            self._committer = threading.Thread(target=self._commit_loop, name="store-commit", daemon=True)
            self._committer.start()
            # Index appends (stacking and copying every frame into the growing episode arrays) leave
            # the serving thread too: nothing waits for them before an ack, since staging is the record.
            self._index_jobs = queue.Queue(maxsize=INDEX_QUEUE)  # full: ingest waits (bounded memory)
            self._indexer = threading.Thread(target=self._index_loop, name="store-index", daemon=True)
            self._indexer.start()
        try:
            if self.layout is not None:
                with self._lock:
                    self._open_store(self.layout)
            elif len(self._staging):
                raise ValueError(f"{root} holds staged segments but no {root / 'layout.json'}: the store is damaged")
            else:
                log.info("replay store %s is new: it records the layout of the first robot that says hello", root)
        except BaseException:
            self.close()  # its threads, the writer and the staging lock go with it
            raise

    # ------------------------------------------------------------ layout

    def _known_layout(self, root: Path) -> RecordedLayout | None:
        """The layout from ``layout.json`` (checked against what ``learner.store`` pins), else the
        one the config pins completely, else None (the first robot's hello decides)."""
        stored = read_layout(root)
        if stored is None:
            return pinned_layout(self.config)
        pinned = differences(self.config, stored)
        if pinned:
            raise ValueError(f"learner.store pins a layout the store at {root} does not record: it has "
                             f"{'; '.join(pinned)}; use another learner.store.root or drop those settings")
        return stored

    def _open_store(self, layout: RecordedLayout) -> None:
        """Open the dataset writer for ``layout`` and rebuild what is on disk (ledger, dataset, staging)."""
        missing = [c for c in self.index.cameras if c not in layout.cameras]
        if missing:  # checked before anything is written or started
            raise ValueError(f"the policy trains on cameras {list(self.index.cameras)}, the store records "
                             f"{list(layout.cameras)}")
        write_layout(self.config.root, layout)
        # In its own process by default (config.writer): LeRobot's writer would hold the GIL the trainer needs.
        self.writer = make_writer(self.config.writer, RecorderSpec(str(self.dataset_root), layout.fps,
                                                                   layout.joint_names, layout.camera_shapes,
                                                                   self.config.repo_id, self.config.frames),
                                  nice=self.config.commit_nice)
        self._restore()

    def adopt_layout(self, offered: RecordedLayout) -> str | None:
        """A robot's layout (from its hello): the store's from now on if it has none yet; else it
        must match. Returns None when the robot may stream, else one line saying why not."""
        with self._lock:
            if self.layout is not None:
                different = mismatch(self.layout, offered)
                return None if different is None else f"this robot records {different}"
            pinned = differences(self.config, offered)
            if pinned:
                return f"this robot records {'; '.join(pinned)}"
            missing = [c for c in self.index.cameras if c not in offered.cameras]
            if missing:
                return (f"the learner's policy reads cameras {list(self.index.cameras)}, this robot has "
                        f"{list(offered.cameras)}")
            self._open_store(offered)
            self.layout = offered
            log.info("replay store %s records %s (from the first robot's hello)", self.config.root,
                     offered.describe())
            return None

    # ------------------------------------------------------------ ingest

    def ingest(self, segment: Segment) -> IngestResult:
        """Store one segment unless already stored. Raises ``ProtocolError`` for bad content.

        When this returns, the segment is durable: the caller may acknowledge it.
        """
        result = self.ingest_many([segment])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def ingest_many(self, segments: Sequence[Segment]) -> list[IngestResult | Exception]:
        """Store a batch of segments (arrival order) with one fsync: a result per segment.

        ``ProtocolError`` (bad content) or another exception stands in for the segments that
        were not stored; the others are durable when this returns and may be acknowledged.
        Images are decoded (validated) on ``decode_workers`` threads: OpenCV releases the GIL.
        """
        decoded = self._decode_all(segments)
        results: dict[int, IngestResult | Exception] = {}  # by position in segments; each gets one
        with self._lock:
            # 1. dedup and write to staging; nothing here counts as stored before the fsync.
            staged: list[int] = []
            batch_keys: set[tuple[str, int, int]] = set()
            nbytes: dict[int, int] = {}
            for i, (segment, steps) in enumerate(zip(segments, decoded, strict=True)):
                if isinstance(steps, Exception):
                    results[i] = steps
                    continue
                triple = (segment.robot_id, segment.episode_id, segment.seq)
                if triple in batch_keys or self._already_stored(triple[:2], segment.seq):
                    self.counters["duplicate_segments"] += 1
                    results[i] = IngestResult(duplicate=True, num_steps=segment.num_steps)
                    continue
                frames = encode_message(segment)
                nbytes[i] = sum(memoryview(f).nbytes for f in frames)
                held = self._held_back_for(segment.robot_id, nbytes[i], sum(
                    nbytes[j] for j in staged if segments[j].robot_id == segment.robot_id))
                if held is not None:
                    results[i] = held
                    continue
                staging_key = _staging_key(*triple)
                try:
                    if staging_key not in self._staging:  # else: staged by a batch whose fsync failed
                        self._staging.append(staging_key, frames, sync=False)
                except OSError as exc:  # a full disk: not stored, not acked, the edge re-sends it
                    results[i] = self._staging_failed(exc, 1)
                    continue
                batch_keys.add(triple)
                staged.append(i)
            # 2. group commit: one fsync makes the whole batch durable.
            try:
                self._staging.sync()
            except OSError as exc:
                failed = self._staging_failed(exc, len(staged))
                for i in staged:
                    results[i] = failed
                staged = []
            if staged and self._staging_failing:
                log.warning("the staging log takes writes again (%d segments were refused meanwhile; the robots "
                            "re-send them)", self._staging_failing)
                self._staging_failing = 0
            # 3. bookkeeping and the sampling index, in arrival order.
            for i in staged:
                segment, steps = segments[i], decoded[i]
                assert not isinstance(steps, Exception)
                key = (segment.robot_id, segment.episode_id)
                previous = self._open_of_robot.get(segment.robot_id)
                episode = self._track(segment.robot_id, segment.episode_id, segment.seq, len(steps),
                                      segment.episode_done)
                self._add_staged_bytes(episode, nbytes[i])
                self._add_to_index(episode, steps)
                self.counters["segments"] += 1
                self.counters["steps"] += len(steps)
                if previous is not None and previous != self._open_of_robot.get(segment.robot_id):
                    self._close_if_left(previous)  # the robot started a newer episode
                if episode.complete:
                    self._close(key)
                results[i] = IngestResult(duplicate=False, num_steps=len(steps))
        return [results[i] for i in range(len(segments))]

    def _held_back_for(self, robot_id: str, nbytes: int, in_batch: int) -> BusyError | None:
        """Why this robot's segment must wait (``max_staged_bytes_per_robot``), or None. A robot with
        nothing staged always gets one in, however big: its own bound never locks it out."""
        limit = self.config.max_staged_bytes_per_robot
        staged = self._staged_bytes[robot_id] + in_batch
        if staged == 0 or staged + nbytes <= limit:
            if robot_id in self._held_back:
                self._held_back.discard(robot_id)
                log.info("robot %s: its staged segments are below learner.store.max_staged_bytes_per_robot "
                         "again; its segments are taken", robot_id)
            return None
        self.counters["segments_held_back"] += 1
        if robot_id not in self._held_back:
            self._held_back.add(robot_id)
            log.warning("robot %s has %d bytes staged that the dataset writer has not written yet, at "
                        "learner.store.max_staged_bytes_per_robot (%d): its segments are refused, not acked "
                        "(they wait in its spool) until the writer catches up", robot_id, staged, limit)
        return BusyError(f"the learner holds {staged} bytes of this robot's segments that its dataset writer has "
                         f"not written yet (its bound: {limit}); this segment stays with the robot, which sends it "
                         "again")

    def _staging_failed(self, exc: OSError, segments: int) -> BusyError:
        """A staging write or fsync failed (a full disk): the segments are not acked; said once per outage."""
        self.counters["staging_write_failures"] += segments
        if not self._staging_failing:
            log.error("STAGING FAILED: cannot write to %s (%s). Segments are refused, not acked: the robots keep "
                      "them in their spools and re-send them; nothing is lost. Free space on that disk.",
                      self._staging.path, exc)
        self._staging_failing += segments
        return BusyError(f"the learner could not stage this segment ({type(exc).__name__}: a full disk?); it "
                         "stays with the robot, which sends it again")

    def _add_staged_bytes(self, episode: _OpenEpisode, nbytes: int) -> None:
        episode.nbytes += nbytes
        self._staged_bytes[episode.robot_id] += nbytes

    def _decode_all(self, segments: Sequence[Segment]) -> list[list[Step] | Exception]:
        if self._decoder is None or len(segments) < 2:
            return [self._decode(s) for s in segments]
        return list(self._decoder.map(self._decode, segments))

    def _decode(self, segment: Segment) -> list[Step] | Exception:
        try:
            self._check_layout(segment)  # first: images are decoded only at the sizes this learner stores
            return self._fitted(decode_segment(segment))
        except Exception as exc:  # noqa: BLE001 - reported per segment
            return exc

    def _fitted(self, steps: list[Step]) -> list[Step]:
        """Decoded steps as the index keeps them (the policy's cameras at its input size): staging holds
        the segment as it arrived, and these wait for the index thread only."""
        return fit_step_frames(steps, self.index.cameras, self.index.input_frames)

    def close_stale(self, now_s: float | None = None) -> int:
        """Commit open episodes silent for ``episode_timeout_s`` as truncated; returns how many."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            stale = [k for k, ep in self._open.items() if now_s - ep.last_seen_s > self.config.episode_timeout_s]
            for key in stale:
                log.warning("robot %s episode %d silent for %.0f s; storing it as truncated", *key,
                            now_s - self._open[key].last_seen_s)
                self._close(key)
        return len(stale)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every ingested segment is in the sampling index and every closed episode in the dataset."""
        deadline = time.monotonic() + timeout_s
        if not self.flush_index(timeout_s):
            return False
        if self._committer is None:
            return True
        with self._lock:
            self._draining += 1
        try:
            return self._idle.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._draining -= 1

    def flush_index(self, timeout_s: float = 60.0) -> bool:
        """Wait until the sampling index holds every segment ingested so far (it trails by a few ms)."""
        jobs = self._index_jobs
        if jobs is None:
            return True
        deadline = time.monotonic() + timeout_s
        if not self.index.wait_loaded(timeout_s):
            return False
        with jobs.all_tasks_done:
            while jobs.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                jobs.all_tasks_done.wait(remaining)
        return True

    def close(self) -> None:
        """Finish pending commits and release files. Open episodes stay staged for the next start."""
        if self._loader is not None:
            self._loader.join()  # the writer waits for it; a read of the dataset takes seconds
            self._loader = None
        if self._committer is not None:
            self._jobs.put(None)
            self._committer.join()
            self._committer = None
        if self._decoder is not None:
            self._decoder.shutdown(wait=True)
        if self._indexer is not None and self._index_jobs is not None:
            self._index_jobs.put(None)
            self._indexer.join()
            self._indexer = None
        if self.writer is not None:
            self.writer.close()
        self.frame_reader.close()
        with self._lock:
            self._ledger.close()
            self._staging.close()

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ queries

    def stats(self) -> dict[str, int]:
        """Counters; the ``*_steps`` of the sampling index may trail ``steps_ingested`` by a few ms (``flush``)."""
        counts = self.index.counts()
        with self._lock:
            return {
                "episodes_stored": self.writer.num_episodes if self.writer is not None else 0,
                "episodes_open": len(self._open),
                # Closed, acked and staged, not in the dataset yet: a count that keeps growing says the
                # dataset writer cannot keep up with the robots (nothing is lost; restarts write them).
                "episodes_to_write": self._jobs.qsize() if self._committer is not None else 0,
                "segments_staged": len(self._staging),
                "segments_ingested": self.counters["segments"],
                "duplicate_segments": self.counters["duplicate_segments"],
                # Refused, not acked, waiting on the robots: past max_staged_bytes_per_robot, or a full disk.
                "segments_held_back": self.counters["segments_held_back"],
                "staging_write_failures": self.counters["staging_write_failures"],
                "bytes_staged": sum(self._staged_bytes.values()),
                "episodes_lost_to_damage": self.counters["episodes_lost_to_damage"],  # see _report_lost_commits
                # Stored, but their frames do not decode: out of training (read in at start, or sampled later).
                "episodes_quarantined": self.counters["episodes_quarantined"] + len(self.index.quarantined),
                "steps_ingested": self.counters["steps"],
                **{f"{stream}_steps": n for stream, n in counts.items()},
                "held_steps": self.index.held_steps(),  # robot ticks no stream samples (see index)
            }

    # ------------------------------------------------------------ internals: bookkeeping

    def _already_stored(self, key: EpisodeKey, seq: int) -> bool:
        if seq in self._committed.get(key, ()):
            return True
        episode = self._open.get(key)
        return episode is not None and seq in episode.seqs

    def _close_if_left(self, key: EpisodeKey) -> None:
        """The episode its robot has just left for a newer one is stored as truncated, unless a segment is
        missing before its last: one re-sent late (after the robot had moved on) would then be stored
        apart, the episode in pieces out of order. With a gap it stays open for the missing segments,
        which the robot re-sends from its spool (or for ``episode_timeout_s``)."""
        episode = self._open.get(key)
        if episode is None or not episode.contiguous:
            return
        log.info("robot %s has left episode %d for a newer one; storing it as truncated", *key)
        self._close(key)

    def _track(self, robot_id: str, episode_id: int, seq: int, num_steps: int, done: bool) -> _OpenEpisode:
        key = (robot_id, episode_id)
        episode = self._open.get(key)
        if episode is None:
            stored = self._committed.get(key)
            episode = _OpenEpisode(robot_id, episode_id, self._fragments[key],
                                   first_seq=max(stored) + 1 if stored else 0)
            self._open[key] = episode
            current = self._open_of_robot.get(robot_id)
            # The robot's current episode is its newest (episode ids grow with time); a late fragment of an
            # old episode, or a late first segment of an older one, is not.
            if key not in self._committed and (current is None or episode_id > current[1]):
                self._open_of_robot[robot_id] = key
        episode.seqs[seq] = num_steps
        episode.last_seen_s = time.monotonic()
        if done:
            episode.done_seq = seq
        return episode

    def _add_to_index(self, episode: _OpenEpisode, steps: Sequence[Step]) -> None:
        if steps:
            self._index_op("append", (episode.robot_id, episode.episode_id, episode.fragment), steps)

    def _index_op(self, op: str, key: tuple, payload: Sequence[Step] | StoredEpisode | None = None) -> None:
        """Apply now, or queue for the indexer thread (one queue: appends, finishes and the dataset's
        episodes stay in order, so an episode's frames never leave memory before its last segment is in)."""
        if self._index_jobs is not None:
            self._index_jobs.put((op, key, payload))
        else:
            self._apply_index_op(op, key, payload)

    def _apply_index_op(self, op: str, key: tuple, payload: Sequence[Step] | StoredEpisode | None) -> None:
        if op == "append":
            assert isinstance(payload, Sequence)
            self.index.append(key, steps_to_columns(payload, self.index.cameras), payload[0].instruction)
        elif op == "stored":
            assert isinstance(payload, StoredEpisode)
            self.index.mark_stored(key, payload)
        else:
            self.index.mark_finished(key)

    def _index_loop(self) -> None:
        assert self._index_jobs is not None
        while True:
            job = self._index_jobs.get()
            try:
                if job is None:
                    return
                self._apply_index_op(*job)
            except Exception:  # the data is staged and will be in the dataset; only sampling misses it
                log.exception("could not add %s to the sampling index", job[1] if job else None)
            finally:
                self._index_jobs.task_done()

    def _close(self, key: EpisodeKey) -> None:
        """Move an open episode to the commit queue; its seqs count as stored from now on."""
        episode = self._open.pop(key)
        if self._open_of_robot.get(key[0]) == key:
            del self._open_of_robot[key[0]]
        self._committed.setdefault(key, set()).update(episode.seqs)
        self._fragments[key] += 1
        # Cut short (no done step) or complete, nothing more arrives: its returns are final now.
        self._index_op("finish", (episode.robot_id, episode.episode_id, episode.fragment))
        if self._committer is None:
            self._commit([episode])
        else:
            self._idle.clear()
            self._jobs.put(episode)
            self._say_if_behind()

    def writer_backlog(self) -> WriterBacklog:
        with self._lock:
            return WriterBacklog(self._jobs.qsize(), sum(self._staged_bytes.values()))

    def _say_if_behind(self) -> None:
        """Warn when closed episodes pile up before the writer (two batches' worth, then each doubling):
        the staged segments wait on disk, not in memory, but a writer that never catches up ends in
        robots held back at max_staged_bytes_per_robot."""
        waiting = self._jobs.qsize()
        if waiting < self._behind_said_at:
            if waiting <= self.config.commit_batch:
                self._behind_said_at = 2 * self.config.commit_batch
            return
        self._behind_said_at = 2 * waiting
        log.warning("the dataset writer is %d episodes behind (%.0f MB staged on disk): it cannot keep up with "
                    "what the robots send (robots are held back once max_staged_bytes_per_robot is staged); fewer "
                    "robots or cameras, or a learner with more cores", waiting, sum(self._staged_bytes.values()) / 1e6)

    def _check_layout(self, segment: Segment) -> None:
        """The segment's declared shapes against what this learner stores, before anything is decoded
        (decode_segment then checks every value and that the images decode to these shapes)."""
        where = f"segment {segment.robot_id}/{segment.episode_id}/{segment.seq}"
        layout = self.layout
        if layout is None:
            raise ProtocolError(f"{where}: no robot has said what it records yet (hello with features)",
                                code="rejected")
        if segment.num_steps == 0:
            return
        dim = len(layout.joint_names)
        for name in ("state", "action", *OPTIONAL_ARRAYS):
            value = segment.arrays.get(name)
            if name in OPTIONAL_ARRAYS and value is None:
                continue
            if value is None or value.shape[1:] != (dim,):
                got = None if value is None else tuple(value.shape[1:])
                raise ProtocolError(f"{where}: {name} has shape {got}, this learner stores ({dim},) "
                                    f"joints {list(layout.joint_names)}", code="rejected")
        declared = {cam: tuple(info["shape"]) if isinstance(info, dict) and isinstance(info.get("shape"), list)
                    else info for cam, info in segment.images.items()}
        expected = {cam: (h, w, 3) for cam, (h, w) in layout.camera_shapes.items()}
        if declared != expected:
            raise ProtocolError(f"{where}: images {declared}, this learner stores cameras {expected}", code="rejected")

    # ------------------------------------------------------------ internals: committing

    def _commit_loop(self) -> None:
        lower_own_priority(self.config.commit_nice)
        while True:
            batch, stop = self._next_batch()
            self.index.wait_loaded()  # a restarted store's dataset is read into the index before it grows
            if batch:
                self._commit(batch)
            if stop:
                self._idle.set()
                return
            if self._jobs.empty():
                self._idle.set()

    def _next_batch(self) -> tuple[list[_OpenEpisode], bool]:
        """The next closed episode plus those queued behind it or arriving within ``commit_linger_s``
        (up to ``commit_batch``): one dataset open/finalize per batch, whether the writer fell
        behind or episodes trickle in. A ``flush`` ends the wait at once."""
        batch: list[_OpenEpisode] = []
        job = self._jobs.get()
        linger_until = time.monotonic() + self.config.commit_linger_s
        while job is not None:
            batch.append(job)
            if len(batch) >= self.config.commit_batch:
                return batch, False
            next_job = self._next_job_before(linger_until)
            if next_job is _NO_JOB:
                return batch, False
            job = next_job
        return batch, True

    def _next_job_before(self, deadline: float) -> _OpenEpisode | None | Literal[_NoJob.NO_JOB]:
        """The next queued job (None: stop), waiting until ``deadline`` unless someone is flushing;
        ``_NO_JOB`` if none came."""
        while True:
            try:
                return self._jobs.get_nowait()
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._draining > 0:  # an int read: no lock (ingest holds it while it fsyncs)
                return _NO_JOB
            try:
                return self._jobs.get(timeout=min(remaining, LINGER_POLL_S))
            except queue.Empty:
                continue

    def _commit(self, batch: Sequence[_OpenEpisode]) -> None:
        try:
            self._commit_batch(batch)
        except Exception:
            # Disk trouble at the finalize, or the writer process gone: the batch stays staged and is
            # committed on the next start (the segments were acknowledged once staged).
            log.exception("could not store %d episode(s); they stay staged", len(batch))

    def _commit_batch(self, episodes: Sequence[_OpenEpisode]) -> None:
        """Write the episodes, finalize the dataset once, then commit them and release their staging.

        Until the finalize they are not readable from the dataset (``repair_interrupted_write``
        rolls a crash back to the last finalize), so they stay staged until then.
        """
        saved = [written for episode in episodes if (written := self._write_unfinalized(episode)) is not None]
        self.writer.finalize()  # raises on disk trouble: then nothing of the batch is released
        for episode, record, keys, outcome in saved:
            self._release(episode, record, keys, outcome)

    def _write_unfinalized(self, episode: _OpenEpisode) -> tuple[_OpenEpisode, CommitRecord, list[str],
                                                                  dict[str, np.ndarray] | None] | None:
        """Save one episode without finalizing; None if it could not be written (it stays staged)."""
        keys = [_staging_key(episode.robot_id, episode.episode_id, s) for s in sorted(episode.seqs)]
        try:
            staged = self._staged_frames(keys)
        except Exception:
            log.exception("episode %d of robot %s: staged segments unreadable; it stays staged",
                          episode.episode_id, episode.robot_id)
            return None
        has_steps = sum(episode.seqs.values()) > 0
        record = CommitRecord(episode.robot_id, episode.episode_id, episode.fragment,
                              self.writer.num_episodes if has_steps else -1, tuple(sorted(episode.seqs)))
        if not has_steps:
            return episode, record, keys, None
        with self._lock:
            self._ledger.write_intent(record)
        try:
            # On failure the recorder finalizes what the batch saved before this episode.
            written = self.writer.write(episode.robot_id, episode.episode_id, staged)
        except Exception as exc:  # noqa: BLE001 - RecordingError is a bug (validated at ingest), else disk trouble
            log.error("episode %d of robot %s could not be written (%s); it stays staged",
                      episode.episode_id, episode.robot_id, exc)
            with self._lock:
                self._ledger.write_abort(record)
            return None
        return episode, record, keys, written.outcome

    def _release(self, episode: _OpenEpisode, record: CommitRecord, keys: Sequence[str],
                 outcome: dict[str, np.ndarray] | None) -> None:
        """The episode is in the finalized dataset: commit line, then its staged segments go."""
        with self._lock:
            self._ledger.write_commit(record)
            for key in keys:
                self._staging.ack(key)
            self._staged_bytes[episode.robot_id] -= episode.nbytes
            if self._staged_bytes[episode.robot_id] <= 0:
                del self._staged_bytes[episode.robot_id]
        if outcome is not None:
            self._record_outcome(episode.robot_id, episode.episode_id, outcome)
            self._index_op("stored", (episode.robot_id, episode.episode_id, episode.fragment),
                           self._stored_episode(record.index))
        log.info("stored episode %d of robot %s (fragment %d): %d steps from %d segments, dataset episode %d",
                 episode.episode_id, episode.robot_id, episode.fragment,
                 0 if outcome is None else len(outcome["success"]), len(keys), record.index)

    def _stored_episode(self, index: int) -> StoredEpisode:
        return StoredEpisode(str(self.dataset_root), self.config.repo_id, index)

    def _record_outcome(self, robot_id: str, episode_id: int, columns: dict[str, np.ndarray]) -> None:
        self.outcomes.add(outcome_from_columns(robot_id, episode_id, columns["success"], columns["is_intervention"],
                                               columns["policy_version"]))

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

    # ------------------------------------------------------------ internals: restart

    def _restore(self) -> None:
        for record in self._ledger.commits:
            self._remember_commit(record)
        self._resolve_intents()
        self._report_lost_commits()
        self._start_index_load()  # before staging: what the backlog adds to the dataset is indexed from staging
        self._load_staging()
        log.info("replay store %s: %d episodes stored, %d open", self.config.root, self.writer.num_episodes,
                 len(self._open))

    def _report_lost_commits(self) -> None:
        """Committed (acked, released from staging) episodes the dataset no longer holds: its files
        were damaged after a finalize (a truncated or garbled parquet) and opening it rolled them
        back. Nothing here can bring them back; it is said loudly, never only as a repair warning."""
        lost = [r for r in self._ledger.commits if r.index >= self.writer.num_episodes]
        if not lost:
            return
        self.counters["episodes_lost_to_damage"] = len(lost)
        names = ", ".join(f"{r.robot_id}/{r.episode_id} (dataset episode {r.index})" for r in lost[:10])
        log.error("DATA LOST: the dataset at %s holds %d episodes, but %d committed episodes were acked after "
                  "it: %s%s. Its files were damaged after they were written (see the repair warning above and "
                  "%s.interrupted); restore them from a backup to get the episodes back", self.dataset_root,
                  self.writer.num_episodes, len(lost), names, " ..." if len(lost) > 10 else "", self.dataset_root)

    def _remember_commit(self, record: CommitRecord) -> None:
        key = (record.robot_id, record.episode_id)
        self._committed.setdefault(key, set()).update(record.seqs)
        self._fragments[key] = max(self._fragments[key], record.fragment + 1)

    def _resolve_intents(self) -> None:
        """A crash between dataset write and commit line: the dataset says which happened."""
        for record in list(self._ledger.pending_intents):
            if self.writer.num_episodes > record.index:
                log.info("episode %d of robot %s was written before a crash; completing its commit",
                         record.episode_id, record.robot_id)
                self._ledger.write_commit(record)
                self._remember_commit(record)
                for seq in record.seqs:
                    self._staging.ack(_staging_key(record.robot_id, record.episode_id, seq))

    def _start_index_load(self) -> None:
        """Read the dataset's episodes into the sampling index: with ``background_commit`` on a thread of
        its own, so that a restarted learner serves robots before it has read a store of any size (the
        trainer waits for it: ``SamplingIndex.loaded``). The writer waits too, so the read sees a dataset
        no one writes to."""
        count = self.writer.num_episodes
        if count == 0:
            return
        by_index = {r.index: r for r in self._ledger.commits if r.index >= 0}
        if self._committer is None:
            self._load_dataset_into_index(by_index)
            return
        self.index.loading()
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
            self.index.loaded(error=str(exc))
            return
        except Exception as exc:
            log.exception("could not read the dataset at %s into the sampling index; robots are still stored, "
                          "but training waits", self.dataset_root)
            self.index.loaded(error=f"{type(exc).__name__}: {exc}")
            return
        self.index.loaded()
        log.info("sampling index: %d stored episodes read in %.1f s behind the serving learner; streams %s",
                 count, time.monotonic() - started, self.index.counts())

    def _load_dataset_into_index(self, by_index: dict[int, CommitRecord]) -> None:
        from robot_rl.data.reader import iter_episode_arrays

        for episode in iter_episode_arrays(self.dataset_root, self.config.repo_id,
                                           on_unreadable=self._quarantine_stored_episode):
            record = by_index.get(episode["episode_index"])
            if record is None:
                log.warning("dataset episode %d has no ledger entry; indexing it as online data",
                            episode["episode_index"])
                key = ("~unledgered", int(episode["episode_index"]), 0)
            else:
                key = (record.robot_id, record.episode_id, record.fragment)
            columns = dataset_episode_to_columns(episode, self.index.cameras)
            self.index.append(key, columns, episode["instruction"])
            self.index.mark_stored(key, self._stored_episode(episode["episode_index"]))  # memory stays bounded
            self._record_outcome(key[0], key[1], columns)

    def _quarantine_stored_episode(self, index: int, path: Path, exc: Exception) -> None:
        """A stored episode whose rows or frames do not decode stays out of the sampling index (the
        others load, training goes on); said in one line, counted in ``episodes_quarantined``."""
        self.counters["episodes_quarantined"] += 1
        log.error("%s", CorruptFileError(path, f"dataset episode {index} does not decode ({type(exc).__name__}: "
                                         f"{exc})", LEFT_OUT))

    def _load_demonstrations(self) -> None:
        if not self.config.demonstrations:
            return
        from robot_rl.data.reader import iter_episode_arrays

        count = 0
        for i, episode in enumerate(iter_episode_arrays(self.config.demonstrations,
                                                        self.config.demonstrations_repo_id)):
            key = (DEMO_ROBOT, i, 0)
            self.index.append(key, dataset_episode_to_columns(episode, self.index.cameras, robot_episode=False),
                              episode["instruction"])
            self.index.mark_stored(key, StoredEpisode(str(self.config.demonstrations),
                                                      self.config.demonstrations_repo_id, episode["episode_index"]))
            count += 1
        log.info("preloaded %d demonstration episodes from %s", count, self.config.demonstrations)

    def _quarantine(self, key: str, frames: list[bytes], exc: ProtocolError) -> None:
        """A staged segment that no longer passes the checks (staged by a learner whose checks were
        looser, or its bytes changed on disk) moves from staging to the ``quarantine`` spool beside
        it, so start-up goes on and does not fail on it again at every restart; it stays there to be
        looked at (``Spool(root / "quarantine").pending()``)."""
        with Spool(self.root / "quarantine") as quarantine:
            if key not in quarantine:
                quarantine.append(key, frames)
        self._staging.ack(key)
        self.counters["quarantined_segments"] += 1
        log.error("staged segment %s does not pass the checks (%s); moved to %s, not stored", key, exc,
                  self.root / "quarantine")

    def _load_staging(self) -> None:
        """Re-open the episodes whose segments were staged but not committed before the restart."""
        pending_intents = {(r.robot_id, r.episode_id, r.fragment) for r in self._ledger.pending_intents}
        for key, frames in list(self._staging.pending()):
            robot_id, episode_id, seq = json.loads(key)
            if seq in self._committed.get((robot_id, episode_id), ()):
                self._staging.ack(key)  # committed, but released too late before the crash
                continue
            try:
                segment = decode_message(frames)
                if not isinstance(segment, Segment):
                    raise ProtocolError(f"a staged {segment.TYPE!r} message is no segment")
                steps = self._fitted(decode_segment(segment))
            except ProtocolError as exc:
                self._quarantine(key, frames, exc)
                continue
            episode = self._track(robot_id, episode_id, seq, len(steps), segment.episode_done)
            self._add_staged_bytes(episode, sum(len(f) for f in frames))
            self._add_to_index(episode, steps)
        for open_key, episode in list(self._open.items()):
            if episode.complete or (episode.robot_id, episode.episode_id, episode.fragment) in pending_intents:
                self._close(open_key)
