"""Edge streaming glue on loopback: the control loop never waits for a link that is down or a
learner that is not there, and a weight swap lands between chunks during an episode with the
versions recorded.

On a virtual clock a sink that blocked would not make a tick late, it would stop the loop: the
episode runs under a bound on its wall time, so a hang fails the test. Lateness itself is checked
in test_edge_lateness.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import socket

import numpy as np
import pytest

from robot_rl.bridges.zmq.segments import ImageEncoding
from robot_rl.core.clock import VirtualClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.learner_link import EdgeStreamer
from robot_rl.edge.node import EdgeNode
from robot_rl.learner.service import LearnerService
from tests.edge_fakes import EncodingPolicy, KinematicRobot
from tests.learner_helpers import (
    IMG,
    client_config,
    finishes_within,
    learner_config,
    stored_episode_frames,
    tiny_policy,
    wait_for,
)


class CameraRobot(KinematicRobot):
    """The kinematic test arm with a 16x16 front camera whose pixels number its reads (1, 2, ...:
    red the low byte, green the high one), so a stored frame says which read, hence which tick, it was."""

    def __init__(self) -> None:
        super().__init__(num_joints=6, fps=30)
        self.reads = 0

    def get_observation(self):
        self.reads += 1
        image = np.zeros((IMG, IMG, 3), np.uint8)
        image[..., 0], image[..., 1] = self.reads % 256, self.reads // 256
        return {"images": {"front": image}, "state": self.state.copy()}


def read_number(image: np.ndarray) -> int:
    """The read a ``CameraRobot`` frame came from."""
    return int(image[0, 0, 0]) + 256 * int(image[0, 0, 1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_control_loop_never_waits_for_a_link_that_is_down_and_every_step_arrives_once_later(tmp_path):
    router, pub = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"

    class Endpoints:
        router_endpoint, pub_endpoint = router, pub

    # Chunks from the encoding policy (no network to compute): the episode's wall time is the loop's
    # and the sink's alone, a fraction of a second unless something blocks. It has no weights to fetch.
    policy = EncodingPolicy()
    streamer = EdgeStreamer(client_config("edge-a", Endpoints, tmp_path / "spool"), None, segment_steps=10,
                            queue_size=2, image_encoding=ImageEncoding("png"))
    node = EdgeNode(CameraRobot(), policy, VirtualClock(), EdgeConfig(fps=30, simulated_latency_ms=50),
                    robot_id="edge-a")
    streamer.attach(node)
    # The link thread is not even running yet: its queue (2 segments) fills after 21 ticks, and
    # the sink must keep the rest itself instead of blocking the control thread or dropping them.
    # Blocking would stop the loop for good (nothing drains the queue), or for a put's timeout per
    # tick: either way 120 ticks of virtual time would not finish within the bound.
    streamer.begin_episode(1)
    episode = finishes_within(lambda: node.run_episode(120, "pick the cube"), 30.0, "an episode with the link down")
    assert len(episode.steps) == 120 and node.stats.sink_errors == 0
    assert streamer.submit_retries > 0  # the full queue pushed back, and nothing was lost

    streamer.start()  # the link comes up with no learner listening: still nothing blocks
    config = learner_config(tmp_path, router=router, pub=pub)
    config.store.commit_linger_s = 0.0  # both episodes are in: write them at once
    learner = LearnerService(config, tiny_policy(), train=False).start()
    try:
        streamer.begin_episode(2)
        node.run_episode(10, "pick the cube")
        wait_for(lambda: learner.store.stats()["episodes_stored"] == 2 and streamer.link.flush(0.01),
                 timeout_s=40, what="both episodes stored")
    finally:
        streamer.stop()
        node.close()
        learner.stop(checkpoint=False)
    # Every tick stored once, in order: episode 1 is the camera's reads 1..120, episode 2 reads 121..130.
    assert stored_episode_frames(tmp_path / "store", read_number) == {("edge-a", 1): list(range(1, 121)),
                                                                      ("edge-a", 2): list(range(121, 131))}


def test_weight_swap_during_an_episode_lands_between_chunks(tmp_path):
    learner = LearnerService(learner_config(tmp_path), tiny_policy(seed=3), train=False).start()
    policy = tiny_policy(seed=0)
    streamer = EdgeStreamer(client_config("edge-b", learner, tmp_path / "spool", policy_version=0), policy,
                            segment_steps=5, image_encoding=ImageEncoding("png"))
    node = EdgeNode(CameraRobot(), policy, VirtualClock(), EdgeConfig(fps=30, simulated_latency_ms=40),
                    robot_id="edge-b", policy_version=0)
    streamer.attach(node).start()
    try:
        assert streamer.link.wait_connected(20)
        node.reset_episode("pick the cube")
        streamer.begin_episode(7)
        steps = [node.tick() for _ in range(10)]
        learner.trainer.version = 1
        learner.trainer.publish_now()  # the learner publishes v1 mid-episode
        # Tick on (virtual time) until the swap shows up; the wait is for sockets, not timing.
        wait_for(lambda: steps.append(node.tick()) or steps[-1].policy_version == 1, what="swap to v1")
        steps += [node.tick() for _ in range(8)]
        wait_for(lambda: learner.robots["edge-b"].policy_version == 1, what="heartbeat reports v1")
    finally:
        streamer.stop()
        node.close()
        learner.stop(checkpoint=False)
    versions = [s.policy_version for s in steps if s.chunk_id >= 0]
    first_new = versions.index(1)
    assert set(versions[:first_new]) == {0} and set(versions[first_new:]) == {1}  # one clean switch
    switched = [s for s in steps if s.chunk_id >= 0]
    assert switched[first_new].chunk_id != switched[first_new - 1].chunk_id  # at a chunk boundary
    assert node.stats.swaps == 1 and node.stats.swap_failures == 0
    # The swapped-in weights are the learner's, not the edge's initial ones.
    served = learner.trainer.policy.state_dict()
    running = node.running_policy.state_dict()
    assert all(np.allclose(served[k].cpu(), running[k].cpu()) for k in served)


# ----------------------------------------------------------------------------- the link's settings


def test_link_settings_make_the_client_config(tmp_path):
    from robot_rl.bridges.zmq.keys import generate_keypair
    from robot_rl.bridges.zmq.link import LinkConfig

    client = LinkConfig(learner="tcp://127.0.0.1:6000").client_config("so101", str(tmp_path), config_hash="abc")
    assert (client.router_endpoint, client.pub_endpoint) == ("tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001")
    assert client.robot_id == "so101" and client.spool_dir == tmp_path / "edge" / "so101" / "spool"
    assert client.config_hash == "abc" and client.curve is None
    named = LinkConfig(learner="tcp://127.0.0.1:6000", weights="tcp://127.0.0.1:7000", robot_id="arm-2",
                       spool_dir=str(tmp_path / "spool")).client_config("so101", str(tmp_path))
    assert (named.pub_endpoint, named.robot_id, named.spool_dir) == ("tcp://127.0.0.1:7000", "arm-2",
                                                                     str(tmp_path / "spool"))
    # Off loopback: refused without keys, before anything starts; with them, CURVE.
    with pytest.raises(ValueError, match="link.secret_key=keys/robots/arm-2.key_secret link.learner_key"):
        LinkConfig(learner="tcp://10.0.0.7:5555", robot_id="arm-2").client_config("so101", str(tmp_path))
    generate_keypair(tmp_path, "learner")
    generate_keypair(tmp_path, "arm-2")
    keyed = LinkConfig(learner="tcp://10.0.0.7:5555", robot_id="arm-2", secret_key=str(tmp_path / "arm-2.key_secret"),
                       learner_key=str(tmp_path / "learner.key")).client_config("so101", str(tmp_path))
    assert keyed.curve is not None
    with pytest.raises(ValueError, match="both link.secret_key and link.learner_key"):
        LinkConfig(learner="tcp://10.0.0.7:5555", secret_key="x")
    with pytest.raises(ValueError, match="explicit port"):
        LinkConfig(learner="tcp://learner.lab").weights_endpoint()


def test_edge_command_needs_a_learner_and_keys_off_loopback(capsys):
    from robot_rl.cli import main

    assert main(["edge", "session.episodes=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "link.learner=tcp://HOST:5555" in err
    assert main(["edge", "link.learner=tcp://10.0.0.7:5555"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "link.secret_key" in err


def test_edge_command_builds_the_robot_it_is_given_not_a_sim(capsys):
    from robot_rl.cli import main

    # A real arm: the same refusal as a session's (no named checkpoint), before any sim is built.
    assert main(["edge", "robot=so101", "link.learner=tcp://127.0.0.1:5555"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "policy.path is not set" in err


def test_edge_command_answers_help(capsys):
    from robot_rl.cli import main
    from robot_rl.commands import edge

    assert main(["edge", "--help"]) == 0
    assert "link.learner" in capsys.readouterr().out
    assert edge.GROUPS == ("robot", "viewer", "policy", "edge", "link", "session")
