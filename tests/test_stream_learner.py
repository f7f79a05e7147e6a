"""Learner service on loopback with real sockets: >= 4 robots, exactly-once across restarts,
config-hash refusal, malformed input never crashes the learner nor loses stored data."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import Counter

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_rl.bridges.zmq.protocol import Hello, Segment, decode_message, encode_message
from robot_rl.bridges.zmq.segments import ImageEncoding, encode_segment
from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.learner.service import LearnerService
from tests.learner_helpers import (
    client_config,
    learner_config,
    make_step,
    stored_triples,
    tiny_policy,
    wait_for,
)

PNG = ImageEncoding("png")


def submit(link: StreamingClient, robot: int, episode: int, ticks: range, done_at: int | None, size: int = 5) -> None:
    ticks = list(ticks)
    for i in range(0, len(ticks), size):
        chunk = [make_step(t, robot=robot, episode=episode, done=(t == done_at)) for t in ticks[i:i + size]]
        assert link.submit_steps(episode, chunk, episode_done=chunk[-1].done)


def test_four_robots_exactly_once_across_learner_and_edge_restarts(tmp_path):
    config = learner_config(tmp_path)
    learner = LearnerService(config, tiny_policy(), train=False).start()
    router, pub = learner.router_endpoint, learner.pub_endpoint
    links = [StreamingClient(client_config(f"r{r}", learner, tmp_path / "spool"), image_encoding=PNG).start()
             for r in range(4)]
    expected: list[tuple[int, int, int]] = []
    for r, link in enumerate(links):  # episode 1 complete, episode 2 half-way
        submit(link, r, 1, range(20), done_at=19)
        submit(link, r, 2, range(10), done_at=None)
        expected += [(r, 1, t) for t in range(20)] + [(r, 2, t) for t in range(10)]
    wait_for(lambda: all(link.flush(0.01) for link in links), what="first acks")
    assert len(learner.robots) == 4 and all(s.connected for s in learner.robots.values())

    # The learner goes down mid-stream; robots keep producing into their spools.
    learner.stop(checkpoint=False)
    for r, link in enumerate(links):
        submit(link, r, 2, range(10, 20), done_at=19 if r != 3 else None)
        expected += [(r, 2, t) for t in range(10, 20)]
    # Robot 3's edge process restarts mid-episode 2 (its spool survives), then starts episode 3.
    links[3].stop()
    links[3] = StreamingClient(client_config("r3", learner, tmp_path / "spool"), image_encoding=PNG).start()
    submit(links[3], 3, 3, range(12), done_at=11)
    expected += [(3, 3, t) for t in range(12)]

    # A new learner process on the same ports and store.
    config.service.router_endpoint, config.service.pub_endpoint = router, pub
    learner = LearnerService(config, tiny_policy(), train=False).start()
    try:
        wait_for(lambda: all(link.flush(0.01) for link in links), timeout_s=40, what="acks after restart")
        assert learner.store.flush(60)
        stats = learner.store.stats()
        assert stats["episodes_open"] == 0 and stats["segments_staged"] == 0
    finally:
        for link in links:
            link.stop()
        learner.stop(checkpoint=False)
    stored = stored_triples(tmp_path / "store")
    duplicates = [k for k, n in Counter(stored).items() if n > 1]
    assert not duplicates, f"stored twice: {duplicates[:5]}"
    assert sorted(stored) == sorted(expected)  # every step exactly once
    assert stats["online_steps"] == len(expected)


def test_robot_with_other_policy_config_is_refused(tmp_path):
    learner = LearnerService(learner_config(tmp_path), tiny_policy(), train=False).start()
    link = StreamingClient(client_config("stranger", learner, tmp_path / "spool", config_hash="deadbeef")).start()
    try:
        wait_for(lambda: link.stats().get("errors_received", 0) >= 1, what="refusal")
        assert not link.connected and "stranger" not in learner.robots
    finally:
        link.stop()
        learner.stop(checkpoint=False)


def _request(sock: zmq.Socket, frames: list) -> object:
    sock.send_multipart(frames)
    assert sock.poll(5000), "the learner stopped answering"
    return decode_message(sock.recv_multipart())


junk_frames = st.lists(st.binary(max_size=300), min_size=0, max_size=4)


def test_malformed_messages_never_crash_the_learner_nor_lose_stored_data(tmp_path):
    learner = LearnerService(learner_config(tmp_path), tiny_policy(), train=False).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(learner.router_endpoint)
    try:
        hello = Hello(robot_id="fuzz", config_hash=tiny_policy().config_hash(), policy_version=-1)
        assert _request(sock, encode_message(hello)).TYPE == "hello_ok"
        sock.poll(200) and sock.recv_multipart()  # the announce that follows hello_ok
        steps = [make_step(t, robot=9, episode=1, done=t == 4) for t in range(5)]
        good = encode_segment("fuzz", 1, 0, steps, episode_done=True, image_encoding=PNG)
        assert _request(sock, encode_message(good)).TYPE == "ack"
        assert learner.store.flush(30)
        before = learner.store.stats()

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(junk_frames)
        def junk_is_refused(frames):
            if not frames:
                return
            reply = _request(sock, frames)
            assert reply.TYPE == "error"

        junk_is_refused()
        # Well-formed envelopes with bad content: wrong shapes, NaN, bad image bytes, wrong robot.
        bad = [
            Segment(**{**good.__dict__, "seq": 1, "num_steps": 7}),
            encode_segment("fuzz", 2, 0, [make_step(0, robot=9)], image_encoding=PNG),
            encode_segment("other", 3, 0, [make_step(0, robot=9)], image_encoding=PNG),
        ]
        bad[1].arrays["state"] = bad[1].arrays["state"] * float("nan")
        broken_png = encode_segment("fuzz", 4, 0, [make_step(0, robot=9)], image_encoding=PNG)
        broken_png.arrays["image/front/0"] = broken_png.arrays["image/front/0"][:20].copy()
        bad.append(broken_png)
        # Malformed content is refused for good (the edge sets it aside); a segment under another
        # robot's name is an error on this session (not this connection's to send), never stored.
        replies = [_request(sock, encode_message(segment)).TYPE for segment in bad]
        assert replies == ["refused", "refused", "error", "refused"]
        assert learner.store.stats() == before
        # The learner is still up and still stores good data.
        more = encode_segment("fuzz", 5, 0, [make_step(0, robot=9, episode=5, done=True)], episode_done=True,
                              image_encoding=PNG)
        assert _request(sock, encode_message(more)).TYPE == "ack"
        assert learner.store.flush(30)
    finally:
        sock.close(0)
        ctx.term()
        learner.stop(checkpoint=False)
    stored = stored_triples(tmp_path / "store")
    assert sorted(stored) == [(9, 1, t) for t in range(5)] + [(9, 5, 0)]
