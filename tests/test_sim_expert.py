"""The scripted IK expert: succeeds on every family, moves smoothly, recovers from any state."""

import numpy as np
import pytest

from robot_rl.core import VirtualClock, WallClock
from robot_rl.hardware.sim import TASK_FAMILIES, ScriptedExpert, SimConfig, SimSO101, run_expert_episode

SEEDS = range(100, 106)


@pytest.fixture(scope="module")
def robot():
    sim = SimSO101(SimConfig(cameras=()))  # no images needed: keeps the tests CPU-light
    sim.connect()
    yield sim
    sim.disconnect()


@pytest.fixture(scope="module")
def expert(robot):
    return ScriptedExpert(robot)


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_expert_succeeds_on_each_family(robot, expert, family):
    results = [run_expert_episode(robot, expert, seed=s, family=family) for s in SEEDS]
    successes = sum(r["success"] for r in results)
    assert successes >= 5, f"{family}: {successes}/6 ({[r['steps'] for r in results]} steps)"
    for r in results:
        assert r["steps"] <= robot.config.max_episode_steps
        assert r["sim_time_s"] == pytest.approx(r["steps"] / robot.fps, abs=1e-9)


def test_expert_commands_are_rate_limited(robot, expert):
    robot.reset(7, family="place")
    previous = robot.last_action
    for _ in range(120):
        action = expert.act()
        assert np.max(np.abs(action - previous)) <= expert.max_joint_step + 1e-4
        previous = robot.send_action(action)
        if robot.is_success():
            break
    assert robot.is_success()


def test_expert_act_does_not_touch_the_simulation(robot, expert):
    robot.reset(8, family="pick")
    before = robot.get_state()
    first = expert.act()
    second = expert.act()
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(robot.get_state().physics, before.physics)


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_expert_takes_over_from_a_random_policy(robot, expert, family):
    """The simulated operator must recover from wherever a policy left the arm."""
    robot.reset(21, family=family)
    rng = np.random.default_rng(0)
    action = robot.joint_state()
    for _ in range(25):  # a jittery random walk, like an untrained policy
        action = action + rng.uniform(-6, 6, size=6).astype(np.float32)
        action = robot.send_action(action)
    for _ in range(robot.config.max_episode_steps - 25):
        robot.send_action(expert.act())
        if robot.is_success():
            break
    assert robot.is_success()


def test_expert_follows_a_target_moved_mid_episode(robot, expert):
    robot.reset(30, family="pick")
    for _ in range(12):  # on its way to the cube
        robot.send_action(expert.act())
    new_position = robot.move_target(5)
    np.testing.assert_allclose(robot.target_position(), new_position)
    for _ in range(200):
        robot.send_action(expert.act())
        if robot.is_success():
            break
    assert robot.is_success()


def test_episode_runs_on_a_given_clock(robot, expert):
    clock = VirtualClock()
    result = run_expert_episode(robot, expert, seed=3, clock=clock, max_steps=4)
    assert result["steps"] == 4 and clock.now() == pytest.approx(3 / robot.fps)
    result = run_expert_episode(robot, expert, seed=3, clock=WallClock(), max_steps=2)
    assert result["steps"] == 2
    assert set(result) >= {"success", "steps", "sim_time_s", "instruction", "family", "color", "seed"}


def test_expert_plans_a_rate_limited_chunk_from_the_given_state_without_moving_the_sim(robot, expert):
    robot.reset(11, family="push")
    before = robot.get_state()
    start = robot.last_action + np.float32(3.0)  # a rolled-forward state need not be where the arm is
    chunk = expert.plan_chunk(start, 8)
    assert chunk.shape == (8, 6) and chunk.dtype == np.float32
    steps = np.diff(np.vstack([start, chunk]), axis=0)
    assert np.max(np.abs(steps)) <= expert.max_joint_step + 1e-4
    assert np.array_equal(robot.get_state().physics, before.physics)  # planning is kinematic, off the live sim


def test_expert_chunk_policy_completes_tasks_through_the_async_edge_at_200ms(robot):
    from robot_rl.app.evaluation import evaluate_policy
    from robot_rl.edge import EdgeConfig
    from robot_rl.hardware.sim.expert_policy import ExpertChunkPolicy

    policy = ExpertChunkPolicy(ScriptedExpert(robot, max_joint_step=3.0, cartesian_step=0.006, careful_step=0.003))
    config = EdgeConfig(mode="async_rollforward", simulated_latency_ms=200.0, inference_runner="virtual")
    result = evaluate_policy(robot, policy, config, seeds=[500, 501, 502], families=["push"], progress=False)
    assert result.success_rate >= 2 / 3
    assert result.stall_s_per_episode == 0.0
    with pytest.raises(ValueError, match="chunk_size"):
        ExpertChunkPolicy(ScriptedExpert(robot), chunk_size=0)


def test_a_long_planned_chunk_goes_through_the_phases_of_a_push_without_turning_back(robot, expert):
    """The chunk is the expert's own continuation: over the cube's back, down, then along the push
    direction (the planned cube is carried ahead of the jaws), never lifting back mid-stroke."""
    from robot_rl.hardware.sim.expert import Z_PUSH
    from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS

    robot.reset(21, family="push")
    d = np.asarray(PUSH_DIRECTIONS[robot.task.direction])
    cube0 = robot.world().cube_position[robot.task.color].copy()
    chunk = expert.plan_chunk(robot.last_action, 90)
    tips = np.stack([expert._point(_posed(expert, a), "tip") for a in chunk])
    low = np.flatnonzero(tips[:, 2] < Z_PUSH + 0.006)
    assert low.size > 10, "the plan never got down to push height"
    stroke = tips[low[0]:]
    along = (stroke[:, :2] - cube0[:2]) @ d
    assert along[-1] - along[0] > 0.04  # pushed forward, past where the cube was seen
    assert np.all(stroke[:, 2] < Z_PUSH + 0.012)  # no lift and second approach within the stroke


def test_a_stale_cube_behind_a_rolled_forward_push_is_carried_ahead_of_the_jaws(robot, expert):
    from robot_rl.hardware.sim.expert import PUSH_CONTACT_GAP, Z_PUSH
    from robot_rl.hardware.sim.tasks import PUSH_DIRECTIONS

    robot.reset(22, family="push")
    world = robot.world()
    d = np.asarray(PUSH_DIRECTIONS[robot.task.direction])
    cube = world.cube_position[robot.task.color]
    tip = np.array([*(cube[:2] + d * 0.03), Z_PUSH])  # jaws already 3 cm past the last seen cube
    carried = expert._pushed_along(world, tip).cube_position[robot.task.color]
    assert (carried[:2] - tip[:2]) @ d == pytest.approx(PUSH_CONTACT_GAP)
    high = np.array([*tip[:2], Z_PUSH + 0.05])  # jaws above the cube push nothing
    assert np.array_equal(expert._pushed_along(world, high).cube_position[robot.task.color], cube)


def _posed(expert, action):
    import mujoco

    data = mujoco.MjData(expert._model)
    data.qpos[expert._ids.arm_qpos] = np.deg2rad(action[:5])
    mujoco.mj_kinematics(expert._model, data)
    return data


def test_expert_ik_without_contacts_commands_exactly_what_the_full_model_would(robot):
    """The expert's IK model drops contacts for speed; its commands must not change by a bit."""
    from robot_rl.hardware.sim.rendering import mujoco

    fast = ScriptedExpert(robot)
    assert fast._model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    assert not robot.model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_CONTACT)  # the live sim keeps them
    full = ScriptedExpert(robot, contact_free_ik=False)
    for family in TASK_FAMILIES:
        robot.reset(30, family=family)
        for _ in range(60):
            command = fast.act()
            np.testing.assert_array_equal(command, full.act())
            robot.send_action(command)
