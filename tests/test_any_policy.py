"""Any policy, any command: ``robot-rl edge`` runs what ``robot-rl session`` runs (a LeRobot checkpoint,
``policy=hold`` as a dry run) against a learner on loopback, and a LeRobot checkpoint named by
``policy.path`` alone is recognised from its config.json by the learner and the edge."""

from __future__ import annotations

import json

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
