"""Edge <-> learner over real ZeroMQ sockets on 127.0.0.1: handshake, acks, dedup,
re-send after restart, weights, CURVE, many robots, and a fuzzed live server."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_rl.bridges.zmq import (
    Ack,
    ClientConfig,
    ClientCurve,
    Error,
    Heartbeat,
    Hello,
    HelloOk,
    ImageEncoding,
    Peer,
    Segment,
    ServerConfig,
    ServerCurve,
    StreamingClient,
    WeightsAnnounce,
    WeightsBlob,
    WeightsChunk,
    ZmqClient,
    ZmqServer,
    decode_message,
    encode_message,
    encode_segment,
    generate_keypair,
)
from robot_rl.bridges.zmq.admission import PeerLimits
from robot_rl.bridges.zmq.codec import BusyError
from robot_rl.bridges.zmq.server import who
from tests.zmq_helpers import FAST, MemoryIngest, client_config, dealer_on_routing_id, make_steps, serving, wait_until

pytestmark = pytest.mark.timeout(60)

# ---------------------------------------------------------------- streaming + acks


def test_streamed_segments_are_acked_stored_and_exact(tmp_path):
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        link = StreamingClient(client_config(server, tmp_path), image_encoding=ImageEncoding("png"))
        with link:
            assert link.wait_connected(5)
            for k in range(3):
                assert link.submit_steps(episode_id=11, steps=make_steps(4, 4 * k), episode_done=k == 2)
            assert link.flush(10), link.stats()
            stats = link.stats()
        assert sorted(ingest.stored) == [("so101-a", 11, seq) for seq in range(3)]
        got = [s for seq in range(3) for s in ingest.stored[("so101-a", 11, seq)]]
        assert [s.tick for s in got] == list(range(12))
        assert np.array_equal(got[5].state, np.full(6, 1, np.float32))
        assert np.array_equal(got[5].images["front"], make_steps(1)[0].images["front"])
        assert stats["segments_acked"] == 3 and stats["pending"] == 0 and stats["queue_rejections"] == 0


def test_a_stop_that_comes_just_before_the_link_drains_its_wakeups_still_ends_it_at_once(tmp_path, monkeypatch):
    """The stop's wake-up byte may be drained in the same loop turn that read the flag as unset: the
    flag must be read after the drain, or the link sleeps a whole poll interval (here ten minutes)."""
    drain = StreamingClient._drain_wakeups
    stopped = threading.Event()

    def stop_arrives_now(self):  # the other thread's stop lands between the loop's check and its drain
        if stopped.is_set() and not self._stop.is_set():
            self._stop.set()
            self._wake()
        drain(self)

    monkeypatch.setattr(StreamingClient, "_drain_wakeups", stop_arrives_now)
    with serving() as server:
        config = client_config(server, tmp_path, heartbeat_interval_s=1200.0, server_timeout_s=1200.0)
        link = StreamingClient(config, poll_interval_ms=600_000).start()
        assert link.wait_connected(10)
        stopped.set()
        link._wake()  # one more turn of the loop, in which the stop lands
        thread = link._thread
        assert thread is not None
        thread.join(5.0)
        assert not thread.is_alive()
        link.stop(timeout_s=1)


def test_a_submit_and_a_stop_wake_the_idle_link_thread(tmp_path, caplog):
    """Between its timers the link thread sleeps in its poll; a submitted segment and ``stop`` wake it
    there. Here its timers are a minute apart, so a link that waited for them would neither send the
    segment within the flush's timeout nor stop within stop's."""
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        config = client_config(server, tmp_path, heartbeat_interval_s=120.0, server_timeout_s=600.0)
        link = StreamingClient(config, image_encoding=ImageEncoding("png"), poll_interval_ms=600_000).start()
        try:
            assert link.wait_connected(10)
            time.sleep(0.3)  # the hello's answer is in: the thread is asleep in its poll now
            assert link.submit_steps(episode_id=5, steps=make_steps(3))
            assert link.flush(10), link.stats()
            assert list(ingest.stored) == [("so101-a", 5, 0)]
        finally:
            with caplog.at_level(logging.ERROR):
                link.stop(timeout_s=10)
        assert "did not stop" not in caplog.text


def test_a_long_spool_is_sent_oldest_first_within_the_in_flight_window(tmp_path):
    """After an outage the spool holds many segments: the link sends the oldest ``max_in_flight``, and
    the next one only for an ack, in spool order."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    config = ClientConfig(robot_id="so101-a", router_endpoint=f"tcp://127.0.0.1:{port}", pub_endpoint=None,
                          spool_dir=tmp_path, max_in_flight=3, **FAST)
    client = ZmqClient(config)
    try:
        for seq in range(20):  # spooled while no learner answers: nothing is sent before a hello_ok
            client.send_segment(encode_segment("so101-a", 9, seq, make_steps(1, seq)))
        received: list[int] = []
        robot: list[bytes] = []  # its routing id, from its hello

        def serve() -> None:
            while router.poll(0):
                identity, *frames = router.recv_multipart()
                msg = decode_message(frames)
                if isinstance(msg, Hello):
                    robot[:] = [identity]
                    router.send_multipart([identity, *encode_message(HelloOk(
                        server_id="fake", config_hash="", latest_version=-1, heartbeat_interval_s=1.0,
                        max_message_bytes=1 << 26))])
                elif isinstance(msg, Segment):
                    received.append(msg.seq)

        def settle() -> None:  # until nothing more arrives for a while
            quiet_until = time.monotonic() + 0.3
            while time.monotonic() < quiet_until:
                before = len(received)
                client.poll(10)
                serve()
                if len(received) != before:
                    quiet_until = time.monotonic() + 0.3

        assert wait_until(lambda: client.connected, timeout_s=5, tick=lambda: (client.poll(10), serve()))
        settle()
        assert received == [0, 1, 2]
        for acked in range(2):
            router.send_multipart([robot[0], *encode_message(Ack(robot_id="so101-a", episode_id=9, seq=acked,
                                                                  duplicate=False))])
        settle()
        assert received == [0, 1, 2, 3, 4]
        assert client.pending == 18
    finally:
        client.close()
        router.close(0)


def test_full_queue_is_refused_loudly_and_counted(tmp_path, caplog):
    link = StreamingClient(ClientConfig(robot_id="r", router_endpoint="tcp://127.0.0.1:9", pub_endpoint=None,
                                        spool_dir=tmp_path), queue_size=2)  # never started: nothing drains
    with caplog.at_level(logging.ERROR):
        assert link.submit_steps(1, make_steps(1)) and link.submit_steps(1, make_steps(1))
        assert not link.submit_steps(1, make_steps(1))
        assert not link.submit_steps(1, make_steps(1))
    assert link.stats()["queue_rejections"] == 2
    assert "streaming queue full" in caplog.text and "NOT taken" in caplog.text


def test_unacked_segments_are_resent_after_restart_and_deduplicated(tmp_path):
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        first = ZmqClient(client_config(server, tmp_path))
        assert wait_until(lambda: first.connected, tick=lambda: first.poll(10))
        for seq in range(3):
            first.send_segment(encode_segment("so101-a", 5, seq, make_steps(2)))
        assert wait_until(lambda: len(ingest.stored) == 3)  # stored, but the acks are never read:
        first.close()  # the edge "crashes" with three unacked segments in its spool

        second = ZmqClient(client_config(server, tmp_path))  # restart on the same spool
        assert second.pending == 3
        assert wait_until(lambda: second.pending == 0, tick=lambda: second.poll(10))
        second.close()
    assert ingest.received == 6 and len(ingest.stored) == 3  # each segment stored exactly once
    assert second.stats.duplicate_acks == 3


def test_segments_spooled_while_the_learner_is_down_arrive_when_it_comes_back(tmp_path):
    with serving() as probe:
        endpoint = probe.router_endpoint  # a free port, then released
    config = ClientConfig(robot_id="so101-a", router_endpoint=endpoint, pub_endpoint=None, spool_dir=tmp_path, **FAST)
    client = ZmqClient(config)
    for seq in range(2):
        client.send_segment(encode_segment("so101-a", 1, seq, make_steps(1)))
    for _ in range(5):
        client.poll(10)
    assert not client.connected and client.pending == 2
    ingest = MemoryIngest()
    with serving(ServerConfig(router_endpoint=endpoint), ingest):
        assert wait_until(lambda: client.pending == 0, tick=lambda: client.poll(10))
    assert sorted(ingest.stored) == [("so101-a", 1, 0), ("so101-a", 1, 1)]
    # The learner restarts (and forgets every session) while the robot is connected.
    client.send_segment(encode_segment("so101-a", 1, 2, make_steps(1)))
    with serving(ServerConfig(router_endpoint=endpoint), ingest):
        assert wait_until(lambda: client.pending == 0, tick=lambda: client.poll(10))
    client.close()
    assert ("so101-a", 1, 2) in ingest.stored


def test_a_full_spool_holds_new_segments_back_keeps_the_link_alive_and_loses_none(tmp_path, caplog):
    """The learner is away and the spool reaches its bound: later segments wait in memory (said once),
    the link thread lives on, and once the learner is back every segment arrives exactly once."""
    with serving() as probe:
        endpoint = probe.router_endpoint  # a free port, then released
    one = len(b"".join(bytes(f) for f in encode_message(encode_segment("so101-a", 1, 0, make_steps(2)))))
    config = ClientConfig(robot_id="so101-a", router_endpoint=endpoint, pub_endpoint=None, spool_dir=tmp_path,
                          spool_max_bytes=int(2.5 * (one + 64)), **FAST)
    with caplog.at_level(logging.ERROR), StreamingClient(config) as link:
        for _ in range(6):
            assert link.submit_steps(1, make_steps(2))
        assert wait_until(lambda: link.stats().get("pending") == 2, timeout_s=5)
        time.sleep(0.3)  # several retries of the held segment
        assert link.stats()["pending"] == 2 and link._thread.is_alive()
        assert sum("cannot spool segment" in r.message for r in caplog.records) == 1
        ingest = MemoryIngest()
        with serving(ServerConfig(router_endpoint=endpoint), ingest):
            assert link.flush(20), link.stats()
    assert sorted(ingest.stored) == [("so101-a", 1, seq) for seq in range(6)]


def test_config_hash_mismatch_is_refused_with_a_clear_error(tmp_path, caplog):
    with serving(ServerConfig(config_hash="learner-cfg")) as server:
        client = ZmqClient(client_config(server, tmp_path, config_hash="edge-cfg"))
        with caplog.at_level(logging.ERROR):
            assert wait_until(lambda: client.stats.errors_received > 0, timeout_s=5, tick=lambda: client.poll(10))
        assert not client.connected
        assert "config_mismatch" in caplog.text and "learner-cfg" in caplog.text  # the learner's own log
        assert "edge-cfg" in client.refusal and "learner-cfg" not in client.refusal  # nothing told to a client
        client.close()


def test_heartbeats_report_the_policy_version_in_use(tmp_path):
    with serving() as server, StreamingClient(client_config(server, tmp_path)) as link:
        link.set_policy_version(7)
        assert wait_until(lambda: [p.policy_version for p in server.peers()] == [7], timeout_s=5)
        assert server.peers()[0].robot_id == "so101-a"


# ---------------------------------------------------------------- weights


class CorruptingBlob(WeightsBlob):
    """Flips a byte of one chunk after its sha256 was computed: corruption in transit."""

    def chunk_message(self, index: int) -> WeightsChunk:
        msg = super().chunk_message(index)
        if index == 1:
            data = msg.data.copy()
            data[0] ^= 0xFF
            msg = WeightsChunk(version=msg.version, chunk=index, sha256=msg.sha256, data=data)
        return msg


def test_weights_are_announced_fetched_in_chunks_and_verified(tmp_path):
    received: list[tuple[WeightsAnnounce, bytes]] = []
    data = os.urandom(50_000)
    with (serving() as server,
          StreamingClient(client_config(server, tmp_path), on_weights=lambda a, b: received.append((a, b))) as link):
        assert link.wait_connected(5)
        server.publish_weights(WeightsBlob(version=3, data=data, config_hash="", chunk_size=4096))
        assert wait_until(lambda: len(received) == 1)
        assert link.stats()["weights_received"] == 1
    announce, payload = received[0]
    assert announce.version == 3 and announce.num_chunks == 13 and payload == data


def test_a_curve_robot_gets_announcements_on_the_weights_socket(tmp_path):
    """With CURVE the handshake itself is inbound on the PUB: a size limit meant for subscriptions
    must leave it through (announcements published after the hello travel only on the PUB)."""
    keys = tmp_path / "keys"
    generate_keypair(keys, "learner")
    generate_keypair(keys / "robots", "so101-a")
    received: list[int] = []
    curve = ClientCurve.from_files(keys / "robots" / "so101-a.key_secret", keys / "learner.key")
    with (serving(ServerConfig(curve=ServerCurve.from_files(keys / "learner.key_secret", keys / "robots"))) as server,
          StreamingClient(client_config(server, tmp_path / "a", curve=curve),
                          on_weights=lambda a, b: received.append(a.version)) as link):
        assert link.wait_connected(5)
        time.sleep(0.5)  # subscribed
        server.publish_weights(WeightsBlob(version=4, data=b"w" * 100, config_hash=""))
        assert wait_until(lambda: received == [4], timeout_s=10)


def test_publishing_wakes_a_serving_loop_that_is_waiting_for_requests():
    """The announcement goes out when the weights are published, not when the serving loop's poll
    next times out (a minute here; the learner's loop polls every 50 ms, which a swap used to wait)."""
    server = ZmqServer(ServerConfig(config_hash="", announce_interval_s=0.01))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(server.pub_endpoint)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            server.serve_once(60_000)

    thread = threading.Thread(target=serve, daemon=True)
    try:
        server.publish_weights(WeightsBlob(version=1, data=b"x" * 10, config_hash=""))
        # Re-announced every 10 ms until the subscriber has joined (PUB drops what it sends before).
        assert wait_until(lambda: sub.poll(0), tick=lambda: server.serve_once(10)), "no first announcement"
        thread.start()
        time.sleep(0.3)  # the loop is in its minute-long poll now
        while sub.poll(0):
            sub.recv_multipart()
        server.publish_weights(WeightsBlob(version=2, data=b"y" * 10, config_hash=""))
        assert sub.poll(20_000), "the announcement waited for the poll timeout"
        assert decode_message(sub.recv_multipart()).version == 2
    finally:
        stop.set()
        server.publish_weights(WeightsBlob(version=3, data=b"z", config_hash=""))  # wakes the loop to stop
        thread.join(10)
        sub.close(0)
        server.close()


def test_a_corrupted_chunk_is_refused_and_the_weights_never_delivered(tmp_path):
    received: list[bytes] = []
    with serving() as server:
        server.publish_weights(CorruptingBlob(version=1, data=os.urandom(10_000), config_hash="", chunk_size=4096))
        client = ZmqClient(client_config(server, tmp_path, weights_chunk_retries=2),
                           on_weights=lambda a, b: received.append(b))
        assert wait_until(lambda: client.stats.weights_rejected >= 1, tick=lambda: client.poll(10))
        client.close()
    assert received == []
    assert client.stats.corrupt_chunks == 3  # the first try and two retries, all refused


def test_weights_for_another_config_are_ignored(tmp_path):
    received: list[bytes] = []
    with serving() as server:
        client = ZmqClient(client_config(server, tmp_path, config_hash="cfg-a"),
                           on_weights=lambda a, b: received.append(b))
        server.publish_weights(WeightsBlob(version=1, data=b"x" * 100, config_hash="cfg-b"))
        assert wait_until(lambda: client.latest_announce is not None, tick=lambda: client.poll(10))
        for _ in range(10):
            client.poll(10)
        client.close()
    assert received == [] and client.stats.weights_received == 0


# ---------------------------------------------------------------- CURVE


def test_curve_admits_listed_keys_and_refuses_others(tmp_path):
    keys = tmp_path / "keys"
    generate_keypair(keys, "learner")
    generate_keypair(keys / "robots", "so101-a")
    generate_keypair(keys / "robots", "so101-b")
    generate_keypair(tmp_path / "strangers", "robot-x")
    server_curve = ServerCurve.from_files(keys / "learner.key_secret", keys / "robots")
    with serving(ServerConfig(curve=server_curve)) as server:
        good = ZmqClient(client_config(server, tmp_path / "a", curve=ClientCurve.from_files(
            keys / "robots" / "so101-a.key_secret", keys / "learner.key")))
        bad = ZmqClient(client_config(server, tmp_path / "x", robot_id="robot-x", curve=ClientCurve.from_files(
            tmp_path / "strangers" / "robot-x.key_secret", keys / "learner.key")))
        plain = ZmqClient(client_config(server, tmp_path / "p", robot_id="robot-p"))
        # A listed key, but robot b's: it must not write episodes as robot a.
        impostor = ZmqClient(client_config(server, tmp_path / "i", robot_id="so101-a", curve=ClientCurve.from_files(
            keys / "robots" / "so101-b.key_secret", keys / "learner.key")))

        def tick() -> None:
            for c in (good, bad, plain, impostor):
                c.poll(5)

        assert wait_until(lambda: good.connected, timeout_s=5, tick=tick)
        good.send_segment(encode_segment(good.config.robot_id, 1, 0, make_steps(1)))
        assert wait_until(lambda: good.pending == 0, timeout_s=5, tick=tick)
        assert wait_until(lambda: impostor.stats.errors_received > 0, timeout_s=5, tick=tick)
        wait_until(lambda: False, timeout_s=1.0, tick=tick)  # give the refused ones a fair chance
        assert not bad.connected and not plain.connected and not impostor.connected
        assert [p.robot_id for p in server.peers()] == ["so101-a"]
        assert len(server.peers()) == 1  # the impostor did not join under a's name
        for c in (good, bad, plain, impostor):
            c.close()


def test_a_robot_with_a_valid_key_cannot_write_on_another_robots_session(tmp_path):
    """Robot b holds a listed key of its own and robot a's routing id (it sets ROUTING_ID itself, and
    ROUTER_HANDOVER hands it a's session): its segment labelled a must be refused, not stored as a's."""
    keys = tmp_path / "keys"
    generate_keypair(keys, "learner")
    generate_keypair(keys / "robots", "so101-a")
    generate_keypair(keys / "robots", "so101-b")
    ingest = MemoryIngest()
    with serving(ServerConfig(curve=ServerCurve.from_files(keys / "learner.key_secret", keys / "robots")),
                 ingest) as server:
        a = ZmqClient(client_config(server, tmp_path / "a", curve=ClientCurve.from_files(
            keys / "robots" / "so101-a.key_secret", keys / "learner.key")))
        assert wait_until(lambda: a.connected, timeout_s=5, tick=lambda: a.poll(5))
        ctx = zmq.Context()
        attacker = dealer_on_routing_id(ctx, a._routing_id, keys / "robots" / "so101-b.key_secret",
                                     keys / "learner.key", server.router_endpoint)
        try:
            forged = encode_segment("so101-a", 7, 0, make_steps(3))
            attacker.send_multipart(encode_message(forged), copy=False)
            reply = None
            while not isinstance(reply, Error):  # a heartbeat to a's session may reach the taker first
                assert attacker.poll(5000), "the learner did not answer the forged segment"
                reply = decode_message(attacker.recv_multipart())
                assert isinstance(reply, Error | Heartbeat), reply
        finally:
            attacker.close()
            ctx.term()
        assert isinstance(reply, Error) and reply.code == "identity_mismatch"
        assert ("so101-a", 7, 0) not in ingest.stored and ingest.received == 0
        assert server.counters["impersonations_refused"] == 1
        a.close()


def test_logs_name_a_connection_by_its_robot_id_and_never_print_its_random_part():
    assert who(b"so101-a/0123456789abcdef0123456789abcdef") == "'so101-a'"
    assert who(b"\x00\x8bE\x12\x07") == "<a 5-byte id>"  # libzmq's own ids: nothing to name


def test_curve_keys_are_bound_to_the_robot_id_their_file_names(tmp_path):
    generate_keypair(tmp_path, "so101-a")
    generate_keypair(tmp_path, "so101-b")
    generate_keypair(tmp_path, "learner")
    curve = ServerCurve.from_files(tmp_path / "learner.key_secret",
                                   [tmp_path / "so101-a.key", tmp_path / "so101-b.key"])
    key_a = next(k for k, name in curve.client_names.items() if name == "so101-a")
    assert curve.robot_id_refusal(key_a.decode(), "so101-a") is None
    assert "cannot speak for robot 'so101-b'" in curve.robot_id_refusal(key_a.decode(), "so101-b")
    assert "no authenticated" in curve.robot_id_refusal(None, "so101-a")
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "so101-c.key").write_bytes((tmp_path / "so101-a.key").read_bytes())
    with pytest.raises(ValueError, match="same public key"):
        ServerCurve.from_files(tmp_path / "learner.key_secret",
                               [tmp_path / "so101-a.key", tmp_path / "copy" / "so101-c.key"])


# ---------------------------------------------------------------- many robots


def test_four_robots_stream_at_once(tmp_path):
    ingest = MemoryIngest()
    with serving(handlers=ingest) as server:
        links = [StreamingClient(client_config(server, tmp_path / f"r{i}", robot_id=f"robot-{i}")).start()
                 for i in range(4)]
        try:
            for seq in range(5):
                for link in links:
                    assert link.submit_steps(episode_id=1, steps=make_steps(3, 3 * seq))
            assert all(link.flush(15) for link in links)
        finally:
            for link in links:
                link.stop()
    assert len(ingest.stored) == 20
    assert {robot for robot, _, _ in ingest.stored} == {f"robot-{i}" for i in range(4)}
    assert len({p.robot_id for p in server.peers()}) == 4
    # Robots streaming as robots do come nowhere near the per-sender limits.
    assert not any(server.counters[c] for c in ("messages_over_rate", "messages_ignored", "senders_ignored",
                                                "sessions_replaced", "hellos_refused_full", "segments_deferred"))


# ---------------------------------------------------------------- per-sender limits


@contextmanager
def dealer(server: ZmqServer) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.router_endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def frames_of(msg) -> list[bytes]:
    return [bytes(f) for f in encode_message(msg)]


def hello_frames(robot_id: str) -> list[bytes]:
    return frames_of(Hello(robot_id=robot_id, config_hash="", policy_version=-1))


def heartbeat_frames() -> list[bytes]:
    return frames_of(Heartbeat(sender="x", policy_version=-1, time_s=0.0, stats={}))


def test_a_peer_without_a_session_is_told_only_a_generic_code():
    import msgpack

    unknown = hello_frames("probe")
    envelope = msgpack.unpackb(unknown[0], raw=False)
    envelope["type"] = "launch"
    unknown[0] = msgpack.packb(envelope, use_bin_type=True)
    old = msgpack.unpackb(hello_frames("probe")[0], raw=False)
    old["v"] = 1
    with serving() as server, dealer(server) as sock:
        stranger = _request(sock, unknown)
        assert (stranger.code, stranger.message) == ("bad_message", "refused")  # not the message catalogue
        versions = _request(sock, [msgpack.packb(old, use_bin_type=True)])
        assert (versions.code, versions.message) == ("version_mismatch", "refused")  # the edge backs off on it
        assert _request(sock, heartbeat_frames()).code == "hello_required"
        assert _request(sock, hello_frames("probe")).TYPE == "hello_ok"
        known = _request(sock, unknown)  # a robot the learner knows is told what was wrong
        assert known.code == "unknown_type" and "heartbeat" in known.message


def test_a_sender_that_keeps_sending_garbage_is_ignored_for_a_cooloff_said_once(tmp_path, caplog):
    limits = PeerLimits(max_refusals=5, refusal_window_s=60.0, cooloff_s=1.0)
    ingest = MemoryIngest()
    with (caplog.at_level(logging.ERROR), serving(ServerConfig(peer_limits=limits), ingest) as server,
          StreamingClient(client_config(server, tmp_path)) as robot, dealer(server) as garbage):
        assert robot.wait_connected(5)
        assert _request(garbage, hello_frames("broken")).TYPE == "hello_ok"
        for _ in range(6):  # the sixth refusal within the window: ignored from now on
            assert _request(garbage, [b"\x00garbage"]).code == "bad_message"
        assert [p.robot_id for p in server.peers()] == ["so101-a"]  # its session is forgotten
        for _ in range(20):
            garbage.send_multipart([b"\x00garbage"])
        garbage.send_multipart(hello_frames("broken"))
        assert wait_until(lambda: server.counters["messages_ignored"] == 21, timeout_s=5)
        assert not garbage.poll(0)  # nothing was answered while it is ignored
        assert robot.submit_steps(1, make_steps(2), episode_done=True) and robot.flush(5)  # robots go on
        assert [r.message.startswith("ignoring robot 'broken'") for r in caplog.records if "ignoring" in r.message] \
            == [True]
        assert server.counters["senders_ignored"] == 1
        # After the cool-off it is heard again.
        reply = None
        deadline = time.monotonic() + 10
        while reply is None and time.monotonic() < deadline:
            garbage.send_multipart(hello_frames("broken"))
            if garbage.poll(200):
                reply = decode_message(garbage.recv_multipart())
        assert reply is not None and reply.TYPE == "hello_ok"
    assert ("so101-a", 1, 0) in ingest.stored


def test_a_sender_over_its_rate_is_dropped_unread_and_said_once(caplog):
    limits = PeerLimits(max_messages_per_s=0.01, burst_messages=10)
    with caplog.at_level(logging.WARNING), serving(ServerConfig(peer_limits=limits)) as server, \
            dealer(server) as sock:
        assert _request(sock, hello_frames("chatty")).TYPE == "hello_ok"
        for _ in range(30):
            sock.send_multipart(heartbeat_frames())
        assert wait_until(lambda: server.counters["messages"] + server.counters["messages_over_rate"] == 31)
        answered = 0
        while sock.poll(200):
            sock.recv_multipart()
            answered += 1
    assert answered == 9 and server.counters["messages_over_rate"] == 21  # the burst, then nothing more
    assert sum("messages/s" in r.message for r in caplog.records) == 1


class BusyThenStoring(MemoryIngest):
    """Answers busy (a bound reached, a full disk) until ``accept`` is set, then stores."""

    def __init__(self) -> None:
        super().__init__()
        self.accept = threading.Event()

    def on_segment(self, peer: Peer, msg: Segment) -> Ack:
        if not self.accept.is_set():
            raise BusyError("this robot's staged bytes are at learner.store.max_staged_bytes_per_robot")
        return super().on_segment(peer, msg)


def test_a_busy_learner_is_said_once_at_the_robot_and_the_segments_go_when_it_takes_them(tmp_path, caplog):
    handler = BusyThenStoring()
    with (caplog.at_level(logging.INFO, logger="robot_rl.bridges.zmq.client"), serving(handlers=handler) as server,
          StreamingClient(client_config(server, tmp_path, ack_timeout_s=0.2)) as link):
        assert link.wait_connected(5)
        assert link.submit_steps(0, make_steps(3), episode_done=True)
        assert wait_until(lambda: link.stats()["busy_replies"] >= 3)  # re-sent at every ack timeout
        handler.accept.set()
        assert link.flush(10)
    assert list(handler.stored) == [("so101-a", 0, 0)]
    said = [r.getMessage() for r in caplog.records if "busy" in r.getMessage()]
    assert len(said) == 1 and "max_staged_bytes_per_robot" in said[0]  # once, not per re-send
    assert "takes segments again" in caplog.text


def test_a_robot_holds_a_bounded_number_of_sessions_and_a_new_hello_replaces_its_oldest():
    limits = PeerLimits(max_sessions_per_robot=2, max_sessions=3)
    with serving(ServerConfig(peer_limits=limits)) as server, dealer(server) as first, dealer(server) as second, \
            dealer(server) as third, dealer(server) as other, dealer(server) as one_more:
        for sock in (first, second, third):  # an edge restarted twice within peer_timeout_s
            assert _request(sock, hello_frames("so101-a")).TYPE == "hello_ok"
        assert sorted(p.robot_id for p in server.peers()) == ["so101-a", "so101-a"]
        assert _request(first, heartbeat_frames()).code == "hello_required"  # the oldest went
        assert _request(third, heartbeat_frames()).TYPE == "heartbeat"
        assert _request(other, hello_frames("so101-b")).TYPE == "hello_ok"
        full = _request(one_more, hello_frames("so101-c"))  # three sessions in all: no room for a fourth robot
        assert full.code == "busy" and "robots" in full.message
        assert server.counters["sessions_replaced"] == 1 and server.counters["hellos_refused_full"] == 1
        assert _request(second, hello_frames("so101-a")).TYPE == "hello_ok"  # its own robot still gets in


# ---------------------------------------------------------------- fuzzed live server


@pytest.fixture(scope="module")
def live_server():
    with serving() as server:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(server.router_endpoint)
        yield server, sock
        sock.close()
        ctx.term()


def _request(sock: zmq.Socket, frames: list[bytes]) -> object:
    sock.send_multipart(frames)
    assert sock.poll(3000), "the server stopped answering"
    return decode_message(sock.recv_multipart())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=3))
def test_fuzzed_frames_get_an_error_reply_and_the_server_keeps_serving(live_server, frames):
    _, sock = live_server
    reply = _request(sock, frames)
    assert isinstance(reply, Error) and reply.message


def test_after_fuzzing_the_server_still_serves_valid_requests(live_server):
    server, sock = live_server
    hello = Hello(robot_id="fuzzer", config_hash="", policy_version=-1)
    reply = _request(sock, [bytes(f) for f in encode_message(hello)])
    assert reply.TYPE == "hello_ok"
    oversized = encode_message(WeightsChunk(version=1, chunk=0, sha256="", data=np.zeros(1000, np.uint8)))
    server.config.limits = type(server.config.limits)(max_message_bytes=2000, max_envelope_bytes=500)
    try:
        reply = _request(sock, [bytes(oversized[0]), bytes(oversized[1]), bytes(oversized[1])])
    finally:
        server.config.limits = type(server.config.limits)()
    assert isinstance(reply, Error) and reply.code in ("too_large", "bad_message")


def test_an_array_shape_numpy_cannot_build_is_refused_and_the_server_keeps_serving(live_server):
    """[0, 2**63] passes a byte count (0 bytes) but no numpy array has it: a clear error reply,
    not an exception in the serving thread."""
    import msgpack

    server, sock = live_server
    frames = [bytes(f) for f in encode_message(WeightsChunk(version=1, chunk=0, sha256="",
                                                            data=np.zeros(0, np.uint8)))]
    envelope = msgpack.unpackb(frames[0], raw=False)
    envelope["arrays"][0]["shape"] = [0, 2**63]
    frames[0] = msgpack.packb(envelope, use_bin_type=True)
    reply = _request(sock, frames)
    assert isinstance(reply, Error) and "shape" in reply.message
    hello = Hello(robot_id="after-the-shape", config_hash="", policy_version=-1)
    assert _request(sock, [bytes(f) for f in encode_message(hello)]).TYPE == "hello_ok"


BIG_SUBSCRIBER = """
import sys, zmq, zmq.utils.monitor
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
sub.setsockopt(zmq.SUBSCRIBE, b"x" * (1 << 20))
sub.connect(sys.argv[1])
if monitor.poll(10_000) and zmq.utils.monitor.recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
    print("disconnected", flush=True)
import os
os._exit(0)  # libzmq 4.3.5 crashes this side (the subscriber's) when it closes after such a disconnect
"""


def test_a_subscription_longer_than_any_robot_sends_is_disconnected_and_announcements_go_on():
    """Robots subscribe to b"": a 1 MiB subscription is only memory in the PUB's topic tree (~88 MB
    of it), so libzmq disconnects the peer that sends one (MAX_SUBSCRIPTION_BYTES); the other
    subscribers get every announcement."""
    import subprocess
    import sys

    with serving() as server:
        ctx = zmq.Context()
        normal = ctx.socket(zmq.SUB)
        normal.linger = 0
        normal.setsockopt(zmq.SUBSCRIBE, b"")
        normal.connect(server.pub_endpoint)
        try:
            big = subprocess.run([sys.executable, "-c", BIG_SUBSCRIBER, server.pub_endpoint], capture_output=True,
                                 text=True, timeout=60)
            assert "disconnected" in big.stdout, big.stdout + big.stderr
            server.publish_weights(WeightsBlob(version=5, data=b"z" * 10, config_hash=""))
            assert normal.poll(5000)
            announce = decode_message(normal.recv_multipart())
            assert isinstance(announce, WeightsAnnounce) and announce.version == 5
        finally:
            normal.close()
            ctx.term()


class BusyIngest(MemoryIngest):
    """Refuses the first segments as a learner past a bound (or on a full disk) does, then stores them."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy

    def on_segment(self, peer: Peer, msg: Segment) -> Ack:
        if self.busy > 0:
            self.busy -= 1
            raise BusyError("the learner cannot take this segment now")
        return super().on_segment(peer, msg)


def test_a_learner_that_cannot_take_a_segment_now_is_not_held_against_the_robot(tmp_path):
    """BusyError is 'rejected' on the wire: the robot keeps the segment and re-sends it; it never counts
    as a refused message, even with no refusals allowed at all."""
    ingest = BusyIngest(busy=3)
    with serving(ServerConfig(peer_limits=PeerLimits(max_refusals=0)), ingest) as server, \
            StreamingClient(client_config(server, tmp_path, ack_timeout_s=0.2)) as link:
        assert link.wait_connected(5)
        assert link.submit_steps(1, make_steps(2), episode_done=True)
        assert link.flush(20), link.stats()
        assert link.stats()["errors_received"] == 3
    assert list(ingest.stored) == [("so101-a", 1, 0)]
    assert server.counters["segments_deferred"] == 3 and server.counters["senders_ignored"] == 0
