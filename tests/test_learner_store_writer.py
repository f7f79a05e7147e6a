"""The store's dataset writer in its own process: same dataset as in-process, errors come back,
a dead one loses nothing."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bridges.zmq.protocol import encode_message
from robot_rl.learner.store import ReplayStore
from robot_rl.learner.store_writer import EpisodeWriteError, ProcessEpisodeWriter, RecorderSpec
from tests.learner_helpers import CAMERAS, IMG, JOINTS, make_steps, store_config, stored_triples
from tests.test_learner_store import segments

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel


def ingest_episodes(store: ReplayStore, episodes, steps: int = 6) -> None:
    for episode in episodes:
        for segment in segments("r0", episode, make_steps(steps, robot=0, episode=episode)):
            store.ingest(segment)


def test_the_writer_process_stores_what_the_thread_writer_stores(tmp_path):
    for kind in ("thread", "process"):
        with ReplayStore(store_config(tmp_path / kind, writer=kind)) as store:
            ingest_episodes(store, (1, 2))
            assert store.stats()["episodes_stored"] == 2 and store.stats()["segments_staged"] == 0
            if kind == "process":
                assert store.writer.pid not in (None, os.getpid())
            outcomes = sorted((o.episode_id, o.steps) for o in store.outcomes.outcomes())
        assert outcomes == [(1, 6), (2, 6)]
    assert stored_triples(tmp_path / "process") == stored_triples(tmp_path / "thread")
    assert sorted(stored_triples(tmp_path / "process")) == [(0, e, t) for e in (1, 2) for t in range(6)]


def test_a_killed_writer_process_leaves_the_episodes_staged_for_the_next_start(tmp_path):
    with ReplayStore(store_config(tmp_path, writer="process")) as store:
        ingest_episodes(store, (1,))
        os.kill(store.writer.pid, signal.SIGKILL)
        ingest_episodes(store, (2, 3))  # written inline: each write finds the writer gone
        stats = store.stats()
        assert stats["episodes_stored"] == 1 and stats["segments_staged"] == 4
        assert store.index.counts()["online"] == 18  # still trained on
    with ReplayStore(store_config(tmp_path, writer="process")) as reopened:
        assert reopened.stats()["episodes_stored"] == 3 and reopened.stats()["segments_staged"] == 0
    assert sorted(stored_triples(tmp_path)) == [(0, e, t) for e in (1, 2, 3) for t in range(6)]


def test_a_writer_process_goes_on_after_ctrl_c_and_after_an_episode_it_cannot_decode(tmp_path, capfd):
    """Ctrl-C reaches the writer's process too (one process group): it goes on, prints nothing, and
    stores what it is given until the learner stops it. An episode it cannot decode comes back as an
    error, and it stores the next one. One child for both: each start imports LeRobot."""
    spec = RecorderSpec(str(tmp_path / "dataset"), 30, JOINTS, {cam: (IMG, IMG) for cam in CAMERAS},
                        "local/robot_rl_replay")
    writer = ProcessEpisodeWriter(spec)
    try:
        writer.finalize()  # the child is up
        os.kill(writer.pid, signal.SIGINT)
        with pytest.raises(EpisodeWriteError, match="ProtocolError"):
            writer.write("r0", 1, [[b"not a segment"]])
        good = [[bytes(f) for f in encode_message(s)] for s in segments("r0", 2, make_steps(5, robot=0, episode=2))]
        written = writer.write("r0", 2, good)
        writer.finalize()
        assert written.index == 0 and writer.num_episodes == 1
        assert written.outcome["success"].shape == (5,)
    finally:
        writer.close()
    assert sorted(stored_triples(tmp_path)) == [(0, 2, t) for t in range(5)]
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_a_png_store_does_not_log_video_codecs(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO), ReplayStore(store_config(tmp_path, writer="thread")) as store:
        ingest_episodes(store, (1, 2))
        assert store.stats()["episodes_stored"] == 2
    assert "Using video codec" not in caplog.text


def test_the_writer_decodes_an_episode_segment_by_segment_as_it_writes_it(tmp_path, monkeypatch):
    """A minute of two 640x480 cameras is 3.3 GB decoded: the writer must hold a segment's frames at a
    time, not the episode's. Each segment is decoded only once the steps before it went to the dataset."""
    from robot_rl.data.recorder import EpisodeRecorder
    from robot_rl.learner import store_writer

    events: list[str] = []
    decode, frame = store_writer._decode_staged, EpisodeRecorder._frame
    monkeypatch.setattr(store_writer, "_decode_staged", lambda frames: events.append("decode") or decode(frames))
    monkeypatch.setattr(EpisodeRecorder, "_frame", lambda self, *a: events.append("frame") or frame(self, *a))
    recorder = RecorderSpec(str(tmp_path / "dataset"), 30, JOINTS, {c: (IMG, IMG) for c in CAMERAS}, "local/t").open()
    staged = [encode_message(s) for s in segments("r0", 0, make_steps(12, robot=0, episode=0), size=4)]
    written = store_writer.write_staged(recorder, "r0", 0, staged)
    recorder.close()
    assert written.index == 0 and len(written.outcome["success"]) == 12
    # Each decode is followed by its segment's frames (one step is held back until the next arrives: the
    # last step takes the learner's verdict); never two segments decoded ahead.
    assert events == ["decode", *["frame"] * 3, "decode", *["frame"] * 4, "decode", *["frame"] * 5]
