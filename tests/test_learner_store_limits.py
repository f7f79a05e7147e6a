"""Replay store under pressure: a robot past its bound of staged bytes and a full disk under the staging
log are refused without an ack (the robot keeps the segment), said once, and lose nothing."""

from __future__ import annotations

import errno
import logging
import os
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from robot_rl.bridges.zmq.codec import BusyError
from robot_rl.bridges.zmq.protocol import encode_message
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.learner.store import IngestResult, ReplayStore
from tests.learner_helpers import make_steps, store_config, stored_triples

PNG = ImageEncoding("png")


def segments(robot: str, episode: int, robot_index: int, n_steps: int = 12, size: int = 4):
    steps = make_steps(n_steps, robot=robot_index, episode=episode)
    return [encode_segment(robot, episode, seq, steps[i:i + size], episode_done=steps[i:i + size][-1].done,
                           image_encoding=PNG) for seq, i in enumerate(range(0, n_steps, size))]


def nbytes(segment) -> int:
    return sum(memoryview(f).nbytes for f in encode_message(segment))


def test_a_robot_past_its_staged_bytes_waits_while_the_writer_is_behind_and_loses_nothing(tmp_path, monkeypatch,
                                                                                          caplog):
    from robot_rl.learner.store_writer import ThreadEpisodeWriter

    first, second = segments("r0", 1, 0), segments("r0", 2, 0)
    limit = sum(nbytes(s) for s in first) + nbytes(second[0])  # one finished episode and one more segment
    release = threading.Event()
    write = ThreadEpisodeWriter.write
    monkeypatch.setattr(ThreadEpisodeWriter, "write", lambda self, *a: release.wait(60) and write(self, *a))
    store = ReplayStore(store_config(tmp_path, background_commit=True, commit_linger_s=0.0,
                                     max_staged_bytes_per_robot=limit))
    try:
        with caplog.at_level(logging.INFO):
            assert all(isinstance(r, IngestResult) for r in store.ingest_many(first))  # closed, the writer is held
            assert isinstance(store.ingest_many([second[0]])[0], IngestResult)
            for _ in range(3):  # the edge re-sends it after each ack timeout: refused, never acked
                assert isinstance(store.ingest_many([second[1]])[0], BusyError)
            assert isinstance(store.ingest_many(segments("r1", 1, 1)[:1])[0], IngestResult)  # its own bound
            stats = store.stats()
            assert stats["segments_held_back"] == 3 and stats["bytes_staged"] == limit + nbytes(segments("r1", 1, 1)[0])
            release.set()
            assert store.flush(60)  # the writer catches up: the first episode leaves staging
            assert all(isinstance(r, IngestResult) and not r.duplicate for r in store.ingest_many(second[1:]))
            assert store.flush(60)
        said = [r.message for r in caplog.records if "max_staged_bytes_per_robot" in r.message]
        assert len(said) == 2 and "refused" in said[0] and "taken" in said[1]  # once held back, once taken again
    finally:
        store.close()
    assert sorted(t for t in stored_triples(tmp_path) if t[0] == 0) == \
        sorted((0, episode, t) for episode in (1, 2) for t in range(12))


class FullDisk:
    """``os`` for the spool module, where writes to one file descriptor fail as on a full disk: the first
    write of a record lands half of it (a short write), the next fails with ENOSPC."""

    def __init__(self, fd: int) -> None:
        self.fd, self.full, self._half_written = fd, True, False

    def __getattr__(self, name: str):
        return getattr(os, name)

    def write(self, fd: int, data) -> int:
        if fd != self.fd or not self.full:
            return os.write(fd, data)
        if not self._half_written and len(data) > 1:
            self._half_written = True
            return os.write(fd, bytes(data[: len(data) // 2]))
        self._half_written = False
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_under_staging_is_refused_without_an_ack_said_once_and_everything_stored_after(
        tmp_path, monkeypatch, caplog):
    episode = segments("r0", 1, 0)
    store = ReplayStore(store_config(tmp_path))
    try:
        assert isinstance(store.ingest(episode[0]), IngestResult)
        disk = FullDisk(store._staging._fd)
        monkeypatch.setattr("robot_rl.bridges.zmq.spool.os", disk)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):  # refused, and refused again when the robot re-sends
                results = store.ingest_many(episode[1:])
                assert all(isinstance(r, BusyError) and "full disk" in str(r) for r in results)
            assert store.stats()["staging_write_failures"] == 4 and store.stats()["segments_staged"] == 1
            disk.full = False  # space again: the robot's re-sends are stored, once
            assert all(isinstance(r, IngestResult) and not r.duplicate for r in store.ingest_many(episode[1:]))
        said = [r.message for r in caplog.records if "STAGING FAILED" in r.message or "takes writes again" in r.message]
        assert len(said) == 2 and said[0].startswith("STAGING FAILED") and "4 segments" in said[1]
        assert store.stats()["episodes_stored"] == 1 and store.stats()["segments_staged"] == 0
    finally:
        store.close()
    assert sorted(stored_triples(tmp_path)) == [(0, 1, t) for t in range(12)]
