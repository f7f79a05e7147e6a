"""The control loop's real-time scheduling: SCHED_FIFO while it ticks on the wall clock, where the OS allows it."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest

from robot_rl.core import priority
from robot_rl.core.clock import VirtualClock, WallClock
from robot_rl.core.priority import realtime_thread
from robot_rl.edge import EdgeConfig, EdgeNode
from tests.edge_fakes import EncodingPolicy, KinematicRobot


def _fifo_allowed() -> bool:
    result: list[bool] = []

    def probe() -> None:  # a thread of its own: whatever happens, the test's thread keeps its policy
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            result.append(True)
        except (OSError, AttributeError):
            result.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result[0]


needs_fifo = pytest.mark.skipif(not _fifo_allowed(), reason="this machine refuses SCHED_FIFO to this user")


def _policy() -> int:
    return os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK


@needs_fifo
def test_the_block_runs_under_fifo_and_the_thread_gets_its_normal_policy_back():
    before = _policy(), os.sched_getparam(0).sched_priority
    with realtime_thread(40) as applied:
        assert applied
        assert _policy() == os.SCHED_FIFO and os.sched_getparam(0).sched_priority == 40
    assert (_policy(), os.sched_getparam(0).sched_priority) == before


@needs_fifo
def test_threads_started_inside_the_block_run_at_normal_priority():
    seen: list[int] = []
    with realtime_thread(40):
        worker = threading.Thread(target=lambda: seen.append(_policy()))
        worker.start()
        worker.join()
    assert seen == [os.SCHED_OTHER]  # a writer started by the loop never runs ahead of the tick


@needs_fifo
def test_an_exception_in_the_block_still_restores_the_policy():
    with pytest.raises(KeyboardInterrupt), realtime_thread(40):
        raise KeyboardInterrupt  # an operator's Ctrl-C ends the loop; stopping must not run at FIFO
    assert _policy() == os.SCHED_OTHER


def test_a_refused_policy_leaves_the_thread_as_it_was_and_warns_once(monkeypatch, caplog):
    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # a lab PC without rtprio for this user
    monkeypatch.setattr(priority, "_refused", [])
    with caplog.at_level(logging.WARNING, logger="robot_rl.core.priority"):
        for _ in range(3):
            with realtime_thread(40) as applied:
                assert not applied
                assert _policy() == os.SCHED_OTHER
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ulimit -r" in warnings[0] and "edge.realtime_priority=0" in warnings[0]


class _PolicyRecordingRobot(KinematicRobot):
    """Notes the scheduling policy of the thread that reads each observation (the tick's) and the
    interpreter's switch interval then."""

    def __init__(self) -> None:
        super().__init__(fps=50)
        self.policies: list[int] = []
        self.switch_intervals: set[float] = set()

    def get_observation(self):
        self.policies.append(_policy())
        self.switch_intervals.add(sys.getswitchinterval())
        return super().get_observation()


def test_the_edge_node_hands_the_interpreter_lock_round_every_ms_while_it_ticks_on_the_wall_clock():
    before = sys.getswitchinterval()
    robot = _PolicyRecordingRobot()
    with EdgeNode(robot, EncodingPolicy(chunk_size=10), WallClock(), EdgeConfig(fps=50, realtime_priority=0)) as node:
        node.run_episode(5)
    assert robot.switch_intervals == {0.001}  # a busy link thread delays a waking tick by at most this
    assert sys.getswitchinterval() == before
    robot = _PolicyRecordingRobot()
    with EdgeNode(robot, EncodingPolicy(chunk_size=10), VirtualClock(), EdgeConfig(fps=50)) as node:
        node.run_episode(5)
    assert robot.switch_intervals == {before}


@needs_fifo
def test_the_edge_node_ticks_under_fifo_on_the_wall_clock_and_returns_to_normal_after_the_episode():
    robot = _PolicyRecordingRobot()
    with EdgeNode(robot, EncodingPolicy(chunk_size=10), WallClock(), EdgeConfig(fps=50)) as node:
        node.run_episode(10)
    assert robot.policies and set(robot.policies) == {os.SCHED_FIFO}
    assert _policy() == os.SCHED_OTHER


def test_the_edge_node_never_asks_for_fifo_on_a_virtual_clock_nor_when_it_is_off(monkeypatch):
    asked: list[tuple] = []
    monkeypatch.setattr(os, "sched_setscheduler", lambda *args: asked.append(args))
    for clock, config in ((VirtualClock(), EdgeConfig(fps=50)), (WallClock(), EdgeConfig(fps=50, realtime_priority=0))):
        robot = _PolicyRecordingRobot()
        with EdgeNode(robot, EncodingPolicy(chunk_size=10), clock, config) as node:
            node.run_episode(5)
    assert asked == []  # a virtual clock never waits, so a FIFO loop would only starve its own machine


class _SimulatedRecordingRobot(_PolicyRecordingRobot):
    simulated = True  # as hardware.sim's SimSO101: the tick renders and steps physics


def test_a_simulated_robot_ticks_at_normal_priority_with_the_interpreters_own_switch_interval(monkeypatch):
    """Its tick is rendering and physics: raised, it would run ahead of the learner and the policy
    on the same CPUs for no physical deadline."""
    asked: list[tuple] = []
    monkeypatch.setattr(os, "sched_setscheduler", lambda *args: asked.append(args))
    before = sys.getswitchinterval()
    robot = _SimulatedRecordingRobot()
    with EdgeNode(robot, EncodingPolicy(chunk_size=10), WallClock(), EdgeConfig(fps=50)) as node:
        node.run_episode(5)
    assert asked == [] and robot.switch_intervals == {before}
    from robot_rl.hardware.sim.robot import SimSO101

    assert SimSO101.simulated


def test_a_priority_outside_sched_fifo_range_is_refused():
    with pytest.raises(ValueError, match="realtime_priority must be 0"):
        EdgeConfig(realtime_priority=100)
