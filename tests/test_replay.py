"""Replay of logged datasets in the sim: open-loop tracking, joint mapping, counterfactuals, video.

The datasets are real LeRobotDataset v3 directories: one recorded by our own stack
(scripted expert -> EpisodeRecorder), one written with lerobot's ``LeRobotDataset.create``
in another robot's joint layout. Both are read back through lerobot, never by hand.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from robot_rl.app.demos import expert_episode
from robot_rl.config import ConfigError
from robot_rl.data import EpisodeRecorder
from robot_rl.edge.viewer_config import RerunMode, RerunViewerConfig
from robot_rl.hardware.sim import ScriptedExpert, SimConfig, SimSO101
from robot_rl.replay import (
    JointMapping,
    JointMappingError,
    ReplayConfig,
    build_mapper,
    counterfactual_replay,
    load_logged_dataset,
    replay_dataset,
)
from robot_rl.replay.dataset import logged_episode
from robot_rl.replay.video import count_frames
from tests.rerun_helpers import component, read_rrd

IMAGE = 32
# (seed, family) of the recorded episodes; the dataset does not store seeds, so the
# test passes them as `replay.seeds` (what a researcher does for an old recording).
EPISODES = ((3, "pick"), (5, "push"))
INTERVENTION = range(10, 20)  # ticks marked as a human takeover (flags only: physics unchanged)

# Replaying our own recording with the same seed must reproduce the logged states up to
# float32 storage: MuJoCo is deterministic, the reset re-creates the scene bit for bit,
# and the logged actions are the exact float32 commands that were executed. 1e-3 (deg,
# gripper %) leaves room for float32 rounding only; a wrong scene gives errors of degrees.
SAME_PHYSICS_TOLERANCE = 1e-3


def make_robot() -> SimSO101:
    robot = SimSO101(SimConfig(image_height=IMAGE, image_width=IMAGE))
    robot.connect()
    return robot


def record_expert_dataset(robot: SimSO101, root, which=EPISODES, keep_seed: bool = True) -> list:
    """Record ``which`` (seed, family) pairs with the scripted expert into a LeRobotDataset; returns the Episodes.

    ``keep_seed=False`` stores the episodes as a real robot would: without a sim seed.
    """
    cameras = {cam: (IMAGE, IMAGE) for cam in robot.camera_names}
    recorder = EpisodeRecorder(root, robot.fps, robot.joint_names, cameras)
    episodes = []
    for i, (seed, family) in enumerate(which):
        episode = expert_episode(robot, ScriptedExpert(robot), seed, family, i)
        assert episode.success, f"the scripted expert failed seed {seed}; pick another seed for the test"
        for step in episode.steps:
            step.is_intervention = step.tick in INTERVENTION
            step.policy_version = 1 if step.tick < 25 else 2
        if not keep_seed:
            episode.seed = None
        recorder.write_episode(episode)
        episodes.append(episode)
    return episodes


@pytest.fixture(scope="module")
def robot():
    robot = make_robot()
    yield robot
    robot.disconnect()


@pytest.fixture(scope="module")
def recorded(robot, tmp_path_factory):
    root = tmp_path_factory.mktemp("recorded") / "ds"
    return root, record_expert_dataset(robot, root)


def test_replay_reproduces_own_recording_and_writes_video(robot, recorded, tmp_path):
    root, episodes = recorded
    dataset = load_logged_dataset(str(root))
    assert dataset.state_names[0] == "shoulder_pan.pos" and dataset.cameras == ("front", "wrist")
    assert dataset.episodes[0].is_intervention[list(INTERVENTION)].all()

    # No seeds given: the recording carries each episode's sim seed, so the scene is re-created.
    config = ReplayConfig(out_dir=str(tmp_path / "same"))
    viewer = RerunViewerConfig(mode=RerunMode.save, dir=str(tmp_path / "rerun"))
    run = replay_dataset(robot, dataset, config, progress=False, viewer=viewer)

    for result, episode in zip(run.episodes, episodes, strict=True):
        np.testing.assert_allclose(result.tracking.logged, np.stack([s.state for s in episode.steps]))
        assert max(result.tracking.max_abs().values()) <= SAME_PHYSICS_TOLERANCE
        assert result.tracking.scene_recreated
        assert count_frames(result.video) == episode.num_steps
        assert result.plot.stat().st_size > 0
    summary = json.loads(run.summary_path.read_text())
    assert [e["episode"] for e in summary["episodes"]] == [0, 1]
    assert summary["mapping_is_identity"] is True
    # The Rerun log holds both sides of every step: cameras and joints, logged and simulated.
    rows = read_rrd(tmp_path / "rerun" / "replay.rrd")
    for k, (result, episode) in enumerate(zip(run.episodes, episodes, strict=True)):
        for source, states in (("logged", result.tracking.logged), ("sim", result.tracking.simulated)):
            logged_states = [component(r, "Scalars:scalars") for r in rows[f"episode_{k}/{source}/observation.state"]]
            np.testing.assert_allclose(np.asarray(logged_states), states, atol=1e-4)
            for camera in ("front", "wrist"):
                assert len(rows[f"episode_{k}/{source}/observation.images.{camera}"]) == episode.num_steps


def test_replay_without_seed_starts_from_first_state_but_misses_the_cube(robot, tmp_path):
    """Without the scene the arm starts right, but the cube is elsewhere: the pick's gripper closes on air."""
    root = tmp_path / "no_seed"
    record_expert_dataset(robot, root, which=EPISODES[:1], keep_seed=False)
    dataset = load_logged_dataset(str(root), episodes=[0])
    config = ReplayConfig(out_dir=str(tmp_path / "out"), video=False, plots=False)
    (result,) = replay_dataset(robot, dataset, config, progress=False).episodes
    error = np.abs(result.tracking.error)
    assert not result.tracking.scene_recreated
    assert error[0].max() <= 0.01  # placed at the first logged state
    assert result.tracking.max_abs()["gripper"] > 2.0  # the logged gripper stopped on the cube


# ----------------------------------------------------------------------------- another robot's layout

OTHER_JOINTS = [f"joint{i}" for i in range(1, 7)]


def write_other_robot_dataset(root, episode) -> None:
    """A dataset as another lab would log it: joint1..6, arm in radians, gripper 0..1, one 'laptop' camera."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    def to_other(v: np.ndarray) -> np.ndarray:
        return np.append(np.deg2rad(v[:5]), v[5] / 100.0).astype(np.float32)

    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": OTHER_JOINTS},
        "action": {"dtype": "float32", "shape": (6,), "names": OTHER_JOINTS},
        "observation.images.laptop": {"dtype": "image", "shape": (24, 32, 3), "names": ["height", "width", "channels"]},
    }
    dataset = LeRobotDataset.create("other_lab/arm", fps=30, features=features, root=root, use_videos=False)
    for step in episode.steps:
        image = np.ascontiguousarray(step.images["front"][4:28, :, :])
        dataset.add_frame({"observation.state": to_other(step.state), "action": to_other(step.action),
                           "observation.images.laptop": image, "task": episode.instruction})
    dataset.save_episode()
    dataset.finalize()


def test_other_robot_layout_needs_a_mapping_then_replays(recorded, tmp_path):
    from robot_rl.app.dataset_replay import run_replay
    from robot_rl.config import load_config

    _, episodes = recorded
    root = tmp_path / "other"
    write_other_robot_dataset(root, episodes[0])
    common = [f"replay.dataset={root}", f"output_dir={tmp_path / 'out'}", f"robot.image_height={IMAGE}",
              f"robot.image_width={IMAGE}", "replay.plots=false"]

    with pytest.raises(ConfigError) as excinfo:
        run_replay(load_config(common), progress=False)
    message = str(excinfo.value)
    assert "['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']" in message
    assert "joint1" in message and "replay.mapping.names" in message

    cfg = load_config(["replay=radians_6dof", f"replay.seeds=[{EPISODES[0][0]}]", *common])
    (result,) = run_replay(cfg, progress=False).episodes
    # Radians and 0..1 round-trip through float32, so the commands differ from the
    # recorded ones by ~1e-5 deg; the states then agree to well under a hundredth of a degree.
    assert max(result.tracking.max_abs().values()) < 0.01
    assert count_frames(result.video) == episodes[0].num_steps


def test_mapping_errors_name_the_problem():
    sim = ("a", "b")
    with pytest.raises(JointMappingError, match=r"sim joints \['b'\] have no dataset joint.*dataset joints \['x'\]"):
        build_mapper(JointMapping(), ["a.pos", "x"], sim)
    with pytest.raises(JointMappingError, match="same sim joint"):
        build_mapper(JointMapping(names={"x": "a"}), ["a", "x", "b"], sim)
    with pytest.raises(JointMappingError, match=r"dataset joints \['nope'\]"):
        build_mapper(JointMapping(names={"nope": "a"}), ["a", "b"], sim)
    mapper = build_mapper(JointMapping(names={"x": "b"}, scale={"b": 2.0}, offset=1.0), ["x", "a"], sim)
    np.testing.assert_allclose(mapper.to_sim(np.array([10.0, 3.0])), [4.0, 21.0])


def test_the_replay_settings_and_their_errors_are_one_line_each(tmp_path):
    """`robot-rl replay` composes the root config only: its settings are spelled replay.*, a selection
    of episodes is replay.episode_indices, and what cannot be replayed is a ConfigError naming the fix."""
    from robot_rl.app.dataset_replay import run_replay
    from robot_rl.config import load_config

    cfg = load_config([f"output_dir={tmp_path}", "replay.episode_indices=[0,2]"])
    assert cfg.replay.out_dir == f"{tmp_path}/replay" and cfg.replay.episode_indices == [0, 2]
    with pytest.raises(ConfigError, match=r"replay\.episodes is not a setting.*did you mean replay.episode_indices"):
        load_config(["replay.episodes=[0,2]"])
    with pytest.raises(ConfigError, match=r"replay\.dataset=DIR"):
        run_replay(cfg)  # no dataset: say how to name one
    corrupt = tmp_path / "corrupt"
    (corrupt / "meta").mkdir(parents=True)
    (corrupt / "meta" / "info.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"could not read dataset .*corrupt.* with lerobot \(JSONDecodeError"):
        run_replay(load_config([f"replay.dataset={corrupt}"]))


def test_a_joint_mapping_takes_a_number_or_one_per_joint():
    assert JointMapping(scale=2, offset={"a": -1.5}).offset == {"a": -1.5}
    for bad in ("fast", [1.0, 2.0], {"a": "x"}, True):
        with pytest.raises(ValueError, match="mapping.scale must be a number or"):
            JointMapping(scale=bad)
    with pytest.raises(ConfigError, match="mapping.offset must be a number or"):
        from robot_rl.config import load_config

        load_config(["replay.mapping.offset=[1,2]"])


def test_the_help_examples_use_settings_that_exist():
    """`robot-rl replay --help` / `eval --help` (the CLI prints HELP and GROUPS): their examples compose."""
    from dataclasses import fields

    from robot_rl.commands import evaluate, replay
    from robot_rl.config import RobotRLConfig, load_config

    root = {f.name for f in fields(RobotRLConfig)}
    for module in (replay, evaluate):
        assert set(module.GROUPS) <= root
        examples = [line.split()[2:] for line in module.HELP.splitlines() if line.strip().startswith("robot-rl ")]
        assert examples
        for overrides in examples:
            load_config(overrides)  # an unknown or ill-typed key would raise ConfigError


def test_hub_ids_go_through_lerobot():
    """Offline (conftest), a Hub id reaches LeRobot's download path and fails there, with its reason."""
    from robot_rl.replay import DatasetError

    with pytest.raises(DatasetError, match=r"could not read dataset 'someone/some_dataset' with lerobot"):
        load_logged_dataset("someone/some_dataset")
    with pytest.raises(DatasetError, match="neither an existing directory nor"):
        load_logged_dataset("./missing/dir")


def test_seed_column_is_picked_up():
    arrays = {"episode_index": 4, "state": np.zeros((3, 6)), "action": np.zeros((3, 6)),
              "episode_seed": np.array([[17], [17], [17]])}
    assert logged_episode(arrays).seed == 17
    arrays["episode_seed"] = np.full((3, 1), -1)
    assert logged_episode(arrays).seed is None


# ----------------------------------------------------------------------------- counterfactual


class LoggedActionsPolicy:
    """Answers with the logged future actions (looked up by the logged state), plus ``bias`` at some steps."""

    chunk_size = 8
    action_dim = 6

    def __init__(self, states: np.ndarray, actions: np.ndarray, biased_steps: range, bias: float) -> None:
        self.index = {s.tobytes(): t for t, s in enumerate(states)}
        self.actions = actions
        self.biased_steps = biased_steps
        self.bias = bias

    def predict_chunk(self, observation, state, instruction) -> np.ndarray:
        t = self.index[np.asarray(state, np.float32).tobytes()]
        future = self.actions[t : t + self.chunk_size]
        chunk = np.concatenate([future, np.repeat(future[-1:], self.chunk_size - len(future), axis=0)])
        return chunk + (self.bias if t in self.biased_steps else 0.0)

    def save_pretrained(self, directory) -> None:  # pragma: no cover - protocol only
        raise NotImplementedError


def test_counterfactual_error_is_zero_where_policy_agrees_and_large_where_it_deviates(recorded):
    root, _ = recorded
    episode = load_logged_dataset(str(root), episodes=[0]).episodes[0]
    deviating = range(30, 40)
    policy = LoggedActionsPolicy(episode.state, episode.action, deviating, bias=20.0)
    result = counterfactual_replay(policy, episode.images, episode.state, episode.action, episode.instruction,
                                   episode.interventions(), progress=False)

    agrees = np.ones(episode.length, bool)
    agrees[list(deviating)] = False
    assert result.first_error[agrees].max() < 1e-5
    assert result.chunk_error[agrees].max() < 1e-5
    np.testing.assert_allclose(result.first_error[~agrees], 20.0, rtol=1e-4)
    assert set(result.top_deviations(5)) <= set(deviating)
    summary = result.as_dict()
    assert summary["intervention_spans"] == [[INTERVENTION.start, INTERVENTION.stop]]
    assert summary["mean_chunk_error_during_interventions"] < 1e-5


def test_counterfactual_cli_with_a_flow_vla_checkpoint(recorded, tmp_path, monkeypatch):
    """`replay replay.counterfactual=true policy.path=...` end to end: loads the checkpoint, writes plot and JSON."""
    from robot_rl.commands import replay as replay_command
    from robot_rl.policies.flow_vla import FlowVLA
    from robot_rl.policies.text_encoder import InstructionEncoder
    from tests.learner_helpers import TEXT, tiny_policy_config

    monkeypatch.setattr(InstructionEncoder, "_shared", TEXT)  # offline stand-in: skip the 90 MB encoder load
    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    checkpoint = tmp_path / "ckpt"
    FlowVLA(config, text_encoder=TEXT).save_pretrained(checkpoint)
    root, episodes = recorded
    out = tmp_path / "out"
    code = replay_command.main([f"replay.dataset={root}", "replay.episode_indices=[1]", "replay.counterfactual=true",
                                f"policy.path={checkpoint}", f"output_dir={out}", f"robot.image_height={IMAGE}",
                                f"robot.image_width={IMAGE}", "replay.video=false", f"replay.seeds=[{EPISODES[1][0]}]"])
    assert code == 0
    summary = json.loads((out / "replay" / "replay.json").read_text())
    (episode,) = summary["episodes"]
    assert episode["episode"] == 1
    counterfactual = episode["counterfactual"]
    assert counterfactual["intervention_spans"] == [[INTERVENTION.start, INTERVENTION.stop]]
    assert counterfactual["mean_chunk_error"] > 0.0  # an untrained policy disagrees with the expert
    assert (out / "replay" / "episode_001.png").stat().st_size > 0
