"""What the learner keeps per peer is bounded: ids a connection stops using are forgotten after the
peer timeout, and a routing id stays with the CURVE key that first said hello on it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from robot_rl.bridges.zmq import (
    ClientCurve,
    Error,
    Hello,
    HelloOk,
    Peer,
    ServerConfig,
    ServerCurve,
    WeightsAnnounce,
    WeightsBlob,
    ZmqClient,
    ZmqServer,
    decode_message,
    encode_message,
    generate_keypair,
)
from tests.zmq_helpers import MemoryIngest, client_config, dealer_on_routing_id, serving, wait_until

HELLOS = 2000


class Roster(MemoryIngest):
    """The robots the learner believes connected, kept the way its service keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: set[str] = set()

    def on_hello(self, peer: Peer, msg: Hello) -> None:
        self.connected.add(msg.robot_id)

    def on_peer_lost(self, peer: Peer) -> None:
        self.connected.discard(peer.robot_id)


def test_ids_a_connection_said_hello_under_are_forgotten_after_the_peer_timeout(tmp_path):
    """One connection says hello 2,000 times under new ids while a robot streams: once the peer
    timeout has passed, the learner lists only the live robot, never the ids left behind."""
    roster = Roster()
    with serving(ServerConfig(peer_timeout_s=1.0), roster) as server:
        live = ZmqClient(client_config(server, tmp_path, robot_id="so101-live"))
        ctx = zmq.Context()
        flood = ctx.socket(zmq.DEALER)
        flood.linger = 0
        flood.connect(server.router_endpoint)
        try:
            assert wait_until(lambda: live.connected, timeout_s=5, tick=lambda: live.poll(5))
            for i in range(HELLOS):
                flood.send_multipart(encode_message(Hello(robot_id=f"ghost-{i:05d}", config_hash="",
                                                          policy_version=-1)))
            answered = 0
            while answered < HELLOS and flood.poll(5000):
                answered += isinstance(decode_message(flood.recv_multipart()), HelloOk)
                live.poll(0)
            assert answered == HELLOS
            assert wait_until(lambda: roster.connected == {"so101-live"}, timeout_s=5, tick=lambda: live.poll(20)), \
                sorted(roster.connected)[:5]
            assert [p.robot_id for p in server.peers()] == ["so101-live"]
        finally:
            flood.close()
            ctx.term()
            live.close()


def test_a_routing_id_stays_with_the_curve_key_that_said_hello_on_it(tmp_path):
    """Robot b holds a listed key of its own and robot a's routing id: its hello (as itself) on a's
    routing id is refused, a's session keeps a's name and key, and what the learner then says to a
    (a pin) does not go to b's connection."""
    keys = tmp_path / "keys"
    generate_keypair(keys, "learner")
    for name in ("so101-a", "so101-b"):
        generate_keypair(keys / "robots", name)
    with serving(ServerConfig(curve=ServerCurve.from_files(keys / "learner.key_secret", keys / "robots"))) as server:
        a = ZmqClient(client_config(server, tmp_path / "a", curve=ClientCurve.from_files(
            keys / "robots" / "so101-a.key_secret", keys / "learner.key")))
        assert wait_until(lambda: a.connected, timeout_s=5, tick=lambda: a.poll(5))
        a_key = server.peers()[0].key
        ctx = zmq.Context()
        taker = dealer_on_routing_id(ctx, a._routing_id, keys / "robots" / "so101-b.key_secret",
                                     keys / "learner.key", server.router_endpoint)
        try:
            server.publish_weights(WeightsBlob(version=1, data=b"w" * 100, config_hash=""))
            taker.send_multipart(encode_message(Hello(robot_id="so101-b", config_hash="", policy_version=-1)))
            replies = []
            while taker.poll(1500):
                replies.append(decode_message(taker.recv_multipart()))
            server.pin(1, "so101-a")
            while taker.poll(1500):
                replies.append(decode_message(taker.recv_multipart()))
        finally:
            taker.close()
            ctx.term()
        assert not any(isinstance(r, HelloOk | WeightsAnnounce) for r in replies), replies
        assert any(isinstance(r, Error) and r.code == "identity_mismatch" for r in replies), replies
        assert [(p.robot_id, p.key) for p in server.peers()] == [("so101-a", a_key)]
        assert server.counters["impersonations_refused"] >= 1
        a.close()


@contextmanager
def robot_and_flooder(server: ZmqServer, spool: Path) -> Iterator[tuple[ZmqClient, zmq.Socket, Callable[[], None]]]:
    """A robot's link and a bare SUB on the weights socket, with one tick that polls both (a SUB that
    is used sends its topics again after a reconnect); the robot is connected when the block starts."""
    robot = ZmqClient(client_config(server, spool, robot_id="so101-a", fetch_weights=False))
    ctx = zmq.Context()
    flood = ctx.socket(zmq.SUB)
    flood.linger = 0
    flood.connect(server.pub_endpoint)

    def tick() -> None:
        robot.poll(5)
        flood.poll(0)

    try:
        assert wait_until(lambda: robot.connected, timeout_s=5, tick=tick)
        yield robot, flood, tick
    finally:
        flood.close()
        ctx.term()
        robot.close()


def test_a_flood_of_subscriptions_no_robot_sends_reopens_the_weights_socket_and_robots_come_back(tmp_path, caplog):
    """A peer subscribes to 1,000 topics of 304 bytes on the weights socket, and again each time it
    reconnects: past its bound the learner opens the socket anew (said once), again and again, and a
    robot's subscription still gets the announcement of a version published while the flood goes on."""
    bound = 100
    with (serving(ServerConfig(max_foreign_subscriptions=bound, announce_interval_s=0.1)) as server,
          robot_and_flooder(server, tmp_path) as (robot, flood, tick)):
        with caplog.at_level(logging.WARNING):
            for i in range(1000):
                flood.setsockopt(zmq.SUBSCRIBE, b"%04d" % i + bytes(300))
            assert wait_until(lambda: server.counters["weights_socket_reopened"] >= 3, timeout_s=10, tick=tick), \
                server.counters
            server.publish_weights(WeightsBlob(version=7, data=b"w" * 100, config_hash=""))
            heard = robot.latest_announce

            def announced_on_the_weights_socket() -> bool:
                tick()
                return robot.latest_announce is not heard and robot.latest_announce is not None \
                    and robot.latest_announce.version == 7
            assert wait_until(announced_on_the_weights_socket, timeout_s=10)
        assert len([r for r in caplog.records if "opening it anew" in r.getMessage()]) == 1


def test_topics_longer_than_a_robots_handshake_end_the_connection_before_they_reach_the_topic_tree(tmp_path):
    """A peer subscribes to 1,000 topics of 1 KiB (a robot's longest message, its CURVE handshake, is
    276 bytes): libzmq ends its connection at the first, so the learner never counts one of them,
    and a robot still gets the announcement of a version published after the flood."""
    with (serving(ServerConfig(announce_interval_s=0.1)) as server,
          robot_and_flooder(server, tmp_path) as (robot, flood, tick)):
        for i in range(1000):
            flood.setsockopt(zmq.SUBSCRIBE, b"%04d" % i + bytes(1020))
        wait_until(lambda: False, timeout_s=1, tick=tick)  # the flood reaches the learner, reconnecting
        server.publish_weights(WeightsBlob(version=3, data=b"w" * 100, config_hash=""))
        assert wait_until(lambda: robot.latest_announce is not None and robot.latest_announce.version == 3,
                          timeout_s=10, tick=tick)
        assert server.counters["subscriptions_refused"] == 0, server.counters
        assert server.counters["weights_socket_reopened"] == 0, server.counters
