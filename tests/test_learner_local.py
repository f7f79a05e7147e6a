"""`run_local`: a learner and 4 edge nodes (real EdgeNode + EdgeStreamer, wall clock) in one process;
plus the keys command."""

from __future__ import annotations

import os
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.app.config import LocalRunConfig
from robot_rl.app.local_run import run_local
from robot_rl.edge.config import EdgeConfig
from tests.learner_helpers import learner_config, stored_episode_frames, tiny_policy
from tests.test_stream_edge import CameraRobot, read_number


def test_four_robots_learn_together_on_loopback(tmp_path):
    config = learner_config(tmp_path, publish_every_updates=3, max_updates=6)
    run = LocalRunConfig(num_robots=4, episodes_per_robot=2, max_steps=12, segment_steps=5,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30))
    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda ep: "pick the cube"))
    assert result.episodes == 8 and result.steps == 8 * 12
    assert result.store["episodes_stored"] == 8
    # Every tick is the policy's or, where no chunk had arrived yet on a loaded machine, a hold.
    assert result.store["online_steps"] + result.store["held_steps"] == 96
    assert sorted(result.robot_versions) == [f"sim-{i}" for i in range(4)]
    # Every tick stored once, in order: each robot's first episode is its camera's reads 1..12, its
    # second reads 13..24 (the link numbers the episodes on the wire).
    stored = stored_episode_frames(tmp_path / "store", read_number)
    assert sorted((robot, frames) for (robot, _), frames in stored.items()) == sorted(
        (f"sim-{i}", list(range(12 * episode + 1, 12 * episode + 13))) for i in range(4) for episode in range(2))


def test_the_learner_trains_on_after_the_robots_until_min_updates(tmp_path):
    """The episodes fix the data, min_updates the compute: the robots stop after their episodes and
    the final checkpoint still holds min_updates updates, made on what they stored. How many of them
    were made while the robot acted depends on the machine's speed, so only their sum is checked."""
    config = learner_config(tmp_path, min_steps_to_train=10)
    run = LocalRunConfig(num_robots=1, episodes_per_robot=1, max_steps=20, segment_steps=5,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30),
                         min_updates=200)
    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda ep: "pick the cube"))
    assert result.episodes == 1 and result.store["episodes_stored"] == 1
    assert result.updates_with_robots is not None and result.updates_with_robots <= result.updates
    assert result.updates >= 200, result.updates
    assert result.checkpoint is not None and result.checkpoint.name == f"step-{result.updates:08d}"


def test_a_stop_request_ends_each_robot_after_its_episode_and_skips_the_training_after_them(tmp_path):
    """What the run's Ctrl-C asks: the robot finishes the episode it is in (stored whole, not cut),
    starts none of the others it was given, and the learner does not train on to min_updates."""
    config = learner_config(tmp_path, min_steps_to_train=10)
    run = LocalRunConfig(num_robots=1, episodes_per_robot=50, max_steps=20, segment_steps=5,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30),
                         min_updates=100_000)
    stop = threading.Event()
    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda ep: "pick the cube"),
                       on_episode=lambda robot_id, episode, version: stop.set(), stop_requested=stop)
    assert result.stopped_early and result.episodes == 1
    assert result.store["episodes_stored"] == 1 and result.steps == 20  # the episode it was in, whole
    assert result.updates < 100_000  # no training on after the robots


def test_a_stop_request_while_training_on_after_the_robots_ends_the_training_there(tmp_path):
    """A Ctrl-C after the robots are done (the minutes of training on to min_updates in `make demo`)
    ends that training and the run, with a checkpoint of what was made."""
    config = learner_config(tmp_path, min_steps_to_train=10)
    run = LocalRunConfig(num_robots=1, episodes_per_robot=1, max_steps=20, segment_steps=5,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30),
                         min_updates=100_000)
    stop, learners = threading.Event(), []

    def stop_once_it_trains_on() -> None:
        trainer = learners[0].trainer
        at_robots_done = trainer.step
        while trainer.step < at_robots_done + 20:
            time.sleep(0.01)
        stop.set()

    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda ep: "pick the cube"),
                       on_start=learners.append, stop_requested=stop,
                       on_robots_done=lambda: threading.Thread(target=stop_once_it_trains_on, daemon=True).start())
    assert result.stopped_early and result.episodes == 1
    assert 20 <= result.updates < 100_000
    assert result.checkpoint is not None and result.checkpoint.name == f"step-{result.updates:08d}"


def test_min_updates_does_not_wait_for_data_that_can_never_come(tmp_path):
    """Corrections-only training with no operator: the streams it samples stay empty after the robots
    stop, so the run ends (it would otherwise wait forever for its first update)."""
    config = learner_config(tmp_path, online_ratio=0.0, intervention_ratio=1.0, demonstration_ratio=0.0,
                            min_steps_to_train=8)
    run = LocalRunConfig(num_robots=1, episodes_per_robot=1, max_steps=10, segment_steps=5,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30),
                         min_updates=50)
    result = run_local(config, tiny_policy(), run, lambda i: (CameraRobot(), None, lambda ep: "pick the cube"))
    assert result.episodes == 1 and result.updates == 0


def test_min_updates_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="min_updates"):
        LocalRunConfig(1, 1, 10, str(tmp_path), EdgeConfig(), min_updates=-1)


def test_keys_command_writes_learner_and_robot_pairs(tmp_path):
    from robot_rl.bridges.zmq.keys import load_keypair, load_public_keys
    from robot_rl.commands import keys

    assert keys.main(["--out", str(tmp_path), "--robots", "a", "b"]) == 0
    assert load_keypair(tmp_path / "learner.key_secret").public
    assert len(load_public_keys(tmp_path / "robots")) == 2
    assert keys.main(["--out", str(tmp_path), "--robots", "a"]) == 2  # refuses to overwrite without --force
