"""A malformed segment is set aside, never re-sent: the robot's other segments flow on, and what the
learner would refuse is refused on the edge before it is spooled."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from robot_rl.bridges.zmq import ImageEncoding, Spool, StreamingClient, ZmqClient, encode_segment
from robot_rl.bridges.zmq.protocol import MAX_ROBOT_ID_CHARS, ProtocolError, Segment, decode_message, encode_message
from robot_rl.bridges.zmq.spool import REFUSED_DIR
from tests.zmq_helpers import MemoryIngest, client_config, make_steps, serving, wait_until

pytestmark = pytest.mark.timeout(60)

NAN_SEGMENTS, CLEAN_SEGMENTS, STEPS = 8, 20, 3


def nan_reward_steps(start_tick: int):
    return [dataclasses.replace(s, reward=float("nan")) for s in make_steps(STEPS, start_tick)]


def test_segments_the_learner_refuses_as_malformed_are_set_aside_and_the_clean_ones_after_them_stored(tmp_path,
                                                                                                       caplog):
    """An edge whose own checks let a NaN reward through: the learner answers ``refused``, the edge
    moves each such segment to ``refused/`` with the reason (said once), and its slots go to the 20
    clean segments behind them, which are all stored; the spool drains."""
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        client = ZmqClient(client_config(server, tmp_path, ack_timeout_s=30.0))
        try:
            for seq in range(NAN_SEGMENTS):  # as many as the in-flight window holds
                client.send_segment(encode_segment("so101-a", 1, seq, nan_reward_steps(STEPS * seq)))
            for seq in range(NAN_SEGMENTS, NAN_SEGMENTS + CLEAN_SEGMENTS):
                client.send_segment(encode_segment("so101-a", 1, seq, make_steps(STEPS, STEPS * seq)))
            with caplog.at_level(logging.ERROR):
                assert wait_until(lambda: client.pending == 0, timeout_s=20, tick=lambda: client.poll(10)), \
                    client.stats
            stats = client.stats
        finally:
            client.close()
    clean = [("so101-a", 1, seq) for seq in range(NAN_SEGMENTS, NAN_SEGMENTS + CLEAN_SEGMENTS)]
    assert sorted(ingest.stored) == clean
    assert sum(len(ingest.stored[key]) for key in clean) == CLEAN_SEGMENTS * STEPS
    assert stats.segments_refused == NAN_SEGMENTS and stats.segments_resent == 0
    with Spool(tmp_path) as spool:
        refused = spool.refused()
        assert len(spool) == 0
    assert sorted(refused) == sorted(f"1-{seq}" for seq in range(NAN_SEGMENTS))
    assert all("reward" in reason and "finite" in reason for reason in refused.values())
    kept = (tmp_path / REFUSED_DIR / "1-0.segment").read_bytes()  # the bytes as sent, to look at later
    assert len(kept) > 100
    said = [r for r in caplog.records if "set aside" in r.getMessage()]
    assert len(said) == 1


def test_the_edge_refuses_a_nan_reward_before_spooling_it_and_streams_on(tmp_path):
    """8 segments with a NaN reward, then 20 clean ones, through the edge's link: the bad ones never
    enter the spool (set aside with the check's reason), every clean step is stored, the link drains."""
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        link = StreamingClient(client_config(server, tmp_path), image_encoding=ImageEncoding("png"))
        with link:
            assert link.wait_connected(5)
            for k in range(NAN_SEGMENTS):
                assert link.submit_steps(episode_id=4, steps=nan_reward_steps(STEPS * k))
            for k in range(NAN_SEGMENTS, NAN_SEGMENTS + CLEAN_SEGMENTS):
                assert link.submit_steps(episode_id=4, steps=make_steps(STEPS, STEPS * k))
            assert link.flush(20), link.stats()
            stats = link.stats()
    assert sum(len(steps) for steps in ingest.stored.values()) == CLEAN_SEGMENTS * STEPS
    assert ingest.received == CLEAN_SEGMENTS  # nothing malformed crossed the wire
    assert stats["segments_refused"] == NAN_SEGMENTS and stats["pending"] == 0
    with Spool(tmp_path) as spool:
        reasons = spool.refused()
    assert len(reasons) == NAN_SEGMENTS
    assert all(r.startswith("refused on the edge before spooling") and "'reward'" in r for r in reasons.values())


def test_a_segment_set_aside_reads_back_as_the_message_that_was_refused(tmp_path):
    segment = encode_segment("so101-a", 3, 2, nan_reward_steps(0))
    with Spool(tmp_path) as spool:
        spool.append("3:2", encode_message(segment))
        spool.set_aside("3:2", "refused by the learner (bad_message): reward is nan")
        assert len(spool) == 0 and spool.refused() == {"3-2": "refused by the learner (bad_message): reward is nan"}
        with pytest.raises(KeyError):
            spool.set_aside("3:2", "twice")
    from robot_rl.bridges.zmq.spool import _unpack_frames

    back = decode_message(_unpack_frames((tmp_path / REFUSED_DIR / "3-2.segment").read_bytes()))
    assert isinstance(back, Segment) and (back.episode_id, back.seq, back.num_steps) == (3, 2, STEPS)
    assert np.isnan(back.columns["reward"]).all()


def test_robot_ids_are_bounded_in_length_on_the_wire_and_in_the_client_config(tmp_path):
    long_id = "r" * (MAX_ROBOT_ID_CHARS + 1)
    with pytest.raises(ProtocolError, match="robot id of 65 characters"):
        decode_message(encode_message(encode_segment(long_id, 1, 0, make_steps(1))))
    with serving() as server, pytest.raises(ValueError, match="shorter link.robot_id"):
        client_config(server, tmp_path, robot_id=long_id)
