"""The replay store: every streamed step stored exactly once, on disk and in a sampling index.

Path of a segment (edge -> learner), and the module that does each stage:

1. ``ingest`` decodes and validates it (layout, finite numbers), then checks the dedup
   key (robot_id, episode_id, seq) against what is staged or committed (``open_episodes``). A
   duplicate is acknowledged as such and dropped.
2. A new segment is appended to the *staging* log (``robot_rl.bridges.zmq.Spool``) as the very
   frames that arrived; the segments that arrived together share one fsync (group commit,
   ``ingest_many``). Only after that fsync may the learner ack them: they survive a crash.
   Then they go into the in-memory ``SamplingIndex`` (``index_feed``: with ``background_commit``
   on its own thread, since staging, not the index, is the record); ``flush`` / ``flush_index``
   wait for it.
3. When the episode is finished (``episode_done`` and no seq missing), or is cut short
   (the robot started a newer episode and none of this one's seqs is missing, or it went silent
   for ``episode_timeout_s``), it is *committed* (``commit``): written to the LeRobotDataset v3
   by ``EpisodeRecorder`` between an intent and a commit line of the ``Ledger``, then its staged
   records are released. The recorder runs in a process of its own by default (``store_writer``,
   ``StoreConfig.writer``), which takes the staged frames as they are: LeRobot's writing never
   holds the trainer's GIL. Episodes that queued up behind a busy writer, or that arrive within
   ``commit_linger_s`` of each other, are saved together and finalized once (``commit_batch``);
   their commit lines and releases follow that finalize.

Each committed robot episode's outcome (success, interventions, the policy version that
drove it) goes to ``outcomes``, which learning curves per policy version are made from.

On restart the store rebuilds everything from disk (``recovery``): committed seqs from the
ledger, half-done commits resolved against the dataset (which the recorder first rolls back to
its last finalize if a write was cut short), open episodes from staging, committed episodes into
the index from the dataset (demonstrations are preloaded at start-up). The dataset is read into
the index behind a store that already takes segments (``SamplingIndex.loading``): a restart does
not grow with the store; the trainer and the writer wait for that read, robots do not.

This module holds the public API and wires the parts: it owns the one lock under which ingest,
the commit thread and recovery change the staging log, the ledger and the ``EpisodeBook``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_rl.bridges.zmq.codec import BusyError
from robot_rl.bridges.zmq.protocol import ProtocolError, Segment, encode_message
from robot_rl.bridges.zmq.segments import OPTIONAL_ARRAYS, decode_segment
from robot_rl.bridges.zmq.spool import Spool
from robot_rl.core.heap import map_big_blocks
from robot_rl.core.types import Step
from robot_rl.data.validation import check_dataset
from robot_rl.learner.commit import Committer, WriterBacklog
from robot_rl.learner.config import StoreConfig
from robot_rl.learner.frame_spill import FrameSpill
from robot_rl.learner.index import SamplingIndex
from robot_rl.learner.index_feed import IndexFeed
from robot_rl.learner.layout import RecordedLayout, differences, mismatch, pinned_layout, read_layout, write_layout
from robot_rl.learner.ledger import Ledger
from robot_rl.learner.metrics import OutcomeTracker
from robot_rl.learner.open_episodes import EpisodeBook, EpisodeKey, staging_key
from robot_rl.learner.recovery import Recovery, load_demonstrations
from robot_rl.learner.store_writer import RecorderSpec, make_writer
from robot_rl.learner.stored_frames import FrameReader
from robot_rl.policies.trainable import InputFrames

if TYPE_CHECKING:  # the judge brings torch, LeRobot's classifier and transformers: a learner that judges loads them
    from robot_rl.learner.judging import EpisodeJudging, Piece

log = logging.getLogger(__name__)

DECODE_WORKERS = 2  # threads decoding (validating) the images of a batch of segments
# A writer that cannot keep up holds the robots back every few seconds: said once, then at most this often.
INDEX_HOLD_SAY_EVERY_S = 300.0
_Decoded = tuple[list[Step], "Piece | None"]  # a segment's steps for the index, the success judge's share


@dataclass(frozen=True)
class IngestResult:
    duplicate: bool
    num_steps: int


class ReplayStore:
    """Exactly-once, crash-safe storage of streamed episodes plus the trainer's sampling index."""

    def __init__(self, config: StoreConfig, *, train_cameras: Sequence[str] | None = None,
                 input_frames: Mapping[str, InputFrames] | None = None,
                 decode_workers: int = DECODE_WORKERS, judging: EpisodeJudging | None = None) -> None:
        """``train_cameras``: the cameras the policy reads (what the sampling index keeps) when
        ``config.cameras`` does not say which are recorded; ``input_frames``: the size the policy reads
        them at (the index keeps them at it; ``TrainablePolicy.input_frames``); ``judging``: the success
        judge that learns from judged episodes and judges the others before they are stored (None: none)."""
        self.config = config
        self.judging = judging
        map_big_blocks()  # the decode threads turn robots' JPEGs into 640x480 frames by the hundred a second
        root = self.root = Path(config.root)
        root.mkdir(parents=True, exist_ok=True)
        self.dataset_root = config.dataset_root
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
        spill_bytes = config.index_spill_bytes(shutil.disk_usage(root).free)
        self.frame_spill = FrameSpill(root / "index_spill", spill_bytes) if spill_bytes > 0 else None
        self.index = SamplingIndex(cameras, fits, memory_budget=config.index_memory_bytes(), reader=self.frame_reader,
                                   spill=self.frame_spill)
        self.outcomes = OutcomeTracker()
        self.counters: Counter[str] = Counter()
        self._lock = threading.RLock()  # staging spool, ledger and the dedup bookkeeping
        self._ledger = Ledger(root / "ledger.jsonl")
        self._staging = Spool(root / "staging")
        self._episodes = EpisodeBook()
        self._held_back: set[str] = set()  # robots past max_staged_bytes_per_robot (said once each time)
        self._index_holding = False  # robots held back by the index's memory budget
        self._index_holds = 0  # how many times so far
        self._index_hold_said_at: float | None = None  # said at most every INDEX_HOLD_SAY_EVERY_S
        self._staging_failing = 0  # segments refused since the staging log last took a write (said once)
        self._recovery: Recovery | None = None  # once the layout is known
        load_demonstrations(config, self.index)
        self._feed = IndexFeed(self.index, background=config.background_commit)
        self._committer = Committer(config, dataset_root=self.dataset_root, lock=self._lock, ledger=self._ledger,
                                    staging=self._staging, episodes=self._episodes, feed=self._feed,
                                    outcomes=self.outcomes, judging=judging)
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
        self._committer.open(self.writer)
        self._recovery = Recovery(self.config, dataset_root=self.dataset_root, ledger=self._ledger,
                                  staging=self._staging, episodes=self._episodes, writer=self.writer, feed=self._feed,
                                  outcomes=self.outcomes, counters=self.counters)
        for key in self._recovery.restore():
            self._close(key)
        log.info("replay store %s: %d episodes stored, %d open", self.config.root, self.writer.num_episodes,
                 len(self._episodes.open))

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
            for i, (segment, outcome) in enumerate(zip(segments, decoded, strict=True)):
                if isinstance(outcome, Exception):
                    results[i] = outcome
                    continue
                triple = (segment.robot_id, segment.episode_id, segment.seq)
                if triple in batch_keys or self._episodes.already_stored(triple[:2], segment.seq):
                    self.counters["duplicate_segments"] += 1
                    results[i] = IngestResult(duplicate=True, num_steps=segment.num_steps)
                    continue
                frames = encode_message(segment)
                nbytes[i] = sum(memoryview(f).nbytes for f in frames)
                held = self._held_back_for(segment.robot_id, nbytes[i], sum(
                    nbytes[j] for j in staged if segments[j].robot_id == segment.robot_id)) or self._index_full()
                if held is not None:
                    results[i] = held
                    continue
                key = staging_key(*triple)
                try:
                    if key not in self._staging:  # else: staged by a batch whose fsync failed
                        self._staging.append(key, frames, sync=False)
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
                segment, outcome = segments[i], decoded[i]
                assert not isinstance(outcome, Exception)
                steps, judged = outcome
                previous = self._episodes.current_episode(segment.robot_id)
                episode = self._episodes.track(segment.robot_id, segment.episode_id, segment.seq, len(steps),
                                               segment.episode_done)
                self._episodes.add_staged_bytes(episode, nbytes[i])
                self._feed.append(episode.index_key, steps)
                if self.judging is not None:
                    self.judging.add(episode.index_key, segment.seq, judged)
                self.counters["segments"] += 1
                self.counters["steps"] += len(steps)
                if previous is not None and previous != self._episodes.current_episode(segment.robot_id):
                    self._close_if_left(previous)  # the robot started a newer episode
                if episode.complete:
                    self._close((segment.robot_id, segment.episode_id))
                results[i] = IngestResult(duplicate=False, num_steps=len(steps))
        return [results[i] for i in range(len(segments))]

    def _held_back_for(self, robot_id: str, nbytes: int, in_batch: int) -> BusyError | None:
        """Why this robot's segment must wait (``max_staged_bytes_per_robot``), or None. A robot with
        nothing staged always gets one in, however big: its own bound never locks it out."""
        limit = self.config.max_staged_bytes_per_robot
        staged = self._episodes.staged_bytes_of(robot_id) + in_batch
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

    def _index_full(self) -> BusyError | None:
        """Why no segment may come in while the sampling index is past its memory budget with frames of
        episodes the dataset writer has yet to write, or None. Finished episodes' frames leave memory for
        the frame spill; with the spill full (or off, or its disk failing) only stored episodes' can (they
        are read back from the dataset), so a writer that cannot keep up would otherwise grow the
        learner's memory with its backlog: the robots wait instead, their segments in their spools, until
        the writer has stored what the index holds. The robots' open episodes never hold them back
        (nothing could ever be written to make room for them)."""
        budget = self.index.memory_budget
        full = budget is not None and self.index.frame_bytes > budget and self._committer.writing()
        if full != self._index_holding:
            self._index_holding = self._committer.robots_waiting = full
            self._index_holds += full
        if not full:
            return None
        now = time.monotonic()
        if self._index_hold_said_at is None or now - self._index_hold_said_at >= INDEX_HOLD_SAY_EVERY_S:
            self._index_hold_said_at = now
            log.warning("the sampling index holds %.0f MB of frames, past learner.store.index_memory (%.0f MB), while "
                        "the dataset writer stores episodes it holds frames of: robots are held back (their segments "
                        "wait in their spools) until it has; %d times so far. The writer cannot keep up with the "
                        "robots: fewer robots or cameras, or a learner with more cores", self.index.frame_bytes / 2**20,
                        (budget or 0) / 2**20, self._index_holds)
        self.counters["segments_held_back"] += 1
        return BusyError(f"the learner's sampling index is past its memory budget with episodes its dataset writer "
                         f"has not stored yet ({self.index.frame_bytes} of {budget} bytes); this segment stays "
                         "with the robot, which sends it again")

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

    def _decode_all(self, segments: Sequence[Segment]) -> list[_Decoded | Exception]:
        if self._decoder is None or len(segments) < 2:
            return [self._decode(s) for s in segments]
        return list(self._decoder.map(self._decode, segments))

    def _decode(self, segment: Segment) -> _Decoded | Exception:
        """The segment's steps as the index keeps them, and the success judge's share of them."""
        try:
            self._check_layout(segment)  # first: images are decoded only at the sizes this learner stores
            steps = decode_segment(segment)
            piece = self.judging.piece(steps) if self.judging is not None else None
            return self._feed.fitted(steps), piece
        except Exception as exc:  # noqa: BLE001 - reported per segment
            return exc

    def close_stale(self, now_s: float | None = None) -> int:
        """Commit open episodes silent for ``episode_timeout_s`` as truncated; returns how many."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            open_episodes = self._episodes.open
            stale = [k for k, ep in open_episodes.items() if now_s - ep.last_seen_s > self.config.episode_timeout_s]
            for key in stale:
                log.warning("robot %s episode %d silent for %.0f s; storing it as truncated", *key,
                            now_s - open_episodes[key].last_seen_s)
                self._close(key)
        return len(stale)

    def close_left_behind(self) -> int:
        """At a clean stop, store the open episodes their robots have left for a newer one (as
        ``_close_if_left`` does; one missing a segment stays open for it); returns how many. The
        timeout would store them seconds later: a learner stopped sooner left them staged until its
        next start. The robots' current episodes stay staged, to be continued after the restart."""
        with self._lock:
            return sum(self._close_if_left(key) for key in self._episodes.left_behind())

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every ingested segment is in the sampling index and every closed episode in the dataset,
        and the index knows each is stored: that is what lets an episode's frames leave its memory budget."""
        deadline = time.monotonic() + timeout_s
        if not self.flush_index(timeout_s):
            return False
        if not self._committer.flush(max(0.0, deadline - time.monotonic())):
            return False
        return self.flush_index(max(0.0, deadline - time.monotonic()))  # the commits' "stored" marks queue there

    def flush_index(self, timeout_s: float = 60.0) -> bool:
        """Wait until the sampling index holds every segment ingested so far (it trails by a few ms)."""
        return self._feed.flush(timeout_s)

    def close(self) -> None:
        """Finish pending commits and release files. Open episodes stay staged for the next start."""
        if self._recovery is not None:
            self._recovery.join()  # the writer waits for the dataset's read into the index
        self._committer.close()
        if self.judging is not None:
            self.judging.close()
        if self._decoder is not None:
            self._decoder.shutdown(wait=True)
        self._feed.close()
        if self.writer is not None:
            self.writer.close()
        self.frame_reader.close()
        if self.frame_spill is not None:
            self.frame_spill.close()
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
                "episodes_open": len(self._episodes.open),
                # Closed, acked and staged, not in the dataset yet: a count that keeps growing says the
                # dataset writer cannot keep up with the robots (nothing is lost; restarts write them).
                "episodes_to_write": self._committer.queued(),
                "segments_staged": len(self._staging),
                "segments_ingested": self.counters["segments"],
                "duplicate_segments": self.counters["duplicate_segments"],
                # Refused, not acked, waiting on the robots: past max_staged_bytes_per_robot, the index past its
                # memory budget with episodes still to write, or a full disk.
                "segments_held_back": self.counters["segments_held_back"],
                "staging_write_failures": self.counters["staging_write_failures"],
                "bytes_staged": self._episodes.staged_bytes(),
                "episodes_lost_to_damage": self.counters["episodes_lost_to_damage"],  # see recovery
                # Stored, but their frames do not decode: out of training (read in at start, or sampled later).
                "episodes_quarantined": self.counters["episodes_quarantined"] + len(self.index.quarantined),
                "steps_ingested": self.counters["steps"],
                **{f"{stream}_steps": n for stream, n in counts.items()},
                "held_steps": self.index.held_steps(),  # robot ticks no stream samples (see index)
            }

    def writer_backlog(self) -> WriterBacklog:
        return self._committer.backlog()

    # ------------------------------------------------------------ internals

    def _close_if_left(self, key: EpisodeKey) -> bool:
        """The episode its robot has just left for a newer one is stored as truncated, unless a segment is
        missing before its last: one re-sent late (after the robot had moved on) would then be stored
        apart, the episode in pieces out of order. With a gap it stays open for the missing segments,
        which the robot re-sends from its spool (or for ``episode_timeout_s``)."""
        episode = self._episodes.open.get(key)
        if episode is None or not episode.contiguous:
            return False
        log.info("robot %s has left episode %d for a newer one; storing it as truncated", *key)
        self._close(key)
        return True

    def _close(self, key: EpisodeKey) -> None:
        """Move an open episode to the writer; its seqs count as stored from now on."""
        episode = self._episodes.close(key)
        # Cut short (no done step) or complete, nothing more arrives: its returns are final now.
        self._feed.finish(episode.index_key)
        if self.judging is not None:
            self.judging.finish(episode.index_key, episode.seqs)
        self._committer.submit(episode)

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

