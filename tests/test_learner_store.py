"""Replay store: dedup across reopen, a crash between dataset write and ledger commit, streams."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.bridges.zmq.spool import Spool
from robot_rl.learner.ledger import Ledger
from robot_rl.learner.open_episodes import staging_key
from robot_rl.learner.service import LearnerService
from robot_rl.learner.store import ReplayStore
from tests.learner_helpers import learner_config, make_steps, store_config, stored_triples, tiny_policy

PNG = ImageEncoding("png")


def segments(robot: str, episode: int, steps, size: int = 4):
    chunks = [steps[i:i + size] for i in range(0, len(steps), size)]
    return [encode_segment(robot, episode, seq, c, episode_done=c[-1].done, image_encoding=PNG)
            for seq, c in enumerate(chunks)]


def open_on_a_thread(root, timeout_s: float) -> ReplayStore | None:
    """A restarted store opened with background_commit on a thread of its own: the store, or None if it
    was still opening after ``timeout_s`` (what it waits for is held by the test)."""
    import threading

    opened: list[ReplayStore] = []
    opener = threading.Thread(target=lambda: opened.append(ReplayStore(store_config(root, background_commit=True))),
                              daemon=True)
    opener.start()
    opener.join(timeout_s)
    return opened[0] if opened else None


def count_finalizes(monkeypatch) -> list[bool]:
    """Every EpisodeRecorder.close from now on appends whether it had a dataset to finalize."""
    from robot_rl.data.recorder import EpisodeRecorder

    finalizes: list[bool] = []
    finalize = EpisodeRecorder.close

    def counted(self):
        finalizes.append(self._dataset is not None)
        finalize(self)

    monkeypatch.setattr(EpisodeRecorder, "close", counted)
    return finalizes


def test_crash_between_dataset_write_and_commit_stores_the_episode_once(tmp_path, monkeypatch):
    store = ReplayStore(store_config(tmp_path))
    segs = segments("r0", 1, make_steps(10, robot=0, episode=1))

    def crash(self, record):
        raise KeyboardInterrupt("simulated crash after the dataset write")

    monkeypatch.setattr(Ledger, "write_commit", crash)
    store.ingest(segs[0])
    store.ingest(segs[1])
    with pytest.raises(KeyboardInterrupt):
        store.ingest(segs[2])  # completes the episode -> commit -> "crash"
    monkeypatch.undo()
    store._ledger.close()
    store._staging.close()

    reopened = ReplayStore(store_config(tmp_path))
    try:
        assert all(reopened.ingest(s).duplicate for s in segs)  # the re-sent segments are known
        stats = reopened.stats()
        assert stats["episodes_stored"] == 1 and stats["segments_staged"] == 0 and stats["online_steps"] == 10
    finally:
        reopened.close()
    assert sorted(stored_triples(tmp_path)) == [(0, 1, t) for t in range(10)]


def test_robot_starting_a_new_episode_truncates_the_open_one_and_late_seqs_form_a_fragment(tmp_path):
    with ReplayStore(store_config(tmp_path)) as store:
        first = segments("r0", 1, make_steps(12, robot=0, episode=1))
        store.ingest(first[0])
        for s in segments("r0", 2, make_steps(4, robot=0, episode=2)):
            store.ingest(s)  # episode 1 is stored truncated (4 steps) when episode 2 begins
        assert store.stats()["episodes_stored"] == 2
        assert store.ingest(first[0]).duplicate
        assert not store.ingest(first[1]).duplicate  # a late segment is kept, not dropped
        assert ["r0", 1, 1, 4] in store.index.manifest()  # fragment 1 of episode 1
        assert store.close_stale(now_s=1e12) == 1
    assert len(stored_triples(tmp_path)) == 12


def test_the_rest_of_an_episode_after_a_silence_is_stored_when_its_last_segment_arrives(tmp_path):
    """A network cut longer than episode_timeout_s: the first part is stored as truncated; the rest,
    re-sent from the robot's spool, is a fragment complete at its done segment, not left staged."""
    with ReplayStore(store_config(tmp_path)) as store:
        parts = segments("r0", 1, make_steps(16, robot=0, episode=1))  # seqs 0..3, done in 3
        store.ingest(parts[0])
        store.ingest(parts[1])
        assert store.close_stale(now_s=1e12) == 1  # silent: seqs 0 and 1 stored as truncated
        store.ingest(parts[2])
        assert store.stats()["episodes_stored"] == 1  # seq 2 alone: the robot is still sending
        store.ingest(parts[3])
        assert store.stats()["episodes_stored"] == 2 and store.close_stale(now_s=1e12) == 0
        assert store.flush() and store.stats()["segments_staged"] == 0
    assert sorted(stored_triples(tmp_path)) == [(0, 1, t) for t in range(16)]


def test_a_clean_stop_stores_a_late_fragment_its_robot_has_left_and_keeps_its_current_episode_staged(tmp_path):
    """A segment re-sent late (its robot killed and restarted, or cut off longer than episode_timeout_s,
    after the first part of its episode was stored as truncated) opens a fragment that no newer
    episode's start closes: a learner stopped before the timeout left it staged. A clean stop stores it;
    the robot's current episode stays staged, for the robot to continue after the restart."""
    old = segments("r0", 1, make_steps(12, robot=0, episode=1))
    current = segments("r0", 3, make_steps(12, robot=0, episode=3))
    service = LearnerService(learner_config(tmp_path), tiny_policy(), train=False).start()
    try:
        service.store.ingest(old[0])
        assert service.store.close_stale(now_s=1e12) == 1  # silent: seq 0 stored as truncated
        # Episode 2 whole, then a late seq of episode 1, then the first of the robot's current episode.
        for segment in [*segments("r0", 2, make_steps(4, robot=0, episode=2)), old[1], current[0]]:
            assert not service.store.ingest(segment).duplicate
    finally:
        service.stop(checkpoint=False)
    with Spool(tmp_path / "store" / "staging") as staging:
        assert staging.keys() == [staging_key("r0", 3, 0)]
    assert sorted(stored_triples(tmp_path / "store")) == [(0, 1, t) for t in range(8)] + [(0, 2, t) for t in range(4)]


def test_layout_mismatch_is_refused_with_a_clear_error(tmp_path):
    from robot_rl.bridges.zmq.protocol import ProtocolError

    with ReplayStore(store_config(tmp_path, cameras=("front", "wrist"))) as store:
        with pytest.raises(ProtocolError, match="cameras"):
            store.ingest(segments("r0", 1, make_steps(3))[0])
        assert store.stats()["segments_ingested"] == 0


KILLED_BATCH = """
import os, sys, threading
sys.path.insert(0, {repo!r})
from pathlib import Path
import robot_rl.learner.commit as commit_module
from robot_rl.data.recorder import EpisodeRecorder
from robot_rl.learner.store import ReplayStore
from tests.learner_helpers import make_steps, store_config
from tests.test_learner_store import segments

queued = threading.Event()
commit_module.lower_own_priority = lambda nice: queued.wait()  # the writer starts once all three are queued
finalize = EpisodeRecorder.close
def killed(self):
    if self._dataset is not None:
        os._exit(3)  # the batch is saved, not finalized
    finalize(self)
EpisodeRecorder.close = killed
store = ReplayStore(store_config(Path({root!r}), background_commit=True, commit_batch=8))
for episode in (1, 2, 3):
    for segment in segments("r0", episode, make_steps(6, robot=0, episode=episode)):
        store.ingest(segment)
queued.set()
store.flush(60)
os._exit(4)  # not reached: the finalize kills the process
"""


def test_a_batch_killed_before_its_finalize_stays_staged_and_is_stored_once_on_restart(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    with ReplayStore(store_config(tmp_path)) as store:  # one episode stored before the crash
        for s in segments("r0", 0, make_steps(8, robot=0, episode=0)):
            store.ingest(s)
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", KILLED_BATCH.format(repo=repo, root=str(tmp_path))],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]

    reopened = ReplayStore(store_config(tmp_path))
    try:
        stats = reopened.stats()
        assert stats["episodes_stored"] == 4 and stats["segments_staged"] == 0
        again = segments("r0", 2, make_steps(6, robot=0, episode=2))
        assert all(reopened.ingest(s).duplicate for s in again)
    finally:
        reopened.close()
    expected = [(0, 0, t) for t in range(8)] + [(0, e, t) for e in (1, 2, 3) for t in range(6)]
    assert sorted(stored_triples(tmp_path)) == expected


def test_queued_episodes_share_one_finalize_and_keep_their_order(tmp_path, monkeypatch):
    import threading

    import robot_rl.learner.commit as commit_module

    queued = threading.Event()
    monkeypatch.setattr(commit_module, "lower_own_priority", lambda nice: queued.wait())
    finalizes = count_finalizes(monkeypatch)
    store = ReplayStore(store_config(tmp_path, background_commit=True, commit_batch=2))
    try:
        for episode in (1, 2, 3):
            for s in segments("r0", episode, make_steps(5, robot=0, episode=episode)):
                store.ingest(s)
        queued.set()
        assert store.flush(60)
        assert store.stats()["episodes_stored"] == 3 and store.stats()["segments_staged"] == 0
    finally:
        store.close()
    assert finalizes.count(True) == 2  # batches [1, 2] and [3]
    assert [e for _, e, t in stored_triples(tmp_path) if t == 0] == [1, 2, 3]


def test_an_episode_whose_write_failed_is_not_taken_for_the_next_one_on_restart(tmp_path, monkeypatch):
    """One write of a batch fails: the others are stored, it stays staged. The next episode gets
    its dataset index, so without the ledger's abort line a restart would read that index as
    proof the failed episode was written, and drop it."""
    import threading

    import robot_rl.learner.commit as commit_module
    from robot_rl.data.recorder import EpisodeRecorder

    queued = threading.Event()
    monkeypatch.setattr(commit_module, "lower_own_priority", lambda nice: queued.wait())
    write = EpisodeRecorder.write_steps
    failures = []

    def disk_full_once(self, instruction, seed, steps, finalize=None):
        steps = list(steps)
        episode = int(steps[0].state[1])  # make_step: state[1] is the episode
        if episode == 2 and not failures:
            failures.append(episode)
            raise OSError("simulated: no space left on device")
        return write(self, instruction, seed, steps, finalize)

    monkeypatch.setattr(EpisodeRecorder, "write_steps", disk_full_once)
    with ReplayStore(store_config(tmp_path, background_commit=True)) as store:
        for episode in (1, 2, 3):
            for s in segments("r0", episode, make_steps(5, robot=0, episode=episode)):
                store.ingest(s)
        queued.set()  # one batch: 1, 2 (fails), 3
        assert store.flush(60)
        assert store.stats()["episodes_stored"] == 2 and store.stats()["segments_staged"] == 2
    assert failures == [2]

    with ReplayStore(store_config(tmp_path)) as reopened:  # the staged episode 2 is written now
        assert reopened.stats()["episodes_stored"] == 3 and reopened.stats()["segments_staged"] == 0
    assert sorted(stored_triples(tmp_path)) == [(0, e, t) for e in (1, 2, 3) for t in range(5)]


def test_episodes_trickling_in_share_a_finalize_and_flush_does_not_wait_out_the_linger(tmp_path, monkeypatch):
    """A writer that keeps up used to finalize and re-open the dataset for every episode (the
    re-open alone held the GIL for half the writer's time). Now it waits up to commit_linger_s
    for more, and a flush ends that wait: with a 60 s linger, flush(10) must still finish."""
    from tests.learner_helpers import wait_for

    finalizes = count_finalizes(monkeypatch)
    with ReplayStore(store_config(tmp_path, background_commit=True, commit_batch=8, commit_linger_s=60.0)) as store:
        for s in segments("r0", 1, make_steps(5, robot=0, episode=1)):
            store.ingest(s)
        # The writer has taken episode 1 and waits (lingers) for more now.
        wait_for(lambda: store.writer_backlog().episodes == 0, what="the writer to take episode 1")
        for s in segments("r0", 2, make_steps(5, robot=0, episode=2)):
            store.ingest(s)
        assert store.flush(10)
        assert store.stats()["episodes_stored"] == 2 and store.stats()["segments_staged"] == 0
    assert finalizes.count(True) == 1  # one batch [1, 2]
    assert [e for _, e, t in stored_triples(tmp_path) if t == 0] == [1, 2]


def test_commit_linger_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="commit_linger_s"):
        store_config(tmp_path, commit_linger_s=-1.0)


def test_a_sim_episodes_scene_seed_reaches_the_stored_dataset_and_a_real_one_stays_unseeded(tmp_path):
    """The seed travels on every step over the wire; the store writes it as the episode's seed
    (replay re-creates that scene), and -1 (a real scene) as no seed."""
    from robot_rl.data.reader import load_episode_arrays

    sim, real = make_steps(6, episode=1), make_steps(6, episode=2)
    for step in sim:
        step.scene_seed = 1234
    with ReplayStore(store_config(tmp_path)) as store:
        for segment in segments("r0", 1, sim) + segments("r0", 2, real):
            store.ingest(segment)
        assert store.flush(60.0)
    stored = load_episode_arrays(tmp_path / "dataset", "local/robot_rl_replay")
    assert [int(np.asarray(e["episode_seed"]).reshape(-1)[0]) for e in stored] == [1234, -1]


@pytest.mark.parametrize("garbage", [b"\xff\xfe", b"{not json"])
def test_a_garbled_ledger_line_is_one_clear_error_and_a_garbled_last_line_is_cut(tmp_path, garbage):
    from robot_rl.core.errors import ConfigError
    from robot_rl.learner.ledger import CommitRecord

    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    for i in range(3):
        ledger.write_commit(CommitRecord("r0", i, 0, i, (0, 1)))
    ledger.close()
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], lines[1][:5] + garbage, lines[2]]) + b"\n")
    with pytest.raises(ConfigError, match="line 2 is corrupt"):
        Ledger(path)
    path.write_bytes(b"\n".join([lines[0], lines[1], lines[2][:5] + garbage]) + b"\n")  # a torn last write
    reopened = Ledger(path)
    assert [r.episode_id for r in reopened.commits] == [0, 1]
    reopened.close()


def test_a_store_with_a_staged_backlog_opens_at_once_and_writes_it_behind(tmp_path, monkeypatch):
    """Episodes acked and staged before a crash are written after the store is up, not before:
    start-up must not grow with the backlog (here the writer is held until the store has opened)."""
    import threading

    from robot_rl.bridges.zmq.protocol import encode_message
    from robot_rl.bridges.zmq.spool import Spool
    from robot_rl.learner.open_episodes import staging_key
    from robot_rl.learner.store_writer import ThreadEpisodeWriter

    with ReplayStore(store_config(tmp_path)) as store:  # writes layout.json, nothing else
        assert store.stats()["episodes_stored"] == 0
    with Spool(tmp_path / "staging") as staging:  # three whole episodes, acked but never written
        for episode in range(3):
            for seq, segment in enumerate(segments("r0", episode, make_steps(8, episode=episode))):
                staging.append(staging_key("r0", episode, seq), encode_message(segment))
    release = threading.Event()
    write = ThreadEpisodeWriter.write
    monkeypatch.setattr(ThreadEpisodeWriter, "write", lambda self, *a: release.wait(60) and write(self, *a))
    store = open_on_a_thread(tmp_path, 60)
    release.set()
    assert store is not None, "the store waited for its backlog to be written before it opened"
    try:
        assert store.flush(60) and store.stats()["episodes_stored"] == 3
    finally:
        store.close()
    assert sorted({e for _, e, _ in stored_triples(tmp_path)}) == [0, 1, 2]


def test_a_restarted_store_serves_before_its_staged_pixels_decode_and_indexes_them_ahead_of_new_segments(
        tmp_path, monkeypatch):
    """A writer far behind leaves a staged backlog as long as max_staged_bytes_per_robot allows: its
    images decode behind a serving store (held here until the robot's next segment is stored), and
    the sampling index still holds the episode's steps in tick order."""
    import threading

    import robot_rl.bridges.zmq.segments as segments_module
    from robot_rl.bridges.zmq.protocol import encode_message
    from robot_rl.bridges.zmq.spool import Spool
    from robot_rl.learner.open_episodes import staging_key

    with ReplayStore(store_config(tmp_path)) as store:  # writes layout.json, nothing else
        assert store.stats()["episodes_stored"] == 0
    episode = segments("r0", 0, make_steps(12))
    with Spool(tmp_path / "staging") as staging:  # the first two of three segments, acked before a crash
        for seq, segment in enumerate(episode[:2]):
            staging.append(staging_key("r0", 0, seq), encode_message(segment))
    release = threading.Event()
    decode = segments_module.decode_image

    def held_but_for_the_robots_segments(buf, fmt, shape):  # the test's thread ingests what the robot sends
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(60)
        return decode(buf, fmt, shape)

    monkeypatch.setattr(segments_module, "decode_image", held_but_for_the_robots_segments)
    store = open_on_a_thread(tmp_path, 20)
    assert store is not None, "the store decoded its staged backlog before it took a segment"
    try:
        assert not store.ingest(episode[2]).duplicate  # the episode's last segment, sent after the restart
        assert store.ingest(episode[0]).duplicate  # the backlog is known before its pixels are decoded
        release.set()
        assert store.flush(60) and store.stats()["episodes_stored"] == 1
        states, _ = store.index.states_and_actions()
        assert states[:, 2].tolist() == list(range(12))  # staged steps first, then the new segment's
    finally:
        release.set()
        store.close()
    assert sorted(stored_triples(tmp_path)) == [(0, 0, t) for t in range(12)]


def test_a_committed_episode_a_damaged_dataset_file_rolls_back_is_reported_as_lost(tmp_path, caplog):
    """After a finalize the episode is acked and released from staging: if its parquet is truncated
    later (a bad disk), opening the dataset rolls it back, and the store must say so loudly."""
    import logging

    with ReplayStore(store_config(tmp_path)) as store:
        for segment in segments("r0", 1, make_steps(8, episode=1)):
            store.ingest(segment)
        assert store.flush()
        for segment in segments("r0", 2, make_steps(8, episode=2)):
            store.ingest(segment)
        assert store.flush()
    newest = max((tmp_path / "dataset" / "data").glob("chunk-*/file-*.parquet"), key=lambda p: p.stat().st_mtime)
    os.truncate(newest, newest.stat().st_size // 2)
    with caplog.at_level(logging.ERROR), ReplayStore(store_config(tmp_path)) as store:
        assert store.stats()["episodes_stored"] == 1 and store.stats()["episodes_lost_to_damage"] == 1
    assert "DATA LOST" in caplog.text and "r0/2 (dataset episode 1)" in caplog.text


def test_a_restarted_store_takes_segments_before_its_dataset_is_read_and_batches_wait_for_the_read(
        tmp_path, monkeypatch):
    """Reading the dataset into the sampling index grows with the store: a restarted learner serves
    robots first and reads it behind them; a batch (drawn from all stored data) waits for it."""
    import threading

    import robot_rl.data.reader as reader
    from robot_rl.learner.index import SampleSpec

    with ReplayStore(store_config(tmp_path)) as store:
        for episode in range(2):
            for segment in segments("r0", episode, make_steps(8, episode=episode)):
                store.ingest(segment)
        assert store.stats()["episodes_stored"] == 2
    release, events = threading.Event(), []
    load = reader.load_episode_arrays
    monkeypatch.setattr(reader, "load_episode_arrays", lambda *a, **k: release.wait(60) and load(*a, **k))
    store = open_on_a_thread(tmp_path, 60)
    assert store is not None, "the store read its whole dataset before it took a segment"
    try:
        assert not store.index.wait_loaded(0)
        new = segments("r0", 2, make_steps(8, episode=2))
        assert not any(store.ingest(s).duplicate for s in new)  # a robot is served meanwhile
        assert store.ingest(segments("r0", 0, make_steps(8, episode=0))[0]).duplicate  # and deduplicated
        spec = SampleSpec(chunk_size=2, cameras=("front",))
        sampler = threading.Thread(target=lambda: events.append(
            len(store.index.sample(4, {"online": 1.0}, spec, np.random.default_rng(0))["weight"])))
        sampler.start()
        events.append("released")
        release.set()
        sampler.join(60)
        assert events == ["released", 4]
        assert store.flush(60)
        assert store.stats()["online_steps"] == 24 and store.stats()["episodes_stored"] == 3
        assert [entry[:2] for entry in store.index.manifest()] == [["r0", 0], ["r0", 1], ["r0", 2]]
    finally:
        store.close()
    assert sorted(stored_triples(tmp_path)) == [(0, e, t) for e in range(3) for t in range(8)]


@pytest.mark.parametrize("order", [
    # e1's middle segment is re-sent late, after e2 began: e1 must wait for it, not be stored with a gap.
    [(1, 0), (1, 2), (2, 0), (1, 1), (2, 1), (2, 2)],
    # e2's first segment arrives before e1's: e1 is the older episode, not one that cuts e2 short.
    [(2, 0), (1, 0), (1, 1), (1, 2), (2, 1), (2, 2)],
])
def test_segments_delivered_out_of_order_across_two_episodes_store_each_episode_whole(tmp_path, order):
    episodes = {e: segments("r0", e, make_steps(12, episode=e)) for e in (1, 2)}
    with ReplayStore(store_config(tmp_path)) as store:
        for episode, seq in order:
            assert not store.ingest(episodes[episode][seq]).duplicate
        assert store.stats()["episodes_stored"] == 2 and store.stats()["segments_staged"] == 0
        assert sorted((r.episode_id, r.seqs) for r in store._ledger.commits) == [(1, (0, 1, 2)), (2, (0, 1, 2))]
    stored = stored_triples(tmp_path)
    assert sorted(stored) == [(0, e, t) for e in (1, 2) for t in range(12)]
    for e in (1, 2):  # each one piece, its ticks in order
        assert [t for _, episode, t in stored if episode == e] == list(range(12))
