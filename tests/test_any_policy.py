"""Any policy, any command: ``robot-rl edge`` runs what ``robot-rl session`` runs (a LeRobot checkpoint,
``policy=hold`` as a dry run) against a learner on loopback, and a LeRobot checkpoint named by
``policy.path`` alone is recognised from its config.json by the learner and the edge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from tests.learner_helpers import learner_config, store_config, wait_for
from tests.lerobot_policies import one_torch_thread, tiny_act_dir  # noqa: F401 - one_torch_thread: autouse

CAMERAS = ("front", "wrist")
IMG = 32
SIM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
STEPS = 12


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    return tiny_act_dir(tmp_path_factory.mktemp("act"), cameras=CAMERAS, image_size=IMG, chunk_size=4)


def start_learner(root, policy):
    from robot_rl.learner.service import LearnerService

    config = learner_config(root)
    config.store = store_config(root / "store", background_commit=True, cameras=CAMERAS, image_height=IMG,
                                image_width=IMG, joint_names=SIM_JOINTS)
    return LearnerService(config, policy, train=False).start()


def edge_args(learner, out, *policy: str) -> list[str]:
    return [*policy, "robot=sim_so101", f"output_dir={out}", "session.episodes=1",
            f"session.max_episode_steps={STEPS}", "session.realtime=false", f"robot.image_height={IMG}",
            f"robot.image_width={IMG}", f"link.learner={learner.router_endpoint}",
            f"link.weights={learner.pub_endpoint}"]


def local_episode_lengths(out) -> list[int]:
    from robot_rl.data import load_episode_arrays

    return [len(e["action"]) for e in load_episode_arrays(out / "session", repo_id="local/robot_rl_session")]


@pytest.mark.parametrize("choice", [(),  # policy.path alone: recognised by its config.json
                                    ("policy=lerobot", "policy.lora_rank=4", "policy.lora_targets=[linear1,linear2]")],
                         ids=["path-alone", "lora"])
def test_the_edge_runs_a_lerobot_checkpoint_and_streams_it_to_the_learner_training_it(act_dir, tmp_path, choice):
    from robot_rl.app.policies import learner_policy
    from robot_rl.commands import edge
    from robot_rl.config import load_config

    policy = (f"policy.path={act_dir}", "policy.device=cpu", *choice)
    learner = start_learner(tmp_path / "learner", learner_policy(load_config(policy)))
    try:
        code = edge.main(edge_args(learner, tmp_path / "out", *policy))
        assert code == 0
        wait_for(lambda: learner.store.stats()["episodes_stored"] == 1, timeout_s=60, what="the episode stored")
    finally:
        learner.stop(checkpoint=False)
    assert "sim_so101" in learner.robots  # the hello's config hash admitted the ACT (or adapters) the learner trains
    assert local_episode_lengths(tmp_path / "out") == [STEPS]


def test_policy_hold_on_the_edge_is_a_dry_run_that_streams_nothing(act_dir, tmp_path):
    from robot_rl.commands import edge

    learner = start_learner(tmp_path / "learner", LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu"))
    try:
        assert edge.main(edge_args(learner, tmp_path / "out", "policy=hold")) == 0
        assert learner.store.flush(30)
        stored = learner.store.stats()["episodes_stored"]
    finally:
        learner.stop(checkpoint=False)
    assert stored == 0 and not learner.robots  # an arm held still by nobody teaches the learner nothing
    assert local_episode_lengths(tmp_path / "out") == [STEPS]  # the robot, cameras and recorder ran


def test_a_lerobot_checkpoint_named_by_policy_path_alone_is_run_as_policy_lerobot(act_dir):
    from robot_rl.app.policies import learner_policy, load_policy
    from robot_rl.config import load_config
    from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

    cfg = load_config([f"policy.path={act_dir}", "policy.device=cpu"])
    assert isinstance(cfg.policy, LeRobotPolicyConfig) and cfg.policy.path == str(act_dir)
    assert isinstance(learner_policy(cfg), LeRobotChunkPolicy)  # the learner's
    assert isinstance(load_policy(cfg), LeRobotChunkPolicy)  # the edge's and the session's


def test_a_policy_chosen_explicitly_is_kept_and_a_flowvla_checkpoint_is_not_taken_for_lerobot(act_dir, tmp_path):
    from robot_rl.config import ConfigError, load_config
    from robot_rl.policies.flow_vla.config import FlowVLAPolicyConfig

    flow = tmp_path / "flow"
    flow.mkdir()
    (flow / "config.json").write_text(json.dumps({"policy_type": "flow_vla", "format_version": 1}))
    assert isinstance(load_config([f"policy.path={flow}"]).policy, FlowVLAPolicyConfig)
    assert isinstance(load_config(["policy=flow_vla", f"policy.path={act_dir}"]).policy, FlowVLAPolicyConfig)
    with pytest.raises(ConfigError, match="policy=lerobot"):  # and the flow policy's loader says what to do
        from robot_rl.app.policies import load_policy

        load_policy(load_config(["policy=flow_vla", f"policy.path={act_dir}"]))


def test_edge_help_names_the_policies_it_runs(capsys):
    from robot_rl.cli import main

    assert main(["edge", "--help"]) == 0
    out = capsys.readouterr().out
    assert "policy=lerobot" in out and "policy=hold" in out and "dry run" in out


RUN_JOINTS = [f"{joint}.pos" for joint in reversed(SIM_JOINTS)]  # a dataset's names, in another order


@pytest.fixture(scope="module")
def act_top_dir(tmp_path_factory):
    """An ACT whose front camera is called "top" (camera_map {front: top})."""
    return tiny_act_dir(tmp_path_factory.mktemp("act_top"), cameras=("top", "wrist"), image_size=IMG, chunk_size=4)


def test_a_policy_reloaded_in_another_process_keeps_its_camera_map_and_joint_order(act_top_dir, tmp_path):
    import numpy as np

    from robot_rl.policies.loading import load_trainable

    policy = LeRobotChunkPolicy.from_pretrained(act_top_dir, device="cpu", camera_map={"front": "top"},
                                                joint_names=RUN_JOINTS)
    policy.save_pretrained(tmp_path / "start")  # what the main job hands its robot processes
    again = load_trainable(tmp_path / "start", **policy.loading_options())
    rng = np.random.default_rng(0)
    images = {cam: rng.integers(0, 256, (IMG, IMG, 3), dtype=np.uint8) for cam in CAMERAS}
    state = np.arange(1.0, 7.0, dtype=np.float32) * 2.0
    for each in (policy, again):
        each.bind_joints(SIM_JOINTS)
        each.eval()
    assert again.cameras == CAMERAS
    np.testing.assert_allclose(again.predict_chunk(images, state, "push"), policy.predict_chunk(images, state, "push"),
                               rtol=1e-5, atol=1e-5)
    unbound = load_trainable(tmp_path / "start", camera_map={"front": "top"})  # the checkpoint's order taken as ours
    unbound.eval()
    assert not np.allclose(unbound.predict_chunk(images, state, "push"), policy.predict_chunk(images, state, "push"))


@pytest.mark.slow
def test_the_main_job_trains_lora_adapters_of_a_lerobot_checkpoint_and_its_robot_swaps_to_them(act_top_dir, tmp_path):
    """``robot-rl run policy=lerobot policy.lora_rank=R`` with camera_map and joint_names: the learner publishes
    the adapters only, and the robot (in its own process) loads the base with them and swaps to newer ones."""
    from safetensors import safe_open

    from robot_rl.app.main_job import run_main_job
    from robot_rl.config import load_config
    from robot_rl.learner.published import HISTORY_FILE

    cfg = load_config([
        "policy=lerobot", f"policy.path={act_top_dir}", "policy.lora_rank=4", "policy.lora_targets=[linear1,linear2]",
        "+policy.camera_map={front:top}", f"policy.joint_names=[{','.join(RUN_JOINTS)}]",
        f"output_dir={tmp_path}", f"robot.image_height={IMG}", f"robot.image_width={IMG}", "demos.episodes=1",
        "run.num_robots=1", "run.episodes=4", "run.max_episode_steps=30", "run.time_budget_min=null",
        "run.min_updates=null", "run.eval_episodes=0", "run.heldout_scenes=0", "run.robots=process",
        "learner.trainer.batch_size=4", "learner.trainer.publish_every_updates=2",
        "learner.trainer.min_steps_to_train=8", "learner.service.router_endpoint=tcp://127.0.0.1:0",
        "learner.service.pub_endpoint=tcp://127.0.0.1:0", "learner.console.enabled=false",
        "learner.store.writer=thread", "learner.store.commit_linger_s=0", "learner.store.index_read_workers=0",
    ])
    summary = run_main_job(cfg)
    assert summary["episodes"] == 4 and summary["updates"] > 0
    assert summary["robot_versions"]["sim-0"] >= 1  # the robot swapped to adapters the learner published
    full = LeRobotChunkPolicy.from_pretrained(act_top_dir, device="cpu")
    full_bytes = sum(t.numel() * t.element_size() for t in full.published_state_dict().values())
    checkpoint = Path(summary["checkpoint"])
    published = [json.loads(line) for line in (checkpoint.parent / HISTORY_FILE).read_text().splitlines()]
    assert published and max(p["size_bytes"] for p in published) < full_bytes / 4
    with safe_open(str(checkpoint / "adapter_model.safetensors"), "pt") as saved:
        keys = list(saved.keys())
    assert keys and all("lora_" in key for key in keys)  # adapters only: the frozen base stays home
