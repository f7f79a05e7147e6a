"""The versions a learner published, as the fleet console lists them: when, after which update, how big.

Kept in memory (the newest ``PUBLISHED_HISTORY``) and appended to ``<checkpoint_dir>/published.jsonl``,
one JSON line per version, so that a learner resumed from a checkpoint still lists the versions
published before it (their live success comes back from the dataset; without this file the console
would start over at the resumed version). The file holds one lineage: a fresh start empties it, and a
resume keeps only the versions older than the checkpoint's, since the trainer publishes the next
numbers again from there with other weights.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

HISTORY_FILE = "published.jsonl"
PUBLISHED_HISTORY = 10_000  # published versions the console lists (a week at one a minute)


@dataclass(frozen=True)
class PublishedVersion:
    """A version the trainer published: when, after which update, how many bytes each robot fetches."""

    version: int
    update: int
    wall_s: float  # time.time() at publication
    size_bytes: int


class PublishedHistory:
    """``PublishedHistory(checkpoint_dir, resumed_version)``; ``append`` each publication; iterate oldest first."""

    def __init__(self, directory: str | Path, resumed_version: int | None) -> None:
        """``resumed_version``: the version of the checkpoint the trainer resumed from (the versions
        before it are read back); None: a fresh start, whose history begins empty."""
        self.path = Path(directory) / HISTORY_FILE
        self._versions: deque[PublishedVersion] = deque(maxlen=PUBLISHED_HISTORY)
        if resumed_version is not None:
            self._versions.extend(v for v in self._read() if v.version < resumed_version)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{HISTORY_FILE}.tmp")
        tmp.write_text("".join(json.dumps(asdict(v)) + "\n" for v in self._versions))
        os.replace(tmp, self.path)

    def append(self, published: PublishedVersion) -> None:
        self._versions.append(published)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(published)) + "\n")

    def __iter__(self) -> Iterator[PublishedVersion]:
        return iter(list(self._versions))  # a copy: the trainer's thread appends while the console reads

    def _read(self) -> list[PublishedVersion]:
        if not self.path.is_file():
            return []
        versions, unreadable = [], 0
        # Undecodable bytes become U+FFFD, so a damaged line fails as JSON and is skipped like a torn one.
        for line in self.path.read_bytes().decode("utf-8", errors="replace").splitlines():
            try:
                versions.append(PublishedVersion(**json.loads(line)))
            except (ValueError, TypeError):
                unreadable += 1  # a torn last line (a crash mid-append), or a damaged one
        if unreadable:
            log.warning("%s: %d unreadable line(s) skipped; the console lists the other versions", self.path,
                        unreadable)
        return versions
