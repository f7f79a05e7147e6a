"""DART demonstrations (``demos.noise_deg``): noise moves the arm while the expert travels between
waypoints, the expert's own commands are what is recorded, and it still finishes every family."""

import numpy as np
import pytest

from robot_rl.app.demos import ARM_JOINTS, expert_episode
from robot_rl.app.sim import demo_expert, make_sim
from robot_rl.config import load_config


@pytest.fixture(scope="module")
def robot():
    robot = make_sim(load_config([]))
    yield robot
    robot.disconnect()


def episode_and_sent(robot, family: str, noise_deg: float, seed: int = 12):
    """The recorded episode and every command the arm was actually sent."""
    sent = []
    send_action = robot.send_action

    def spy(action):
        sent.append(np.asarray(action, dtype=np.float32).copy())
        return send_action(action)

    robot.send_action = spy
    try:
        episode = expert_episode(robot, demo_expert(robot, 0.5), seed=seed, family=family, episode_id=0,
                                 noise_deg=noise_deg)
    finally:
        del robot.send_action
    return episode, np.stack(sent)


@pytest.mark.parametrize("family", ["pick", "push", "place"])
def test_noise_moves_the_arm_off_the_recorded_commands_and_the_expert_still_finishes(robot, family):
    episode, sent = episode_and_sent(robot, family, noise_deg=2.0)
    recorded = np.stack([step.action for step in episode.steps])
    assert episode.success, f"{family}: the expert did not finish from the disturbed arm"

    disturbed = np.any(sent != recorded, axis=1)
    assert disturbed.sum() >= 5 and not disturbed.all(), f"{family}: {disturbed.mean():.0%} of ticks disturbed"
    np.testing.assert_array_equal(sent[:, ARM_JOINTS:], recorded[:, ARM_JOINTS:])  # the gripper is never moved
    assert not disturbed[-1], "the settling ticks at the end are the expert's own"
    assert np.abs(sent - recorded).max() < 6 * 2.0

    calm, calm_sent = episode_and_sent(robot, family, noise_deg=0.0)
    np.testing.assert_array_equal(calm_sent, np.stack([step.action for step in calm.steps]))
    states = np.stack([step.state for step in episode.steps])
    calm_states = np.stack([step.state for step in calm.steps])
    ticks = min(len(states), len(calm_states))
    assert np.abs(states[:ticks] - calm_states[:ticks]).max() > 1.0, "the noise never moved the arm"


def test_noise_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="demos.noise_deg"):
        load_config(["demos.noise_deg=-1"])
