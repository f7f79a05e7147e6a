"""A learner that needs no robot settings: the first robot's hello says what the store records,
later robots must match it (one clear line otherwise), and a restart keeps the layout."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bridges.zmq.streaming import StreamingClient
from robot_rl.core.layout import RecordedLayout
from robot_rl.learner.layout import read_layout
from robot_rl.learner.service import LearnerService
from tests.learner_helpers import (
    CAMERAS,
    IMG,
    JOINTS,
    client_config,
    learner_config,
    make_step,
    tiny_policy,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

ROBOT = RecordedLayout(30, JOINTS, {cam: (IMG, IMG) for cam in CAMERAS})
UNPINNED = dict(fps=None, joint_names=None, cameras=None, image_height=None, image_width=None)


def unpinned_learner(root):
    config = learner_config(root)
    config.store = type(config.store)(**{**config.store.__dict__, **UNPINNED})
    return LearnerService(config, tiny_policy(), train=False).start()


def link(name, learner, root, layout: RecordedLayout) -> StreamingClient:
    return StreamingClient(client_config(name, learner, root / "spools", features=layout.to_document(),
                                         refused_retry_s=0.5)).start()


def test_the_first_robots_hello_sets_the_layout_and_a_different_robot_is_refused(tmp_path):
    learner = unpinned_learner(tmp_path / "learner")
    try:
        assert learner.store.layout is None  # nothing about robots was configured
        first = link("so101-a", learner, tmp_path, ROBOT)
        assert first.wait_connected(20.0)
        assert learner.store.layout == ROBOT
        steps = [make_step(t, done=(t == 4)) for t in range(5)]
        assert first.submit_steps(1, steps, episode_done=True)
        wait_for(lambda: learner.store.stats()["steps_ingested"] == 5, what="the first robot's steps")

        # A second robot of the same features joins; one whose wrist camera is bigger is refused.
        same = link("ros2-b", learner, tmp_path, RecordedLayout(30, JOINTS, dict(ROBOT.camera_shapes)))
        bigger = RecordedLayout(30, JOINTS, {cam: (IMG * 2, IMG * 2) for cam in CAMERAS})
        other = link("so101-c", learner, tmp_path, bigger)
        assert same.wait_connected(20.0)
        wait_for(lambda: other.refusal is not None, what="the refusal of the mismatched robot")
        assert not other.connected
        assert "cameras" in other.refusal and f"{IMG * 2}x{IMG * 2}" in other.refusal
        assert "\n" not in other.refusal
        for client in (first, same, other):
            client.stop()
    finally:
        learner.stop(checkpoint=False)
    # The layout survives a restart: the store knows it before any robot says hello.
    again = unpinned_learner(tmp_path / "learner")
    try:
        assert again.store.layout == ROBOT == read_layout(tmp_path / "learner" / "store")
    finally:
        again.stop(checkpoint=False)


def test_a_robot_with_another_number_of_joints_than_the_policy_is_refused(tmp_path):
    learner = unpinned_learner(tmp_path / "learner")
    try:
        seven = RecordedLayout(30, (*JOINTS, "j6"), dict(ROBOT.camera_shapes))
        client = link("arm7", learner, tmp_path, seven)
        wait_for(lambda: client.refusal is not None, what="the refusal")
        assert "drives 6 joints" in client.refusal and learner.store.layout is None
        client.stop()
    finally:
        learner.stop(checkpoint=False)


def test_the_learner_forgets_robots_gone_for_good_beyond_the_last_64(tmp_path, caplog):
    """Without CURVE any client may say hello under any id: a learner that remembered them all grew
    its memory and its status line with each one (4.9 MB lines after five minutes of it)."""
    import logging

    from robot_rl.bridges.zmq.server import Peer
    from robot_rl.learner.service import REMEMBERED_GONE_ROBOTS, RobotStatus

    learner = LearnerService(learner_config(tmp_path), tiny_policy(), train=False)
    try:
        for i in range(200):
            learner.robots[f"drive-by-{i}"] = RobotStatus(f"drive-by-{i}", -1, last_seen_s=float(i))
            learner.on_peer_lost(Peer(b"x", f"drive-by-{i}", "", -1, 0.0, 0.0))
        learner.robots["so101-a"] = RobotStatus("so101-a", 3)
        assert len(learner.robots) == REMEMBERED_GONE_ROBOTS + 1 and "drive-by-199" in learner.robots
        assert "drive-by-0" not in learner.robots  # the longest gone went first
        learner._last_status_s = -1e9
        with caplog.at_level(logging.INFO, logger="robot_rl.learner.service"):
            learner._log_status()
        line = next(r.message for r in caplog.records if r.message.startswith("robots: "))
        assert line.startswith("robots: 1 connected (1 on v3), 64 gone") and "drive-by" not in line
    finally:
        learner.stop(checkpoint=False)
