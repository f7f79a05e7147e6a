"""Which segments the replay store holds, episode by episode: the dedup bookkeeping.

A segment is known by (robot_id, episode_id, seq). It is *stored* once it is staged (fsynced to
the staging log, so the learner may ack it) or committed (in the dataset, its ledger line
written): a segment that arrives again in either state is a duplicate. Between its first staged
segment and its commit an episode is *open* (``OpenEpisode``); the robot's current episode is its
newest open one, so a robot that starts a newer episode cuts the older one short.

Staged bytes are counted per robot until the dataset holds them: what
``StoreConfig.max_staged_bytes_per_robot`` bounds, and what the writer's backlog reports.

``EpisodeBook`` is plain bookkeeping with no lock of its own: the ingest path, the commit thread
and restart recovery all change it under the store's one lock, together with the staging log and
the ledger it mirrors.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field

from robot_rl.learner.index import EntryKey
from robot_rl.learner.ledger import CommitRecord

EpisodeKey = tuple[str, int]  # (robot_id, episode_id)


def staging_key(robot_id: str, episode_id: int, seq: int) -> str:
    """A segment's key in the staging log (and in the quarantine beside it)."""
    return json.dumps([robot_id, episode_id, seq])


def parse_staging_key(key: str) -> tuple[str, int, int]:
    robot_id, episode_id, seq = json.loads(key)
    return robot_id, episode_id, seq


@dataclass
class OpenEpisode:
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

    @property
    def index_key(self) -> EntryKey:
        """Its key in the sampling index: each fragment is an entry of its own."""
        return self.robot_id, self.episode_id, self.fragment

    def staging_keys(self) -> list[str]:
        """Its segments' keys in the staging log, in seq order."""
        return [staging_key(self.robot_id, self.episode_id, s) for s in sorted(self.seqs)]


class EpisodeBook:
    """The seqs stored per episode, committed or open, and the bytes each robot has staged."""

    def __init__(self) -> None:
        self.open: dict[EpisodeKey, OpenEpisode] = {}
        self._committed: dict[EpisodeKey, set[int]] = {}
        self._fragments: Counter[EpisodeKey] = Counter()  # pieces of an episode already committed
        self._open_of_robot: dict[str, EpisodeKey] = {}  # robot -> its current (newest) open episode
        self._staged_bytes: Counter[str] = Counter()  # robot -> bytes staged and not yet in the dataset

    def already_stored(self, key: EpisodeKey, seq: int) -> bool:
        if self.is_committed(key, seq):
            return True
        episode = self.open.get(key)
        return episode is not None and seq in episode.seqs

    def is_committed(self, key: EpisodeKey, seq: int) -> bool:
        return seq in self._committed.get(key, ())

    def current_episode(self, robot_id: str) -> EpisodeKey | None:
        return self._open_of_robot.get(robot_id)

    def track(self, robot_id: str, episode_id: int, seq: int, num_steps: int, done: bool) -> OpenEpisode:
        """Record a staged segment in its open episode (opened here if it is the first)."""
        key = (robot_id, episode_id)
        episode = self.open.get(key)
        if episode is None:
            stored = self._committed.get(key)
            episode = OpenEpisode(robot_id, episode_id, self._fragments[key],
                                  first_seq=max(stored) + 1 if stored else 0)
            self.open[key] = episode
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

    def left_behind(self) -> list[EpisodeKey]:
        """Open episodes whose robot has since sent a newer one. A fragment re-sent late (its robot was
        killed and restarted, or cut off longer than ``episode_timeout_s``, after the store had taken the
        episode's first part as truncated) is never its robot's current episode, so no newer episode's
        start closes it: only a silence of ``episode_timeout_s`` does."""
        newest: dict[str, int] = {}
        for robot_id, episode_id in itertools.chain(self.open, self._committed):
            newest[robot_id] = max(episode_id, newest.get(robot_id, episode_id))
        return [key for key in self.open if key[1] < newest[key[0]]]

    def close(self, key: EpisodeKey) -> OpenEpisode:
        """The open episode goes to the writer: its seqs count as stored from now on, and a segment
        of it that comes later opens its next fragment."""
        episode = self.open.pop(key)
        if self._open_of_robot.get(key[0]) == key:
            del self._open_of_robot[key[0]]
        self._committed.setdefault(key, set()).update(episode.seqs)
        self._fragments[key] += 1
        return episode

    def remember_commit(self, record: CommitRecord) -> None:
        """A commit line of the ledger (read at start, or completed after a crash)."""
        key = (record.robot_id, record.episode_id)
        self._committed.setdefault(key, set()).update(record.seqs)
        self._fragments[key] = max(self._fragments[key], record.fragment + 1)

    def add_staged_bytes(self, episode: OpenEpisode, nbytes: int) -> None:
        episode.nbytes += nbytes
        self._staged_bytes[episode.robot_id] += nbytes

    def release_staged_bytes(self, episode: OpenEpisode) -> None:
        """The episode is in the dataset: its staged bytes no longer count against its robot."""
        self._staged_bytes[episode.robot_id] -= episode.nbytes
        if self._staged_bytes[episode.robot_id] <= 0:
            del self._staged_bytes[episode.robot_id]

    def staged_bytes_of(self, robot_id: str) -> int:
        return self._staged_bytes[robot_id]

    def staged_bytes(self) -> int:
        """All robots' staged bytes not yet in the dataset."""
        return sum(self._staged_bytes.values())
