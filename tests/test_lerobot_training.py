"""A LeRobot policy (a tiny ACT from scratch) trained by the learner and hot-swapped on the edge.

What must hold for a lab's own checkpoint: the learner's per-sample loss is LeRobot's loss, an
update lowers it, the learner's checkpoint is a LeRobot checkpoint (``from_pretrained`` in
LeRobot itself), a publish lands in a running edge node between chunks and changes its chunks,
``awr`` weights it with a critic on an encoder of its own, and ``rl``, whose candidates need a flow
sampler (SmolVLA's: tests/test_lerobot_smolvla.py), refuses ACT in one line.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from lerobot.policies.factory import get_policy_class

from robot_rl.config import ConfigError
from robot_rl.learner.algorithms.config import ALGORITHMS, AWRConfig, RLConfig, RWRConfig
from robot_rl.learner.index import SampleSpec
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from robot_rl.policies.trainable import StateOffsets, TrainablePolicy
from tests.learner_helpers import BC, CAMERAS, IMG, trainer_config, wait_for
from tests.lerobot_policies import (  # noqa: F401 - one_torch_thread: an autouse fixture
    ZERO_IMAGES,
    ZERO_STATE,
    one_torch_thread,
    swap_in_mid_episode,
    tiny_act_dir,
    tiny_diffusion_dir,
)
from tests.test_learner_trainer import filled_index
from tests.test_stream_swap import same_weights

CHUNK = 4


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    return tiny_act_dir(tmp_path_factory.mktemp("act"), cameras=CAMERAS, image_size=IMG, chunk_size=CHUNK)


def load(act_dir) -> LeRobotChunkPolicy:
    return LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", state_offsets=StateOffsets(2))


def fixed_batch(size: int = 6) -> dict:
    return filled_index().sample(size, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0},
                                 SampleSpec(CHUNK, CAMERAS, 2), np.random.default_rng(0))


def test_the_per_sample_loss_is_lerobots_and_a_zero_weight_removes_a_sample(act_dir):
    policy = load(act_dir).train()
    assert isinstance(policy, TrainablePolicy) and policy.cameras == CAMERAS
    batch = fixed_batch()
    batch["action_is_pad"][:] = False  # LeRobot averages over all valid steps: equal counts make it the mean
    randomness = policy.draw_training_randomness(6, torch.Generator().manual_seed(0))
    loss, per_sample = policy.compute_loss(batch, **randomness)
    torch.manual_seed(randomness["seed"])  # the VAE's latent draw, as compute_loss seeds it
    lerobot_loss, _ = policy.policy.forward(policy.preprocessor(policy._to_lerobot_batch(batch)))
    assert per_sample.shape == (6,) and torch.allclose(loss, lerobot_loss, rtol=1e-5)
    weights = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    weighted, again = policy.compute_loss(batch, weights, **randomness)
    assert torch.allclose(again, per_sample) and torch.allclose(weighted, per_sample[1:].mean())


def test_one_rwr_update_changes_the_weights_and_lowers_the_loss_on_a_fixed_batch(act_dir):
    policy = load(act_dir)
    trainer = Trainer(policy, filled_index(), trainer_config(act_dir / "unused", lr=1e-3), RWRConfig(failures="keep"))
    batch = fixed_batch()
    randomness = policy.draw_training_randomness(6, torch.Generator().manual_seed(1))
    before_loss = float(policy.compute_loss(batch, **randomness)[0].detach())
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    metrics = trainer.algorithm.update(batch)
    assert metrics["skipped"] == 0.0
    changed = [k for k, v in policy.state_dict().items() if not torch.equal(before[k], v)]
    assert len(changed) > len(before) // 2
    assert float(policy.compute_loss(batch, **randomness)[0].detach()) < before_loss


def test_the_learners_checkpoint_is_a_lerobot_checkpoint_and_resumes(act_dir, tmp_path):
    config = trainer_config(tmp_path / "ckpt")
    trainer = Trainer(load(act_dir), filled_index(), config, BC)
    for _ in range(3):
        trainer.update_once()
    saved = trainer.checkpoint()
    images = {"front": np.full((IMG, IMG, 3), 90, np.uint8)}
    state = np.arange(6, dtype=np.float32)
    expected = trainer.deployed.eval().predict_chunk(images, state, "pick the cube")
    # LeRobot's own classes load it: the weights are the learner's, not the start's.
    reloaded = get_policy_class("act").from_pretrained(str(saved))
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in reloaded.state_dict().items())
    np.testing.assert_allclose(LeRobotChunkPolicy.from_pretrained(saved).predict_chunk(images, state, "pick the cube"),
                               expected, rtol=1e-5, atol=1e-5)
    resumed = Trainer(load(act_dir), filled_index(), config, BC)
    resumed.resume()
    assert resumed.step == 3 and same_weights(resumed.policy, trainer.policy)


def test_a_published_lerobot_policy_is_swapped_into_a_running_edge_node(act_dir, tmp_path):
    running = load(act_dir).eval()
    trainer = Trainer(load(act_dir), filled_index(), trainer_config(tmp_path / "ckpt", lr=3e-3), BC)
    for _ in range(5):
        trainer.update_once()
    before = running.predict_chunk(ZERO_IMAGES, ZERO_STATE, "pick the cube")
    node, _ = swap_in_mid_episode(running, trainer.deployed, tmp_path / "spool", "edge-act")
    assert same_weights(node.running_policy, trainer.deployed)
    assert not np.allclose(node.running_policy.predict_chunk(ZERO_IMAGES, ZERO_STATE, "pick the cube"), before)
    assert node.stats.swap_failures == 0


def test_awr_weights_a_lerobot_policy_with_a_critic_on_its_own_encoder_and_resumes_it(act_dir, tmp_path):
    config = trainer_config(tmp_path / "ckpt", batch_size=8)
    trainer = Trainer(load(act_dir), filled_index(), config, AWRConfig(critic_hidden=16))
    encoder = trainer.algorithm.extra_modules()["critic_encoder"]
    start_policy = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    start_encoder = {k: v.clone() for k, v in encoder.state_dict().items()}
    metrics = [trainer.update_once() for _ in range(3)]
    assert all(np.isfinite(m["value_loss"]) and m["ess"] < 8 for m in metrics)  # advantages weight the samples
    assert any(not torch.equal(v, start_policy[k]) for k, v in trainer.policy.state_dict().items())
    assert any(not torch.equal(v, start_encoder[k]) for k, v in encoder.state_dict().items())
    # The features read the instruction and the images, not the policy.
    batch = fixed_batch(4)
    features = trainer.algorithm.encoder(batch).features
    other_task = trainer.algorithm.encoder({**batch, "instruction": ["open the drawer"] * 4}).features
    dark = trainer.algorithm.encoder({**batch, "images.front": torch.zeros_like(batch["images.front"])}).features
    assert not torch.allclose(features, other_task) and not torch.allclose(features, dark)

    trainer.checkpoint()
    expected = trainer.update_once()
    resumed = Trainer(load(act_dir), filled_index(), config, AWRConfig(critic_hidden=16))
    resumed.resume()
    assert resumed.update_once() == expected and same_weights(resumed.policy, trainer.policy)


def test_rl_refuses_a_lerobot_policy_in_one_line_naming_what_trains_it(act_dir):
    with pytest.raises(ConfigError, match="flow sampler.*learner=bc, hgdagger, rwr or awr"):
        ALGORITHMS.build(RLConfig(), load(act_dir), trainer_config(act_dir / "unused"), torch.device("cpu"))


def synthetic_episodes(n: int = 3, length: int = 12) -> list[dict]:
    """Episodes whose action is the state plus one: a target that a few BC steps can learn."""
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(n):
        state = rng.normal(5, 3, (length, 6)).astype(np.float32)
        episodes.append({"state": state, "action": state + 1, "instruction": "pick the cube",
                         "images.front": rng.integers(0, 256, (length, IMG, IMG, 3), dtype=np.uint8)})
    return episodes


def test_behaviour_cloning_builds_a_new_lerobot_policy_from_the_episodes_and_saves_a_lerobot_checkpoint(tmp_path):
    from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
    from robot_rl.policies.loading import load_trainable
    from robot_rl.policies.training import fit

    config = LeRobotPolicyConfig(type="act", device="cpu", max_state_offset=1, options={
        "chunk_size": CHUNK, "n_action_steps": CHUNK, "dim_model": 32, "n_heads": 2, "dim_feedforward": 64,
        "n_encoder_layers": 1, "n_decoder_layers": 1, "use_vae": False})
    episodes = synthetic_episodes()
    policy = LeRobotChunkPolicy.from_scratch(config, episodes)
    assert policy.cameras == ("front",) and policy.state_dim == 6 and not policy.needs_statistics()
    assert policy.policy.config.pretrained_backbone_weights is None  # nothing downloaded
    stats = fit(policy, episodes, steps=25, batch_size=8, lr=1e-3, device="cpu", progress=False, log_every=5)
    assert stats["final_loss"] < stats["initial_loss"]
    policy.save_pretrained(tmp_path / "bc")
    again = load_trainable(tmp_path / "bc")
    assert isinstance(again, LeRobotChunkPolicy) and same_weights(again, policy)
    with pytest.raises(ConfigError, match="policy.type"):
        LeRobotChunkPolicy.from_scratch(LeRobotPolicyConfig(), episodes)


def test_the_learner_command_starts_from_the_lerobot_checkpoint_and_never_a_random_flowvla(act_dir, tmp_path):
    from robot_rl.app.policies import NoCheckpointError, learner_policy
    from robot_rl.config import load_config

    policy = learner_policy(load_config(["policy=lerobot", f"policy.path={act_dir}"]))
    assert isinstance(policy, LeRobotChunkPolicy)
    assert same_weights(policy, load(act_dir))
    with pytest.raises(NoCheckpointError):
        learner_policy(load_config(["policy=lerobot", f"output_dir={tmp_path}"]))


def test_with_lora_only_the_adapters_train_travel_and_reload_on_their_base(act_dir, tmp_path):
    from peft import PeftConfig, PeftModel, get_peft_model_state_dict

    from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

    config = LeRobotPolicyConfig(path=str(act_dir), device="cpu", max_state_offset=2, lora_rank=4,
                                 lora_targets=["linear1", "linear2"])  # ACT has no LeRobot default targets
    policy = LeRobotChunkPolicy.from_policy_config(config)
    full = load(act_dir)
    adapters = policy.state_dict()
    assert adapters and all("lora_" in k for k in adapters)
    assert sum(v.numel() for v in adapters.values()) < sum(v.numel() for v in full.state_dict().values()) / 50
    lora_ids = {id(p) for n, p in policy.named_parameters() if "lora_" in n}
    assert {id(p) for p in policy.trainable_parameters()} == lora_ids
    assert policy.config_hash() != full.config_hash()  # robots without these adapters must not take them

    trainer = Trainer(policy, filled_index(), trainer_config(tmp_path / "ckpt", lr=1e-2), BC)
    for _ in range(3):
        trainer.update_once()
    fresh = LeRobotChunkPolicy.from_policy_config(config)  # what a robot of this config starts with
    assert not same_weights(trainer.policy, fresh)
    saved = trainer.checkpoint()
    assert not (saved / "model.safetensors").exists()  # the frozen base is not copied into every checkpoint
    # LeRobot's own way (lerobot.policies.factory.make_policy, use_peft): the base its adapter config names,
    # then PEFT's adapters on top.
    peft_config = PeftConfig.from_pretrained(str(saved))
    base = get_policy_class("act").from_pretrained(peft_config.base_model_name_or_path)
    lerobot_model = PeftModel.from_pretrained(base, str(saved), config=peft_config)
    trained = trainer.policy.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in get_peft_model_state_dict(lerobot_model).items())
    again = LeRobotChunkPolicy.from_pretrained(saved, device="cpu")
    assert again.lora is not None and same_weights(again, trainer.policy)
    assert again.config_hash() == policy.config_hash()
    # A robot of the same config takes the published adapters, and its chunks become the learner's.
    fresh.load_state_dict(trainer.deployed.state_dict())
    images, state = {"front": np.full((IMG, IMG, 3), 60, np.uint8)}, np.arange(6, dtype=np.float32)
    np.testing.assert_allclose(fresh.eval().predict_chunk(images, state, "pick the cube"),
                               trainer.policy.eval().predict_chunk(images, state, "pick the cube"), atol=1e-5)


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory):
    return tiny_diffusion_dir(tmp_path_factory.mktemp("diffusion"), cameras=CAMERAS, image_size=IMG,
                              chunk_size=CHUNK, horizon=2 * CHUNK)


def test_diffusion_trains_on_its_horizon_with_lerobots_loss_and_runs_its_chunk(diffusion_dir, tmp_path):
    policy = LeRobotChunkPolicy.from_pretrained(diffusion_dir, device="cpu", state_offsets=StateOffsets(2))
    assert (policy.chunk_size, policy.training_horizon) == (CHUNK, 2 * CHUNK)
    batch = filled_index().sample(6, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0},
                                  SampleSpec(2 * CHUNK, CAMERAS, 2), np.random.default_rng(0))
    batch["action_is_pad"][:] = False
    randomness = policy.draw_training_randomness(6, torch.Generator().manual_seed(0))
    policy.train()
    loss, per_sample = policy.compute_loss(batch, **randomness)
    torch.manual_seed(randomness["seed"])  # the noise and diffusion steps LeRobot's compute_loss draws, in its order
    lerobot_batch = policy._with_time_axis(policy.preprocessor(policy._to_lerobot_batch(batch)))
    lerobot_loss, _ = policy.policy.forward(lerobot_batch)
    assert per_sample.shape == (6,) and torch.allclose(loss, lerobot_loss, rtol=1e-5)

    trainer = Trainer(policy, filled_index(), trainer_config(tmp_path / "ckpt", lr=1e-3), RWRConfig(failures="keep"))
    trainer.algorithm.update(batch)
    assert float(policy.compute_loss(batch, **randomness)[0].detach()) < float(loss.detach())
    saved = trainer.checkpoint()
    reloaded = get_policy_class("diffusion").from_pretrained(str(saved))
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in reloaded.state_dict().items())
    chunk = LeRobotChunkPolicy.from_pretrained(saved).predict_chunk(
        {"front": np.zeros((IMG, IMG, 3), np.uint8)}, np.zeros(6, np.float32), "pick the cube")
    assert chunk.shape == (CHUNK, 6) and np.isfinite(chunk).all()


def test_a_policy_other_than_diffusion_that_reads_past_observations_is_refused_in_one_line(tmp_path):
    """Diffusion's history is stacked (tests/test_lerobot_history.py); VQ-BeT keeps queues of its own."""
    from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

    config = LeRobotPolicyConfig(type="vqbet", options={"n_obs_steps": 2, "crop_shape": None})
    with pytest.raises(ConfigError, match="n_obs_steps=2 observations; robot_rl stacks observation history for "
                                          "diffusion only"):
        LeRobotChunkPolicy.from_scratch(config, synthetic_episodes())


def test_a_session_refuses_a_lerobot_policy_whose_cameras_the_robot_lacks(act_dir):
    from types import SimpleNamespace

    from robot_rl.session.runner import check_policy_fits

    policy = load(act_dir)
    check_policy_fits(policy, SimpleNamespace(name="arm", camera_names=("front", "top"), joint_names=tuple("abcdef")))
    with pytest.raises(ConfigError, match=r"reads cameras \['front'\]"):
        check_policy_fits(policy, SimpleNamespace(name="arm", camera_names=("top",), joint_names=tuple("abcdef")))
    with pytest.raises(ConfigError, match="drives 6 joints"):
        check_policy_fits(policy, SimpleNamespace(name="arm", camera_names=("front",), joint_names=("a", "b")))


def test_states_and_actions_keep_their_joint_by_name_when_the_robot_lists_joints_in_another_order(act_dir):
    """The checkpoint's joints a..f against a robot that lists them f..a: every joint's state reaches
    the policy's input for that joint, and its action (in that joint's units) comes back to it."""
    from types import SimpleNamespace

    from robot_rl.session.runner import check_policy_fits

    trained_order, robot_order = list("abcdef"), list("fedcba")
    plain = load(act_dir).eval()
    named = LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", state_offsets=StateOffsets(2),
                                               joint_names=trained_order).eval()
    check_policy_fits(named, SimpleNamespace(name="arm", camera_names=("front",), joint_names=tuple(robot_order)))
    to_robot = [trained_order.index(j) for j in robot_order]
    images = {"front": np.full((IMG, IMG, 3), 90, np.uint8)}
    state = np.arange(6, dtype=np.float32) * 3.0  # in the trained order
    expected = plain.predict_chunk(images, state, "pick the cube")
    chunk = named.predict_chunk(images, state[to_robot], "pick the cube")  # the robot's order in and out
    np.testing.assert_allclose(chunk, expected[:, to_robot], rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected[:, to_robot], expected, atol=1e-3)  # the order does matter here

    # Training reads the store's (the robot's) order the same way: the same per-sample losses.
    batch = fixed_batch(4)
    reordered = {**batch, "state": batch["state"][:, to_robot], "actions": batch["actions"][..., to_robot]}
    _, by_index = plain.compute_loss(batch, seed=3)
    _, by_name = named.compute_loss(reordered, seed=3)
    torch.testing.assert_close(by_name, by_index)

    with pytest.raises(ConfigError, match=r"the robot lacks \['f'\]; the policy lacks \['g'\]"):
        named.bind_joints(list("abcdeg"))
    with pytest.raises(ConfigError, match="names 2 joints"):
        LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", joint_names=["a", "b"])


def test_the_learner_takes_the_joint_order_from_the_first_hello_and_refuses_a_robot_it_cannot_match(act_dir,
                                                                                                     tmp_path):
    from robot_rl.bridges.zmq.streaming import StreamingClient
    from robot_rl.core.layout import RecordedLayout
    from robot_rl.learner.service import LearnerService
    from tests.learner_helpers import JOINTS, client_config, learner_config
    from tests.test_learner_layout import ROBOT, UNPINNED

    def link(name: str, learner: LearnerService, layout: RecordedLayout) -> StreamingClient:
        return StreamingClient(client_config(name, learner, tmp_path / "spools", features=layout.to_document(),
                                             config_hash=learner.policy.config_hash(), refused_retry_s=0.5)).start()

    def learner_with_named_joints() -> LearnerService:
        config = learner_config(tmp_path / "learner")
        config.store = type(config.store)(**{**config.store.__dict__, **UNPINNED})
        policy = LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", joint_names=list(reversed(JOINTS)))
        return LearnerService(config, policy, train=False).start()

    learner = learner_with_named_joints()
    try:
        assert learner.policy.joint_order is None  # no robot has said which order it streams in
        renamed = RecordedLayout(30, (*JOINTS[:-1], "elbow_2"), dict(ROBOT.camera_shapes))
        stranger = link("so101-b", learner, renamed)
        wait_for(lambda: stranger.refusal is not None, what="the refusal of a robot with other joint names")
        assert "policy.joint_names" in stranger.refusal and "'elbow_2'" in stranger.refusal
        assert "\n" not in stranger.refusal and learner.store.layout is None  # the store adopted nothing
        robot = link("so101-a", learner, ROBOT)
        assert robot.wait_connected(20.0)
        assert list(learner.policy.joint_order.robot_index) == list(reversed(range(len(JOINTS))))
        for client in (robot, stranger):
            client.stop()
    finally:
        learner.stop(checkpoint=False)
    again = learner_with_named_joints()  # a restart binds from the store's layout before any hello
    try:
        assert list(again.policy.joint_order.robot_index) == list(reversed(range(len(JOINTS))))
    finally:
        again.stop(checkpoint=False)
