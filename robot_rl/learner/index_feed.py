"""What the replay store puts into the sampling index, in order, off the serving thread.

Staging, not the index, is the record: a segment is acked once it is fsynced to the staging log,
and nothing waits for the index before that. An append (stacking and copying every frame into
the growing episode arrays) would otherwise hold up the thread that acks robots, so with
``StoreConfig.background_commit`` the index is fed by a thread of its own (``store-index``).

One queue carries every change: a segment's steps (``append``), the end of an episode piece
(``finish``: nothing more arrives, its returns are final), a verdict given after its end (``verdict``:
the success detector's), its place in the dataset (``stored``:
its frames may leave memory and be read back from there) and, after a restart, the segments
staged before it (``backlog``: read from staging and decoded on this thread, so a restarted
learner serves before it has decoded a backlog of any size). In one queue they stay in order, so
an episode's frames never leave memory before its last segment is in, and a backlog is in before
the segments that robots send after the restart. The queue is bounded (``INDEX_QUEUE``): when it
is full, ingest waits, and memory stays bounded.

A failed change is logged and skipped: the data is staged and will be in the dataset; only
sampling misses it. ``flush`` waits until the index holds everything fed so far (it trails by a
few ms).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from robot_rl.bridges.zmq.protocol import Segment, decode_message
from robot_rl.bridges.zmq.segments import decode_segment
from robot_rl.bridges.zmq.spool import SpoolReader
from robot_rl.core.types import EpisodeVerdict, Step
from robot_rl.learner.index import EntryKey, SamplingIndex, fit_step_frames, steps_to_columns
from robot_rl.learner.stored_frames import StoredEpisode

log = logging.getLogger(__name__)

INDEX_QUEUE = 64  # decoded segments waiting for the index thread


@dataclass(frozen=True)
class Backlog:
    """Segments staged before a restart, in staging order: read through ``staged`` (the staging log
    as it was at the restart) by the index thread; ``order`` pairs each index entry with its
    staging key."""

    staged: SpoolReader
    order: Sequence[tuple[EntryKey, str]]


_Op = Literal["append", "finish", "verdict", "stored", "backlog"]
_Payload = Sequence[Step] | StoredEpisode | Backlog | EpisodeVerdict | None
_Job = tuple[_Op, EntryKey | None, _Payload]


class IndexFeed:
    """Feeds one ``SamplingIndex``: on the ``store-index`` thread (``background``), else inline."""

    def __init__(self, index: SamplingIndex, *, background: bool) -> None:
        self.index = index
        self._jobs: queue.Queue[_Job | None] | None = None
        self._thread: threading.Thread | None = None
        self._backlog_applied = threading.Event()
        self._backlog_applied.set()
        if background:
            self._jobs = queue.Queue(maxsize=INDEX_QUEUE)  # full: ingest waits (bounded memory)
            self._thread = threading.Thread(target=self._loop, name="store-index", daemon=True)
            self._thread.start()

    def fitted(self, steps: list[Step]) -> list[Step]:
        """Decoded steps as the index keeps them (the policy's cameras at its input size): staging holds
        the segment as it arrived, and these wait for the index thread only."""
        return fit_step_frames(steps, self.index.cameras, self.index.input_frames)

    def append(self, key: EntryKey, steps: Sequence[Step]) -> None:
        if steps:
            self._put("append", key, steps)

    def finish(self, key: EntryKey) -> None:
        self._put("finish", key, None)

    def verdict(self, key: EntryKey, verdict: EpisodeVerdict) -> None:
        """The outcome of a finished episode, judged after its last step arrived (the success detector's)."""
        self._put("verdict", key, verdict)

    def stored(self, key: EntryKey, episode: StoredEpisode) -> None:
        self._put("stored", key, episode)

    def backlog(self, backlog: Backlog) -> None:
        """A restarted store's staged segments, ahead of everything fed after this (closes ``staged``)."""
        self._backlog_applied.clear()
        self._put("backlog", None, backlog)

    def wait_backlog(self) -> None:
        """Until a restarted store's staged segments are in the index: the commit thread waits, so no
        staged segment is released before the index has read it."""
        self._backlog_applied.wait()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until the sampling index holds every segment fed so far (and a restarted store's
        dataset, read in behind it)."""
        jobs = self._jobs
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
        """Apply what is queued, then stop the thread."""
        if self._thread is not None and self._jobs is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _put(self, op: _Op, key: EntryKey | None, payload: _Payload) -> None:
        if self._jobs is not None:
            self._jobs.put((op, key, payload))
        else:
            self._apply(op, key, payload)

    def _apply(self, op: _Op, key: EntryKey | None, payload: _Payload) -> None:
        if op == "backlog":
            assert isinstance(payload, Backlog)
            self._apply_backlog(payload)
            return
        assert key is not None
        if op == "append":
            assert isinstance(payload, Sequence)
            self.index.append(key, steps_to_columns(payload, self.index.cameras), payload[0].instruction)
        elif op == "stored":
            assert isinstance(payload, StoredEpisode)
            self.index.mark_stored(key, payload)
        elif op == "verdict":
            assert isinstance(payload, EpisodeVerdict)
            self.index.set_verdict(key, payload)
        else:
            self.index.mark_finished(key)

    def _apply_backlog(self, backlog: Backlog) -> None:
        """Each staged segment decoded into its entry. Recovery checked everything but the pixels, which
        decoded when the segment arrived (and staging's crc keeps its bytes); one that fails now is
        left out of sampling only: it is staged, and the writer stores it."""
        try:
            for entry, staging_key in backlog.order:
                frames = backlog.staged.read(staging_key)
                if frames is None:  # not expected: the commit thread releases nothing before this is done
                    log.error("staged segment %s was gone before the sampling index read it", staging_key)
                    continue
                try:
                    segment = decode_message(frames)
                    assert isinstance(segment, Segment)  # recovery decoded it as one
                    self._apply("append", entry, self.fitted(decode_segment(segment)))
                except Exception:
                    log.exception("could not add staged segment %s to the sampling index", staging_key)
        finally:
            backlog.staged.close()
            self._backlog_applied.set()

    def _loop(self) -> None:
        assert self._jobs is not None
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._apply(*job)
            except Exception:  # the data is staged and will be in the dataset; only sampling misses it
                log.exception("could not add %s to the sampling index", job[1] if job else None)
            finally:
                self._jobs.task_done()
