"""The MuJoCo SO-101 sim: Robot protocol, units, determinism, tasks and rendering."""

import numpy as np
import pytest

from robot_rl.hardware.robot import InvalidActionError, Robot
from robot_rl.hardware.sim import TASK_COLORS, TASK_FAMILIES, SimConfig, SimSO101
from robot_rl.hardware.sim.scene import BOWL_FLOOR_THICKNESS, CUBE_HALF, build_spec
from robot_rl.hardware.sim.tasks import PICK_LIFT, PUSH_DIRECTIONS, PUSH_DISTANCE


@pytest.fixture(scope="module")
def robot():
    sim = SimSO101(SimConfig(seed=0))
    sim.connect()
    yield sim
    sim.disconnect()


# ---------------------------------------------------------------- protocol and units


def test_is_a_robot_with_lerobot_features(robot):
    assert isinstance(robot, Robot)
    assert robot.joint_names == (
        "shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"
    )
    assert list(robot.action_features) == [f"{j}.pos" for j in robot.joint_names]
    assert robot.observation_features["front"] == (96, 96, 3)
    assert robot.observation_features["wrist"] == (96, 96, 3)
    assert robot.observation_features["gripper.pos"] is float


def test_joint_limits_are_ctrlrange_in_degrees_and_gripper_0_100(robot):
    lower, upper = robot.joint_limits
    ctrl = robot.model.actuator_ctrlrange[robot.ids.actuators[:5]]
    np.testing.assert_allclose(lower[:5], np.rad2deg(ctrl[:, 0]), rtol=1e-5)
    np.testing.assert_allclose(upper[:5], np.rad2deg(ctrl[:, 1]), rtol=1e-5)
    assert (lower[5], upper[5]) == (0.0, 100.0)
    assert lower.dtype == np.float32 and np.all(lower < upper)


def test_observation_shapes_and_dtypes(robot):
    robot.reset(1)
    obs = robot.get_observation()
    assert set(obs["images"]) == {"front", "wrist"}
    for image in obs["images"].values():
        assert image.shape == (96, 96, 3) and image.dtype == np.uint8
        assert image.std() > 5  # a rendered scene, not a blank buffer
    assert obs["state"].shape == (6,) and obs["state"].dtype == np.float32


def test_send_action_clips_to_limits_and_reports_what_was_sent(robot):
    robot.reset(2)
    lower, upper = robot.joint_limits
    sent = robot.send_action(np.full(6, 1000.0, dtype=np.float32))
    np.testing.assert_array_equal(sent, upper)
    sent = robot.send_action(np.full(6, -1000.0, dtype=np.float32))
    np.testing.assert_array_equal(sent, lower)
    # The gripper command 0 is the closed end of the jaw's ctrlrange.
    assert robot.data.ctrl[robot.ids.actuators[5]] == pytest.approx(
        robot.model.actuator_ctrlrange[robot.ids.actuators[5], 0]
    )


def test_send_action_advances_exactly_one_control_period(robot):
    robot.reset(3)
    before = robot.sim_time
    robot.send_action(robot.joint_state())
    robot.send_action(robot.joint_state())
    assert robot.sim_time - before == pytest.approx(2.0 / robot.fps, abs=1e-9)
    assert robot.step_count == 2


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.array([0, 0, np.nan, 0, 0, 50], dtype=np.float32), "NaN"),
        (np.array([0, 0, 0, np.inf, 0, 50], dtype=np.float32), "NaN/inf"),
        (np.zeros(5, dtype=np.float32), "shape"),
        (np.zeros((2, 6), dtype=np.float32), "shape"),
        ("open the gripper", "not numeric"),
    ],
)
def test_invalid_action_raises_and_leaves_the_robot_untouched(robot, bad, message):
    robot.reset(4)
    robot.send_action(robot.joint_state())
    before = robot.get_state()
    ctrl = robot.data.ctrl.copy()
    with pytest.raises(InvalidActionError, match=message):
        robot.send_action(bad)
    after = robot.get_state()
    np.testing.assert_array_equal(after.physics, before.physics)
    np.testing.assert_array_equal(robot.data.ctrl, ctrl)
    assert after.step == before.step


def test_unconnected_robot_says_to_connect():
    sim = SimSO101(SimConfig(cameras=()))
    with pytest.raises(RuntimeError, match="connect"):
        sim.send_action(np.zeros(6, dtype=np.float32))


def test_config_rejects_unknown_render_quality_and_camera():
    with pytest.raises(ValueError, match="render_quality"):
        SimConfig(render_quality="pretty")
    with pytest.raises(ValueError, match="camera"):
        SimConfig(cameras=("top",))


def test_physics_step_divides_the_control_period_exactly():
    config = SimConfig(fps=30)
    assert config.physics_dt <= config.max_physics_dt
    assert config.physics_dt * config.substeps == pytest.approx(1 / 30, abs=1e-15)


# ---------------------------------------------------------------- determinism and state


def rollout(sim: SimSO101, seed: int, ticks: int = 8) -> tuple[list[np.ndarray], dict]:
    sim.reset(seed)
    rng = np.random.default_rng(123)
    states = []
    for _ in range(ticks):
        action = sim.joint_state() + rng.uniform(-5, 5, size=6).astype(np.float32)
        sim.send_action(action)
        states.append(sim.get_state().physics.copy())
    return states, sim.get_observation()["images"]


def test_same_seed_same_actions_give_identical_states_and_images(robot):
    other = SimSO101(SimConfig(seed=0))
    other.connect()
    try:
        states_a, images_a = rollout(robot, seed=11)
        states_b, images_b = rollout(other, seed=11)
    finally:
        other.disconnect()
    for a, b in zip(states_a, states_b, strict=True):
        np.testing.assert_array_equal(a, b)
    for cam in images_a:
        np.testing.assert_array_equal(images_a[cam], images_b[cam])


def test_different_seeds_give_different_scenes(robot):
    robot.reset(5)
    cubes_a = robot.world().cube_position
    robot.reset(6)
    cubes_b = robot.world().cube_position
    assert any(np.linalg.norm(cubes_a[c] - cubes_b[c]) > 0.01 for c in TASK_COLORS)


def test_reset_sequence_without_seeds_is_reproducible_from_config_seed():
    a, b = SimSO101(SimConfig(seed=7, cameras=())), SimSO101(SimConfig(seed=7, cameras=()))
    assert [a.reset() for _ in range(4)] == [b.reset() for _ in range(4)]
    np.testing.assert_array_equal(a.get_state().physics, b.get_state().physics)


def test_set_state_replays_bit_for_bit(robot):
    robot.reset(8)
    for _ in range(5):
        robot.send_action(robot.joint_state() + 3.0)
    snapshot = robot.get_state()
    actions = [robot.joint_state() - 4.0 + k for k in range(6)]

    def replay() -> list[np.ndarray]:
        states = []
        for action in actions:
            robot.send_action(action)
            states.append(robot.get_state().physics.copy())
        return states

    first = replay()
    robot.set_state(snapshot)
    second = replay()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- tasks


def test_every_family_and_colour_can_be_requested(robot):
    for family in TASK_FAMILIES:
        for color in TASK_COLORS:
            instruction = robot.reset(9, family=family, color=color)
            assert robot.task.family == family and robot.task.color == color
            assert color in instruction and instruction == robot.task.instruction
    with pytest.raises(ValueError, match="task family"):
        robot.reset(0, family="juggle")


def test_layouts_keep_cubes_apart_and_out_of_the_bowl(robot):
    for seed in range(15):
        robot.reset(seed)
        world = robot.world()
        positions = [world.cube_position[c] for c in TASK_COLORS]
        for i in range(3):
            assert np.linalg.norm(positions[i][:2] - world.bowl_position[:2]) > 0.08
            for j in range(i):
                assert np.linalg.norm(positions[i][:2] - positions[j][:2]) > 0.07


def test_nothing_is_a_success_at_reset(robot):
    for seed in range(6):
        robot.reset(seed)
        assert not robot.is_success()
        assert 0.0 <= robot.reward() < 1.0


@pytest.mark.parametrize("direction", ["left", "right"])
def test_push_success_needs_the_named_direction(robot, direction):
    seed = next(s for s in range(50) if robot.reset(s, family="push").endswith(direction))
    assert robot.reset(seed, family="push") == f"push the {robot.task.color} cube to the {direction}"
    start = robot.progress.start_position
    d = np.append(PUSH_DIRECTIONS[direction], 0.0)
    robot.place_cube(robot.task.color, start - d * (PUSH_DISTANCE + 0.01))
    assert not robot.is_success()
    robot.place_cube(robot.task.color, start + d * (PUSH_DISTANCE + 0.01))
    assert robot.is_success()
    assert robot.reward() == 1.0


def test_place_success_when_the_cube_rests_in_the_bowl(robot):
    robot.reset(12, family="place")
    bowl = robot.world().bowl_position
    robot.place_cube(robot.task.color, bowl + [0.01, -0.01, BOWL_FLOOR_THICKNESS + CUBE_HALF])
    assert robot.is_success()
    robot.place_cube(robot.task.color, bowl + [0.09, 0.0, CUBE_HALF])  # beside the bowl
    assert not robot.is_success()


def test_pick_success_needs_the_cube_held_not_just_high(robot):
    robot.reset(13, family="pick")
    start = robot.progress.start_position
    robot.place_cube(robot.task.color, start + [0.0, 0.0, PICK_LIFT + 0.02])  # floating, untouched
    assert not robot.is_success()
    assert robot.reward() < 1.0


# ---------------------------------------------------------------- privileged helpers


def test_move_target_teleports_the_target_cube(robot):
    robot.reset(14, family="pick")
    before = robot.target_position()
    moved = robot.move_target(3)
    after = robot.target_position()
    assert np.linalg.norm(after[:2] - before[:2]) > 0.05
    np.testing.assert_allclose(after, moved)
    assert moved[2] == pytest.approx(CUBE_HALF, abs=1e-6)
    robot.reset(14, family="pick")
    np.testing.assert_allclose(robot.move_target(np.random.default_rng(3)), moved)  # seeded


def test_forward_kinematics_predicts_where_a_command_settles(robot):
    robot.reset(15)
    command = robot.joint_state() + np.array([10, 8, -6, 5, 0, 0], dtype=np.float32)
    state_before = robot.get_state()
    predicted = robot.forward_kinematics(command)
    np.testing.assert_array_equal(robot.get_state().physics, state_before.physics)  # untouched
    for _ in range(30):
        robot.send_action(command)
    np.testing.assert_allclose(robot.ee_position(), predicted, atol=0.005)


# ---------------------------------------------------------------- rendering


def test_fast_look_has_no_shadows_multisampling_or_heavy_meshes(robot):
    assert robot.config.render_quality == "fast"
    assert robot.model.vis.quality.shadowsize == 0
    assert robot.model.vis.quality.offsamples == 0
    assert not any(robot.model.light_castshadow)
    assert robot.model.nmeshface < 5000  # the stock meshes have ~322k faces


def test_full_look_keeps_stock_meshes_and_shadows():
    spec = build_spec("full")
    assert spec.visual.quality.shadowsize > 0 and spec.visual.quality.offsamples > 0
    assert all(mesh.file.endswith(".stl") for mesh in spec.meshes)


def test_camera_selection_and_image_size_follow_the_config():
    sim = SimSO101(SimConfig(cameras=("wrist",), image_height=48, image_width=64))
    sim.connect()
    try:
        obs = sim.get_observation()
    finally:
        sim.disconnect()
    assert list(obs["images"]) == ["wrist"]
    assert obs["images"]["wrist"].shape == (48, 64, 3)
    assert sim.observation_features["wrist"] == (48, 64, 3)
