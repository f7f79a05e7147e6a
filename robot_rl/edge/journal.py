"""The local recorder's journal: the episode under way, on disk a segment at a time, so that a
crash mid-episode costs the robot's own dataset at most one segment of it.

The robot's LeRobotDataset (``robot_rl.data.recorder``) takes an episode only when it ends: LeRobot
writes an episode whole, in seconds, and a write in the middle of one would take the control loop's
time. Until then the episode lived only in memory, and a kill -9 or a power cut lost all of it
(up to 30 s of a real arm's data). The journal keeps it on disk meanwhile:

* **As it runs** (``add``, the control thread: a list append and an enqueue, nothing more): every
  ``segment_steps`` ticks a segment is handed to the journal's own thread, which encodes it with
  the wire's segment codec (``robot_rl.bridges.zmq.segments``, the link's image encoding) and
  appends it to a crash-safe log (``robot_rl.bridges.zmq.spool.Spool``: fsynced, crc per record,
  a torn last record cut off on open). As on the link, the newest step is held back until the next
  one or the episode's end, so the step that carries the verdict is written with it.
* **When the dataset has it** (``forget``, after the recorder wrote the episode, or an operator
  threw it away): its records are dropped; the log is empty again between episodes.
* **At the next start** (``unfinished``): whatever is still in the log is an episode the process
  never finished writing; ``robot_rl.edge.runtime`` stores it in the dataset, as truncated (no
  outcome claimed, its last frame not done) unless its verdict had been journaled too.

The journal lives beside the dataset (``journal_dir``): LeRobot creates a dataset's directory
itself and refuses one that exists already. The dataset and the journal are two files that cannot
change together: a crash in the milliseconds between an episode's finalize and its ``forget`` leaves
it in both, and the next start stores it a second time (never a loss; the other order could lose it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from robot_rl.bridges.zmq.protocol import ProtocolError, Segment, decode_message, encode_message
from robot_rl.bridges.zmq.segments import ImageEncoding, decode_segment, encode_segment
from robot_rl.bridges.zmq.spool import Spool, SpoolError
from robot_rl.core.types import Episode, Step

log = logging.getLogger(__name__)

JOURNAL_SUFFIX = ".journal"


def journal_dir(dataset_root: str | Path) -> Path:
    """Where the journal of the dataset at ``dataset_root`` lives: beside it, ``<root>.journal``."""
    root = Path(dataset_root)
    return root.with_name(root.name + JOURNAL_SUFFIX)


@dataclass(frozen=True)
class _Append:
    episode_id: int
    seq: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class _Forget:
    episode_id: int


@dataclass
class UnfinishedEpisode:
    """An episode the journal held at start: what was recorded of it, and the records it came from."""

    episode: Episode
    keys: list[str]
    truncated: bool  # no verdict was journaled: stored with no outcome


class EpisodeJournal:
    """The episode under way, on disk (see the module doc).

    >>> journal = EpisodeJournal(journal_dir(root), "so101-a", segment_steps=15)
    >>> for old in journal.unfinished(): ...           # before start: what a crash left
    >>> journal.start()
    >>> journal.add(step)                              # control thread, every tick
    >>> episode_id = journal.end_episode()             # after the verdict is on the last step
    >>> journal.forget(episode_id)                     # once the dataset holds it
    >>> journal.close()
    """

    def __init__(self, directory: str | Path, robot_id: str, *, segment_steps: int,
                 image_encoding: ImageEncoding | None = None) -> None:
        if segment_steps < 1:
            raise ValueError(f"segment_steps must be >= 1, got {segment_steps}")
        self.directory = Path(directory)
        self.robot_id = robot_id
        self.segment_steps = segment_steps
        self.image_encoding = image_encoding or ImageEncoding()
        self._spool = Spool(self.directory)  # opened here: a journal another process holds fails now, in one line
        # Unbounded, and costing no memory of its own: it holds references to Steps the running episode
        # holds anyway until it is recorded.
        self._jobs: queue.Queue[_Append | _Forget | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._episode_id: int | None = None
        self._seq = 0
        self._current: list[Step] = []
        self.write_errors = 0  # segments the disk refused (logged; the episode is still recorded when it ends)

    # ------------------------------------------------------------ at start: what a crash left

    def unfinished(self) -> list[UnfinishedEpisode]:
        """The episodes still in the journal, oldest first; call before ``start``. A record that no
        longer decodes is moved aside (``refused/`` in the journal's folder) with its reason."""
        segments: dict[int, list[tuple[int, str, list[Step]]]] = defaultdict(list)
        for key, frames in list(self._spool.pending()):
            try:
                message = decode_message(frames)
                if not isinstance(message, Segment):
                    raise ProtocolError(f"a {type(message).__name__} message, not a segment")
                steps = decode_segment(message)
            except ProtocolError as exc:
                path = self._spool.set_aside(key, f"journal record unreadable: {exc}")
                log.error("%s: a journaled segment of an unfinished episode is unreadable (%s); kept in %s",
                          self.robot_id, exc, path)
                continue
            segments[message.episode_id].append((message.seq, key, steps))
        found = []
        for episode_id in sorted(segments):
            parts = sorted(segments[episode_id], key=lambda part: part[0])
            steps = [step for _, _, part in parts for step in part]
            found.append(UnfinishedEpisode(_episode_of(self.robot_id, episode_id, steps),
                                           [key for _, key, _ in parts], truncated=not steps[-1].done))
        return found

    def drop(self, unfinished: UnfinishedEpisode) -> None:
        """Forget an unfinished episode's records (the dataset has it now); before ``start``."""
        for key in unfinished.keys:
            self._spool.ack(key)

    def set_aside(self, unfinished: UnfinishedEpisode, reason: str) -> None:
        """Keep an unfinished episode the dataset refused in ``refused/``, out of the journal; before ``start``."""
        for key in unfinished.keys:
            self._spool.set_aside(key, reason)

    # ------------------------------------------------------------ while running

    def start(self) -> EpisodeJournal:
        self._thread = threading.Thread(target=self._write_loop, name=f"journal-{self.robot_id}", daemon=True)
        self._thread.start()
        return self

    def add(self, step: Step) -> None:
        """One tick's Step (control thread: an append and a non-blocking enqueue)."""
        if step.tick == 0 or self._episode_id is None:
            self.end_episode()  # a previous episode never ended: what it has goes to disk
            self._episode_id, self._seq = time.time_ns() // 1000, 0  # unique across restarts
        self._current.append(step)
        if len(self._current) > self.segment_steps:  # a full segment, the newest step held back
            self._hand_over(self._current[:-1])
            self._current = self._current[-1:]

    def end_episode(self) -> int | None:
        """The episode ended (its verdict is on its last step): the rest of it goes to disk. Returns
        its id for ``forget``, or None where no episode was under way."""
        episode_id = self._episode_id
        if self._current:
            self._hand_over(self._current)
            self._current = []
        self._episode_id = None
        return episode_id

    def forget(self, episode_id: int | None) -> None:
        """The dataset holds the episode now (or it was thrown away): drop its records. Any thread."""
        if episode_id is not None:
            self._jobs.put(_Forget(episode_id))

    def close(self) -> None:
        """Write what is queued (an episode cut short stays, for the next start), then close the log."""
        self.end_episode()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        else:
            self._drain()
        self._spool.close()

    # ------------------------------------------------------------ the journal's thread

    def _hand_over(self, steps: list[Step]) -> None:
        assert self._episode_id is not None
        self._jobs.put(_Append(self._episode_id, self._seq, tuple(steps)))
        self._seq += 1

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._do(job)

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._do(job)

    def _do(self, job: _Append | _Forget) -> None:
        if isinstance(job, _Forget):
            for key in [k for k in self._spool.iter_keys() if k.startswith(f"{job.episode_id}:")]:
                self._spool.ack(key)
            return
        try:
            segment = encode_segment(self.robot_id, job.episode_id, job.seq, job.steps,
                                     image_encoding=self.image_encoding)
            self._spool.append(f"{job.episode_id}:{job.seq}", encode_message(segment))
        except (OSError, SpoolError, ValueError, TypeError) as exc:  # a full disk, or Step data the codec cannot take
            self.write_errors += 1
            log.error("%s: segment %d of the episode under way not journaled (%s): a crash before the episode "
                      "ends would lose it from %s", self.robot_id, job.seq, exc, self.directory)


def _episode_of(robot_id: str, episode_id: int, steps: list[Step]) -> Episode:
    """The journaled steps as an Episode: with its verdict where its done last step was journaled,
    else truncated (no step done, no success claimed)."""
    first, last = steps[0], steps[-1]
    return Episode(robot_id, episode_id, first.instruction, steps=steps, success=bool(last.done and last.success),
                   seed=None if first.scene_seed < 0 else first.scene_seed)
