"""`run_local` with each robot in a process of its own (``LocalRunConfig.robots="process"``):
the episodes reach the learner and the caller, a robot that fails says why, and a factory that
cannot travel to a child is refused with a clear error before anything runs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import threading
from dataclasses import dataclass

import pytest

from robot_rl.app.config import LocalRunConfig
from robot_rl.app.local_run import run_local
from robot_rl.app.robot_process import EpisodeSummary, RobotProcessError
from robot_rl.edge.config import EdgeConfig
from tests.learner_helpers import learner_config, stored_triples, tiny_policy
from tests.test_stream_edge import CameraRobot


@dataclass(frozen=True)
class CameraRobots:
    """A picklable robot factory: the kinematic test arm with a camera, one per robot."""

    fail_on_robot: int | None = None

    def __call__(self, index: int):
        if index == self.fail_on_robot:
            raise OSError(f"motor bus of robot {index} not found")
        return CameraRobot(), None, lambda episode: "pick the cube"


def process_run(tmp_path, **overrides) -> LocalRunConfig:
    base = dict(num_robots=2, episodes_per_robot=2, max_steps=12, segment_steps=5, spool_dir=str(tmp_path / "spool"),
                image_format="png", edge=EdgeConfig(fps=30), robots="process")
    return LocalRunConfig(**{**base, **overrides})


def test_robots_in_their_own_processes_stream_every_episode_to_the_learner(tmp_path):
    seen: list[tuple[str, EpisodeSummary, int]] = []
    lock = threading.Lock()

    def on_episode(robot_id, episode, version):
        with lock:
            seen.append((robot_id, episode, version))

    config = learner_config(tmp_path, publish_every_updates=3, max_updates=6)
    result = run_local(config, tiny_policy(), process_run(tmp_path), CameraRobots(), on_episode=on_episode)

    assert result.episodes == 4 and result.steps == 4 * 12
    assert result.store["episodes_stored"] == 4
    assert len(stored_triples(tmp_path / "store")) == 48
    assert sorted(result.robot_versions) == ["sim-0", "sim-1"]
    # The caller heard of every episode, from the robot that ran it, with its step count.
    assert sorted((rid, e.episode_id) for rid, e, _ in seen) == [("sim-0", 0), ("sim-0", 1), ("sim-1", 0), ("sim-1", 1)]
    assert all(isinstance(e, EpisodeSummary) and e.num_steps == 12 for _, e, _ in seen)


def test_a_robot_that_fails_in_its_process_says_why(tmp_path):
    config = learner_config(tmp_path, publish_every_updates=1000)
    with pytest.raises(RobotProcessError, match="motor bus of robot 1 not found"):
        run_local(config, tiny_policy(), process_run(tmp_path, episodes_per_robot=1), CameraRobots(fail_on_robot=1),
                  train=False)


def test_a_factory_that_cannot_reach_a_process_is_refused_clearly(tmp_path):
    config = learner_config(tmp_path, publish_every_updates=1000)

    def unpicklable(i):  # a local function: pickle cannot send it to a robot process
        return CameraRobot(), None, lambda ep: "pick the cube"

    with pytest.raises(RobotProcessError, match="picklable.*run.robots=thread"):
        run_local(config, tiny_policy(), process_run(tmp_path), unpicklable, train=False)


def test_unknown_robot_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fibers"):
        process_run(tmp_path, robots="fibers")


def test_robot_processes_leave_a_ctrl_c_to_their_parent_and_the_parent_keeps_its_own_handler():
    """The terminal's Ctrl-C reaches every process of the group: a robot must not die of it mid-episode
    (its parent ends it after the episode), and the parent must still see it."""
    import multiprocessing
    import signal

    from robot_rl.core.ctrl_c import ctrl_c_left_to_the_parent
    from tests.signal_probe import report_sigint_handler

    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    # As a terminal starts Python, Ctrl-C raising KeyboardInterrupt: a suite started in the background of
    # a shell without job control inherits SIGINT ignored, and so would every child it starts.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ctrl_c_left_to_the_parent():
            child = context.Process(target=report_sigint_handler, args=(answers,))
            child.start()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert answers.get(timeout=60) == str(signal.SIG_IGN)
        child.join(30)
        plain = context.Process(target=report_sigint_handler, args=(answers,))
        plain.start()
        assert answers.get(timeout=60) != str(signal.SIG_IGN)  # started outside: Python's own KeyboardInterrupt
        plain.join(30)
    finally:
        signal.signal(signal.SIGINT, outer)
