"""No commanded target ever moves a joint faster than its limit: on the first tick (the plan is
far from where the arm stands), through a takeover to a far teleop pose, a hand-back to a far
plan, and across chunk seams; and a hand-back is eased even where the robot sets no limit."""

from __future__ import annotations

import numpy as np
import pytest

from robot_rl.core.clock import VirtualClock
from robot_rl.core.motion_limits import JointDeltaClamp, step_limit_per_tick
from robot_rl.edge import EdgeConfig, EdgeNode
from robot_rl.hardware.teleop import TakeoverBlender, TeleopEvent, TeleopIntervention
from robot_rl.hardware.teleop.base import TeleopReading
from tests.edge_fakes import EncodingPolicy, KinematicRobot

FPS = 30


class LimitedRobot(KinematicRobot):
    """A kinematic arm with a velocity limit in its config (units per second)."""

    max_joint_velocity = [60.0, 60.0, 60.0, 60.0, 60.0, 150.0]  # 2 per tick; the gripper 5


class FarTeleop:
    """An operator's device whose pose is far from the follower (a leader arm held elsewhere)."""

    name = "far"

    def connect(self) -> None:
        pass

    def read(self, observation) -> TeleopReading:
        return TeleopReading(action=np.full(6, -300.0, dtype=np.float32))

    def disconnect(self) -> None:
        pass


def drive(robot, ticks_policy=40, ticks_human=40, ticks_after=80, blend_step=3.0):
    """Policy (chunks thousands of units away), takeover, hand-back; every command the robot got."""
    policy = EncodingPolicy(chunk_size=20, base=500.0)
    hook = TeleopIntervention(FarTeleop(), TakeoverBlender(FPS, 0.5, blend_step))
    node = EdgeNode(robot, policy, VirtualClock(), EdgeConfig(fps=FPS, simulated_latency_ms=50.0),
                    intervention=hook)
    hook.bind(node)
    steps = []
    for tick in range(ticks_policy + ticks_human + ticks_after):
        if tick == ticks_policy:
            hook.push_event(TeleopEvent.TAKE_OVER)
        if tick == ticks_policy + ticks_human:
            hook.push_event(TeleopEvent.HAND_BACK)
        steps.append(node.tick())
    node.close()
    return steps


def test_every_target_stays_under_the_robots_velocity_limit():
    robot = LimitedRobot()
    steps = drive(robot)
    sent = np.stack([np.zeros(6, dtype=np.float32), *robot.sent])  # the arm stood at 0 before tick 0
    per_tick = np.abs(np.diff(sent, axis=0))
    limit = np.asarray(LimitedRobot.max_joint_velocity) / FPS
    assert (per_tick <= limit + 1e-4).all(), per_tick.max(axis=0)
    # The limit is what bounds them: the policy's chunks and the teleop pose are far away.
    assert np.isclose(per_tick[0], limit, atol=1e-4).all()  # the first tick ramps from the measured state
    assert any(s.is_intervention for s in steps) and any(s.chunk_id >= 0 for s in steps[80:])
    assert np.isclose(per_tick[-1], limit, atol=1e-4).any()  # still climbing towards the far plan


def test_a_hand_back_is_eased_by_the_takeover_bound_where_the_robot_sets_no_limit():
    robot = KinematicRobot()  # no velocity limit (like the sim): only the hand-back's ease bounds it
    drive(robot, ticks_policy=10, ticks_human=60, ticks_after=60, blend_step=3.0)
    sent = np.stack(robot.sent)
    human_last = sent[69]
    after = np.abs(np.diff(np.vstack([human_last, sent[70:]]), axis=0))
    assert after.max() <= 3.0 + 1e-4  # no jump from the operator's pose to the far plan
    assert after.max() == pytest.approx(3.0, abs=1e-4)  # it did move, at the bound


def test_the_step_bound_takes_the_tighter_of_velocity_and_per_tick_limits():
    limit = step_limit_per_tick([60.0, 300.0], 30, 5.0, 2)
    np.testing.assert_allclose(limit, [2.0, 5.0])
    assert step_limit_per_tick(None, 30, None, 2) is None
    with pytest.raises(ValueError, match="one per joint"):
        step_limit_per_tick([1.0, 2.0, 3.0], 30, None, 2)
    clamp = JointDeltaClamp(limit, 2)
    path = clamp.along(np.zeros(2), [np.array([10.0, 10.0]), np.array([-10.0, 10.0])])
    np.testing.assert_allclose(path, [[2.0, 5.0], [0.0, 10.0]])
