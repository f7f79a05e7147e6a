"""Replay store: dedup across reopen, a crash between dataset write and ledger commit, streams."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.learner.ledger import Ledger
from robot_rl.learner.store import ReplayStore
from tests.learner_helpers import make_steps, store_config, stored_triples

PNG = ImageEncoding("png")


def segments(robot: str, episode: int, steps, size: int = 4):
    chunks = [steps[i:i + size] for i in range(0, len(steps), size)]
    return [encode_segment(robot, episode, seq, c, episode_done=c[-1].done, image_encoding=PNG)
            for seq, c in enumerate(chunks)]


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


def test_layout_mismatch_is_refused_with_a_clear_error(tmp_path):
    from bridges.zmq.protocol import ProtocolError

    with ReplayStore(store_config(tmp_path, cameras=("front", "wrist"))) as store:
        with pytest.raises(ProtocolError, match="cameras"):
            store.ingest(segments("r0", 1, make_steps(3))[0])
        assert store.stats()["segments_ingested"] == 0
