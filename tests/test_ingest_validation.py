"""Validate at the door: a segment whose values would poison training or the dataset is refused
before it is staged or acknowledged, and a refused segment leaves every stored one as it was."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import robot_rl.bridges.zmq.segments as segments_module
from robot_rl.bridges.zmq.protocol import ProtocolError
from robot_rl.bridges.zmq.segments import ImageEncoding, decode_segment, encode_segment
from robot_rl.learner.store import ReplayStore
from tests.learner_helpers import make_steps, store_config, stored_triples

PNG = ImageEncoding("png")


def one_segment(steps, seq: int = 0, robot: str = "r0", episode: int = 1):
    return encode_segment(robot, episode, seq, steps, episode_done=steps[-1].done, image_encoding=PNG)


def with_step(steps, index: int, **changes):
    steps = list(steps)
    steps[index] = dataclasses.replace(steps[index], **changes)
    return steps


@pytest.mark.parametrize("changes, column", [
    (dict(reward=float("nan")), "reward"),
    (dict(reward=float("inf")), "reward"),
    (dict(lateness_s=float("nan")), "lateness_s"),
    (dict(time_s=float("-inf")), "time_s"),
    (dict(tick=2**40), "tick"),
    (dict(policy_version=2**62), "policy_version"),
    (dict(chunk_id=-7), "chunk_id"),
    (dict(delay_ticks=-1), "delay_ticks"),
])
def test_a_non_finite_or_out_of_range_column_is_refused_naming_the_step(changes, column):
    bad = one_segment(with_step(make_steps(4), 2, **changes))
    with pytest.raises(ProtocolError, match=rf"{column}.*step 2"):
        decode_segment(bad)


@pytest.mark.parametrize("name", ["policy_action", "rolled_state", "state", "action"])
def test_nan_in_any_array_a_step_carries_is_refused(name):
    steps = make_steps(4)
    steps = [dataclasses.replace(s, policy_action=s.action.copy(), rolled_state=s.state.copy()) for s in steps]
    poisoned = getattr(steps[1], name).copy()
    poisoned[0] = np.nan
    with pytest.raises(ProtocolError, match=rf"{name}.*step 1"):
        decode_segment(one_segment(with_step(steps, 1, **{name: poisoned})))


def test_a_step_without_an_optional_array_is_fine_beside_one_that_has_it():
    steps = make_steps(3)
    steps = with_step(steps, 1, policy_action=steps[1].action.copy())
    decoded = decode_segment(one_segment(steps))
    assert decoded[0].policy_action is None and np.array_equal(decoded[1].policy_action, steps[1].action)


def test_the_store_refuses_a_poisoned_segment_and_keeps_the_episode_it_belongs_to(tmp_path):
    steps = make_steps(8)
    with ReplayStore(store_config(tmp_path)) as store:
        store.ingest(one_segment(steps[:4], seq=0))
        with pytest.raises(ProtocolError, match="reward"):
            store.ingest(one_segment(with_step(steps[4:], 0, reward=float("nan")), seq=1))
        assert store.stats()["segments_staged"] == 1 and store.stats()["steps_ingested"] == 4
        store.ingest(one_segment(steps[4:], seq=1))  # the edge's clean re-send completes the episode
        assert store.flush()
    assert stored_triples(tmp_path) == [(0, 0, t) for t in range(8)]  # (robot, episode, tick), as make_steps says


def test_images_larger_than_the_learner_stores_are_refused_before_any_is_decoded(tmp_path, monkeypatch):
    """A PNG declaring a 4k frame is ~50 MB once decoded; the learner stores its own camera size,
    so the declaration is compared with that first and nothing is decoded."""
    decoded: list[tuple] = []
    decode = segments_module.decode_image
    monkeypatch.setattr(segments_module, "decode_image", lambda buf, fmt, shape: decoded.append(shape) or
                        decode(buf, fmt, shape))
    big = [dataclasses.replace(s, images={cam: np.zeros((256, 256, 3), np.uint8) for cam in s.images})
           for s in make_steps(2)]
    with ReplayStore(store_config(tmp_path)) as store, pytest.raises(ProtocolError, match="learner stores cameras"):
        store.ingest(one_segment(big))
    assert decoded == []


def test_a_staged_segment_that_fails_the_checks_is_quarantined_and_start_up_goes_on(tmp_path):
    """Staged by a learner whose checks were looser (or changed on disk): start-up must neither fail
    on it at every restart nor drop the good segments staged beside it."""
    from robot_rl.bridges.zmq.protocol import encode_message
    from robot_rl.bridges.zmq.spool import Spool
    from robot_rl.learner.open_episodes import staging_key

    steps = make_steps(8)
    with ReplayStore(store_config(tmp_path)) as store:
        store.ingest(one_segment(steps[:4], seq=0))
        store.ingest(one_segment(steps[4:], seq=1))
        assert store.flush()
    bad_steps = make_steps(4, episode=5)
    with Spool(tmp_path / "staging") as staging:
        staging.append(staging_key("r0", 5, 0), encode_message(one_segment(
            with_step(bad_steps, 1, reward=float("nan")), episode=5)))
        staging.append(staging_key("r0", 6, 0), encode_message(one_segment(make_steps(4, episode=6), episode=6)))
    with ReplayStore(store_config(tmp_path)) as store:
        assert store.counters["quarantined_segments"] == 1
        assert store.flush()
    with Spool(tmp_path / "quarantine") as quarantine:
        assert quarantine.keys() == [staging_key("r0", 5, 0)]
    with Spool(tmp_path / "staging") as staging:
        assert len(staging) == 0
    assert sorted({e for _, e, _ in stored_triples(tmp_path)}) == [0, 6]  # the good staged episode is stored
