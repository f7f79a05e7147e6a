"""What the fleet console and the learner's status line say about robots, episodes and versions, in
process over real sockets: a robot's weights in use follow its heartbeats even while it records an
episode it sends only at the end; acked episodes the writer has not written yet are shown as being
written, not as missing; a resumed learner still lists the versions published before its checkpoint;
the status line is one short line of counts whatever the size of the fleet."""

from __future__ import annotations

import json

import pytest

from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.core.clock import VirtualClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.learner_link import EdgeStreamer
from robot_rl.edge.node import EdgeNode
from robot_rl.learner.fleet import UpdateRate, fleet_state, status_line
from robot_rl.learner.published import PublishedHistory, PublishedVersion
from robot_rl.learner.service import LearnerService, RobotStatus
from tests.edge_fakes import EncodingPolicy, KinematicRobot
from tests.learner_helpers import client_config, learner_config, make_steps, tiny_policy, wait_for

pytestmark = pytest.mark.timeout(180)


def state(service: LearnerService) -> dict:
    return json.loads(json.dumps(fleet_state(service, UpdateRate())))  # what /api/state sends


def robot_row(service: LearnerService, robot: str) -> dict:
    return next(r for r in state(service)["robots"] if r["id"] == robot)


def test_weights_in_use_follow_the_heartbeats_while_a_session_records_an_episode(tmp_path):
    """The version a robot's node swapped to reaches the console with its heartbeats, also while it
    sends no segments (between episodes: an operator choosing a verdict, a scene being reset)."""
    service = LearnerService(learner_config(tmp_path / "learner"), tiny_policy(), train=False).start()
    streamer = EdgeStreamer(client_config("arm", service, tmp_path / "spool", policy_version=0), None)
    node = EdgeNode(KinematicRobot(6), EncodingPolicy(chunk_size=10), VirtualClock(), EdgeConfig(fps=30),
                    robot_id="arm", policy_version=1)
    streamer.attach(node)
    streamer.start()
    try:
        wait_for(lambda: "arm" in service.robots, what="the robot's hello")
        assert robot_row(service, "arm")["version"] == 0
        episode = node.run_episode(30, "pick the cube")
        assert {s.policy_version for s in episode.steps} == {1}
        wait_for(lambda: robot_row(service, "arm")["version"] == 1, timeout_s=10, what="v1 from a heartbeat")
        assert "1 on v1" in status_line(service, service.store.stats())
    finally:
        streamer.stop()
        node.close()
        service.stop(checkpoint=False)


def test_acked_episodes_the_writer_has_not_written_are_shown_as_being_written(tmp_path):
    config = learner_config(tmp_path / "learner")
    config.store.commit_linger_s = 600.0  # the writer waits for a fuller batch
    service = LearnerService(config, tiny_policy(), train=False).start()
    link = StreamingClient(client_config("arm", service, tmp_path / "spool"))
    link.start()
    try:
        link.submit_steps(1, make_steps(6, episode=1), episode_done=True)
        link.submit_steps(2, make_steps(6, episode=2), episode_done=True)
        assert link.flush(30)  # both acked
        row = robot_row(service, "arm")
        assert (row["episodes_stored"], row["episodes_writing"]) == (0, 2)
        assert state(service)["learner"]["store"]["episodes_writing"] == 2
        assert "0 episodes (+2 acked, being written)" in status_line(service, service.store.stats())

        assert service.store.flush(60)  # the writer stops waiting and writes them
        row = robot_row(service, "arm")
        assert (row["episodes_stored"], row["episodes_writing"]) == (2, 0)
        assert "2 episodes," in status_line(service, service.store.stats())
    finally:
        link.stop()
        service.stop(checkpoint=False)


def test_a_resumed_learner_lists_the_versions_published_before_its_checkpoint(tmp_path):
    config = learner_config(tmp_path / "learner", publish_every_updates=1)
    service = LearnerService(config, tiny_policy(), train=False).start()  # publishes v0
    link = StreamingClient(client_config("arm", service, tmp_path / "spool"))
    link.start()
    try:
        link.submit_steps(1, make_steps(8, episode=1), episode_done=True)
        assert link.flush(30) and service.store.flush(60)
        for _ in range(2):  # each update publishes: v1, v2
            assert service.trainer.update_once() is not None
        service.trainer.checkpoint()  # at v2
        published = {v["version"]: v for v in state(service)["versions"]}
        assert sorted(published) == [0, 1, 2]
    finally:
        link.stop()
        service.stop(checkpoint=False)

    resumed = LearnerService(config, tiny_policy(), resume=True, train=False).start()  # publishes v2 again
    try:
        versions = state(resumed)["versions"]
        assert [v["version"] for v in versions] == [2, 1, 0]
        assert {v["version"]: v["published"] for v in versions[1:]} == {
            v: published[v]["published"] for v in (0, 1)}
        assert [v["update"] for v in versions] == [2, 1, 0]
    finally:
        resumed.stop(checkpoint=False)

    fresh = LearnerService(config, tiny_policy(), train=False).start()  # a new run: its own versions only
    try:
        assert [v["version"] for v in state(fresh)["versions"]] == [0]
    finally:
        fresh.stop(checkpoint=False)


def test_the_status_line_counts_robots_per_version_and_names_none(tmp_path):
    service = LearnerService(learner_config(tmp_path / "learner"), tiny_policy(), train=False)
    try:
        versions = [3] * 25 + [2] * 10 + [1] * 2 + [0, 4, 5]
        for i, version in enumerate(versions):
            service.robots[f"so101-{i:03d}"] = RobotStatus(f"so101-{i:03d}", version)
        for i in range(7):
            service.robots[f"gone-{i}"] = RobotStatus(f"gone-{i}", 0, connected=False)
        line = status_line(service, service.store.stats())
        assert line.startswith("robots: 40 connected (25 on v3, 10 on v2, 2 on v1, 3 more versions), 7 gone | ")
        assert "so101-" not in line and "gone-" not in line and "{" not in line
        assert "| store: 0 episodes, 0 steps, 0.0 MB staged | update 0, weights v0" in line
        assert len(line) < 160
    finally:
        service.stop(checkpoint=False)


def test_a_damaged_line_in_the_published_history_is_skipped_and_the_others_are_listed(tmp_path):
    history = PublishedHistory(tmp_path, None)
    history.append(PublishedVersion(0, 0, 1.0, 10))
    with open(history.path, "ab") as out:
        out.write(b'{"version": 1, \xff\xfe garbled\n')  # a flipped byte mid-line
    history.append(PublishedVersion(2, 20, 3.0, 10))
    resumed = PublishedHistory(tmp_path, 3)
    assert [v.version for v in resumed] == [0, 2]
