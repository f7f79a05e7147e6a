"""The store's ledger: which segments are already in the dataset, durable across restarts.

Why a ledger: the dataset itself does not know which (robot, episode, seq) segments
its episodes came from, and the learner must ack a re-sent segment as a duplicate
instead of storing it twice, even after a restart. Each episode commit is written as
two fsynced JSON lines around the dataset write (the commit line after the dataset is
finalized; the store may finalize several queued episodes at once)::

    {"op": "intent", "robot": "a", "episode": 7, "fragment": 0, "index": 12, "seqs": [0, 1, 2]}
    ... EpisodeRecorder writes dataset episode 12 ...
    {"op": "commit", "robot": "a", "episode": 7, "fragment": 0, "index": 12, "seqs": [0, 1, 2]}

An intent without its commit (a crash in between) is resolved on open by looking at
the dataset: if it holds episode ``index``, the write happened; if not, it did not.
A write that failed without a crash gets an ``abort`` line instead of its commit: the
next episode takes the same index, so the dataset could not tell the two apart.
A torn last line (crash mid-write) is ignored: its operation never completed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from robot_rl.core.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitRecord:
    robot_id: str
    episode_id: int
    fragment: int
    index: int  # episode index in the dataset
    seqs: tuple[int, ...]

    def as_json(self, op: str) -> str:
        return json.dumps({"op": op, "robot": self.robot_id, "episode": self.episode_id,
                           "fragment": self.fragment, "index": self.index, "seqs": list(self.seqs)})

    @staticmethod
    def from_json(data: dict) -> CommitRecord:
        return CommitRecord(str(data["robot"]), int(data["episode"]), int(data["fragment"]), int(data["index"]),
                            tuple(int(s) for s in data["seqs"]))


class Ledger:
    """Append-only JSON-lines file of episode commits (one writer)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.commits: list[CommitRecord] = []
        self.pending_intents: list[CommitRecord] = []
        self._read()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open for appends

    def write_intent(self, record: CommitRecord) -> None:
        self._append(record.as_json("intent"))

    def write_commit(self, record: CommitRecord) -> None:
        self._append(record.as_json("commit"))
        self.commits.append(record)
        self.pending_intents = [r for r in self.pending_intents if r != record]

    def write_abort(self, record: CommitRecord) -> None:
        """The intent's write failed; the episode stays staged and will be written again."""
        self._append(record.as_json("abort"))
        self.pending_intents = [r for r in self.pending_intents if r != record]

    def close(self) -> None:
        self._file.close()

    def _append(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def _read(self) -> None:
        if not self.path.exists():
            return
        intents: dict[tuple[str, int, int], CommitRecord] = {}
        lines = self.path.read_bytes().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                data = json.loads(line.decode("utf-8"))
                record = CommitRecord.from_json(data)
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):
                    log.warning("ledger %s: ignoring a torn last line (%s)", self.path, exc)
                    # Cut it off so the next append starts on a clean line.
                    self.path.write_bytes(b"".join(ln + b"\n" for ln in lines[:-1]))
                    break
                raise ConfigError(f"ledger {self.path} line {number} is corrupt ({exc}); it says which dataset "
                                  "episodes are committed, so the store cannot open without it: restore it from a "
                                  "backup or move the store aside") from exc
            key = (record.robot_id, record.episode_id, record.fragment)
            if data["op"] == "intent":
                intents[key] = record
            elif data["op"] == "commit":
                intents.pop(key, None)
                self.commits.append(record)
            elif data["op"] == "abort":
                intents.pop(key, None)
        self.pending_intents = list(intents.values())
