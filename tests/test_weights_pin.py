"""Pinning robots to a weights version on the wire: a pinned robot loads that version even when it
is older, ignores newer announcements until released, and a robot that says hello later is told its
pin at once; the pinned version stays served while newer ones push older ones out."""

from __future__ import annotations

import os

import pytest

from robot_rl.bridges.zmq import ServerConfig, StreamingClient, WeightsBlob
from tests.test_zmq_link import client_config, serving, wait_until

pytestmark = pytest.mark.timeout(60)


def blob(version: int) -> WeightsBlob:
    return WeightsBlob(version=version, data=os.urandom(8_000) + bytes([version]), config_hash="", chunk_size=4096)


def test_a_pinned_robot_loads_the_older_version_ignores_newer_ones_until_released(tmp_path):
    got: dict[str, list[int]] = {"a": [], "b": []}
    with serving(ServerConfig(keep_weight_versions=2, announce_interval_s=0.05)) as server:
        links = {name: StreamingClient(client_config(server, tmp_path / name, robot_id=f"arm-{name}"),
                                       on_weights=lambda a, data, name=name: got[name].append(a.version)).start()
                 for name in ("a", "b")}
        try:
            assert all(link.wait_connected(5) for link in links.values())
            for version in (1, 2):
                server.publish_weights(blob(version))
                assert wait_until(lambda v=version: got["a"][-1:] == [v] and got["b"][-1:] == [v])
            for link in links.values():
                link.set_policy_version(2)  # the robots run v2

            server.pin(1, "arm-a")
            assert wait_until(lambda: got["a"][-1:] == [1]), got  # older, loaded anyway
            assert server.pinned_version("arm-a") == 1 and server.pinned_version("arm-b") is None
            links["a"].set_policy_version(1)
            for version in (3, 4, 5):  # a pinned version is never pushed out by newer ones
                server.publish_weights(blob(version))
            assert wait_until(lambda: got["b"][-1:] == [5]), got
            assert got["a"] == [1, 2, 1], got  # arm-a ignored 3, 4 and 5
            assert server.served_versions() == [1, 4, 5]
            with pytest.raises(ValueError, match="not served any more"):
                server.pin(2, "arm-a")

            server.pin(None, "arm-a")  # released: the newest again
            assert wait_until(lambda: got["a"][-1:] == [5]), got

            server.pin(4)  # the fleet rolled back, arm-b too
            assert wait_until(lambda: got["a"][-1:] == [4] and got["b"][-1:] == [4]), got
            links["b"].stop()  # arm-b restarts: its hello is answered with the fleet's pin
            got["b"].clear()
            links["b"] = StreamingClient(client_config(server, tmp_path / "b2", robot_id="arm-b"),
                                         on_weights=lambda a, data: got["b"].append(a.version)).start()
            assert wait_until(lambda: got["b"] == [4]), got
            server.publish_weights(blob(6))
            assert not wait_until(lambda: 6 in got["a"] + got["b"], timeout_s=1.0), got
        finally:
            for link in links.values():
                link.stop()


def test_a_recycled_buffer_is_the_next_one_of_its_size_and_no_spare_is_prepared_beside_it():
    from robot_rl.bridges.zmq.weights import SnapshotBuffers

    buffers = SnapshotBuffers()
    first = buffers.allocate(1 << 20)
    assert wait_until(lambda: buffers.spare == 1)  # prepared in the background for the next publish
    spare = buffers.allocate(1 << 20)
    assert wait_until(lambda: buffers.spare == 1)  # and the next one
    buffers.recycle(first)  # the server dropped the first version: recycling supplies buffers from now on
    assert buffers.spare == 1 and buffers.allocate(1 << 20).obj is first.obj  # one kept: the newest
    assert not wait_until(lambda: buffers.spare > 0, timeout_s=0.3)  # no spare prepared any more
    assert spare.nbytes == 1 << 20 and (buffers.fresh, buffers.reused) == (1, 2)
    assert buffers.allocate(2 << 20).nbytes == 2 << 20 and buffers.fresh == 2  # another size: fresh


def test_version_ten_whose_header_is_eight_bytes_longer_is_written_into_version_nines_buffer():
    import torch

    from robot_rl.bridges.zmq.weights import SnapshotBuffers
    from robot_rl.learner.publisher import snapshot

    policy = torch.nn.Linear(64, 64)
    buffers = SnapshotBuffers()
    v9 = snapshot(policy, 9, "hash", buffers=buffers)  # a header one byte short of a multiple of 8
    assert wait_until(lambda: buffers.spare == 1)  # the spare made meanwhile goes when v9's buffer comes back
    v9.retire()  # the server dropped v9
    v10 = snapshot(policy, 10, "hash", buffers=buffers)
    assert len(v10.data) == len(v9.data) + 8  # "10": one more byte of header, padded to 8
    assert (buffers.fresh, buffers.reused) == (1, 1) and v10.data.obj is v9.data.obj


def test_a_dropped_versions_buffer_holds_the_next_snapshot_and_served_versions_keep_their_bytes(tmp_path):
    import torch

    from robot_rl.bridges.zmq.weights import SnapshotBuffers, WeightsBlob, deserialize_tensors
    from robot_rl.learner.publisher import snapshot

    policy = torch.nn.Linear(64, 64)
    buffers = SnapshotBuffers()
    got: dict[int, dict] = {}

    def publish(server, version: int) -> WeightsBlob:
        with torch.no_grad():
            policy.weight.fill_(float(version))
        blob = snapshot(policy, version, "", buffers=buffers)
        server.publish_weights(blob)
        return blob

    with serving(ServerConfig(keep_weight_versions=2, announce_interval_s=0.05)) as server:
        link = StreamingClient(client_config(server, tmp_path / "a", robot_id="arm-a"),
                               on_weights=lambda a, data: got.__setitem__(a.version, deserialize_tensors(data))).start()
        try:
            assert link.wait_connected(5)
            blobs = {1: publish(server, 1)}
            assert wait_until(lambda: server.served_versions() == [1])
            server.pin(1, "arm-a")
            for version in (2, 3, 4, 5):  # a spare prepared meanwhile, then v2's buffer once dropped
                assert wait_until(lambda: buffers.spare == 1)
                blobs[version] = publish(server, version)
            assert (buffers.fresh, buffers.reused) == (1, 4)  # only v1 faulted in its pages while publishing
            assert wait_until(lambda: server.served_versions() == [1, 4, 5])
            for version in (1, 4, 5):  # what is served still hashes to what was announced
                assert WeightsBlob(version, blobs[version].data, "").sha256 == blobs[version].sha256
            assert wait_until(lambda: 1 in got) and float(got[1]["weight"].max()) == 1.0  # pinned: v1's bytes
            server.pin(None, "arm-a")
            assert wait_until(lambda: 5 in got), got.keys()
            assert float(got[5]["weight"].min()) == float(got[5]["weight"].max()) == 5.0
        finally:
            link.stop()


def test_a_version_delivered_before_a_pin_and_swapped_in_after_it_is_replaced_by_the_pinned_one(tmp_path):
    got: list[int] = []
    with serving(ServerConfig(keep_weight_versions=2, announce_interval_s=0.05)) as server:
        link = StreamingClient(client_config(server, tmp_path / "a", robot_id="arm-a"),
                               on_weights=lambda a, data: got.append(a.version)).start()
        try:
            assert link.wait_connected(5)
            server.publish_weights(blob(1))
            assert wait_until(lambda: got == [1])
            link.set_policy_version(1)
            server.publish_weights(blob(2))
            assert wait_until(lambda: got == [1, 2])  # handed to the loader; the robot still runs v1
            server.pin(1, "arm-a")  # v1 is in use: nothing to fetch
            assert not wait_until(lambda: len(got) > 2, timeout_s=0.5), got
            link.set_policy_version(2)  # the loader swaps in what it was handed before the pin
            assert wait_until(lambda: got == [1, 2, 1]), got
            link.set_policy_version(1)
            assert not wait_until(lambda: len(got) > 3, timeout_s=0.5), got  # back on its pin: fetched once
        finally:
            link.stop()


def test_a_pin_that_lands_while_a_publish_drops_its_version_is_refused_never_left_unserved():
    """The console pins v1 just as the serving thread publishes v2 and pushes v1 out (one version
    kept): either the pin is refused, or v1 stays served; never a robot pinned to nothing."""
    import collections
    import threading

    outcome: list[str] = []

    class PinsMidPublish(collections.OrderedDict):
        def __setitem__(self, version, value):
            super().__setitem__(version, value)
            if version == 2 and not outcome:  # v2 is in, v1 not pushed out yet: the console's pin arrives now

                def pin() -> None:
                    try:
                        server.pin(1, "arm-a")
                        outcome.append("pinned")
                    except ValueError:
                        outcome.append("refused")

                outcome.append("asked")
                console = threading.Thread(target=pin)
                console.start()
                console.join(0.5)  # a pin that has to wait for the publish finishes after it

    with serving(ServerConfig(keep_weight_versions=1, announce_interval_s=0.05)) as server:
        server.publish_weights(blob(1))
        assert wait_until(lambda: server.served_versions() == [1])
        server._weights._blobs = PinsMidPublish(server._weights._blobs)
        server.publish_weights(blob(2))
        assert wait_until(lambda: len(outcome) == 2 and 2 in server.served_versions())
        assert outcome[1] == "refused" or 1 in server.served_versions(), (outcome, server.served_versions())
        if outcome[1] == "pinned":
            assert server.pinned_version("arm-a") == 1
