"""A LeRobot SmolVLA (a tiny one, built offline) trained by the learner and hot-swapped on the edge.

What must hold for a vision-language-action checkpoint, as for ACT (tests/test_lerobot_training.py):
the learner's per-sample loss is SmolVLA's own (``forward(reduction="none")``) and a zero weight
removes a sample, an update changes the trainable (action expert) weights and lowers the loss,
the learner's checkpoint is a LeRobot checkpoint (``SmolVLAPolicy.from_pretrained``), a
publish lands in a running edge node mid-episode and changes its chunks, and ``rl`` distils the best
of candidates SmolVLA's own sampler draws from the algorithm's noise.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

from robot_rl.bench.policies import SMOLVLM_SIZES, smolvlm_directory
from robot_rl.core.clock import VirtualClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.node import EdgeNode
from robot_rl.learner.algorithms.config import RWRConfig
from robot_rl.learner.index import SampleSpec
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from robot_rl.policies.trainable import StateOffsets, TrainablePolicy
from tests.learner_helpers import BC, CAMERAS, IMG, trainer_config
from tests.lerobot_policies import (  # noqa: F401 - one_torch_thread: an autouse fixture
    ZERO_IMAGES,
    ZERO_STATE,
    one_torch_thread,
    swap_in_mid_episode,
)
from tests.test_learner_trainer import filled_index
from tests.test_stream_swap import CameraRobot, same_weights

CHUNK = 4
JOINTS = 6
VISION = SMOLVLM_SIZES["tiny"]["vision"]["image_size"]  # SmolVLA resizes (with padding) the 16x16 frames to it


def tiny_smolvla_dir(directory: Path, *, seed: int = 0) -> Path:
    """A randomly initialised SmolVLA over a tiny SmolVLM, with statistics in its processors, saved in
    ``directory / "policy"`` as ``lerobot-train`` would; nothing is downloaded.

    ``directory / "vlm"`` holds what ``vlm_model_name`` names (the bench's tiny SmolVLM: a 2-layer
    text model of width 64, a 1-layer vision tower on 64x64 images, a word-level tokenizer that knows
    the instruction's words); the policy goes to another folder because both write a config.json.
    ``num_vlm_layers=2`` with an expert at every second layer (``self_attn_every_n_layers=2``) of 0.75
    the width is the smallest layout where the expert both cross- and self-attends;
    ``tokenizer_max_length=16`` (the instruction is 3 tokens) and a chunk of 4, as the ACT tests.
    """
    vlm_dir, policy_dir = smolvlm_directory(directory / "vlm", "tiny"), directory / "policy"
    config = SmolVLAConfig(
        vlm_model_name=str(vlm_dir), load_vlm_weights=False,
        input_features={"observation.state": PolicyFeature(FeatureType.STATE, (JOINTS,)),
                        "observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, IMG, IMG))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (JOINTS,))},
        chunk_size=CHUNK, n_action_steps=CHUNK, resize_imgs_with_padding=(VISION, VISION), num_vlm_layers=2,
        self_attn_every_n_layers=2, expert_width_multiplier=0.75, tokenizer_max_length=16, device="cpu",
        push_to_hub=False)
    torch.manual_seed(seed)
    policy = SmolVLAPolicy(config)
    # The synthetic steps' joints lie in 0..12 (robot, episode, tick): roughly unit-scaled after this.
    joint_stats = {"mean": torch.full((JOINTS,), 5.0), "std": torch.full((JOINTS,), 5.0),
                   "min": torch.zeros(JOINTS), "max": torch.full((JOINTS,), 13.0)}
    stats = {"observation.state": dict(joint_stats), "action": dict(joint_stats)}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, preprocessor, postprocessor):
        part.save_pretrained(policy_dir)
    return policy_dir


@pytest.fixture(scope="module")
def smolvla_dir(tmp_path_factory):
    return tiny_smolvla_dir(tmp_path_factory.mktemp("smolvla"))


def load(smolvla_dir) -> LeRobotChunkPolicy:
    return LeRobotChunkPolicy.from_pretrained(smolvla_dir, device="cpu", state_offsets=StateOffsets(2))


def fixed_batch(size: int = 6) -> dict:
    return filled_index().sample(size, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0},
                                 SampleSpec(CHUNK, CAMERAS, 2), np.random.default_rng(0))


def seeded_chunk(policy, images, state) -> np.ndarray:
    """A chunk from fixed flow noise (SmolVLA draws it from torch's global RNG): chunks then differ
    only where the weights do."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return policy.predict_chunk(images, state, "pick the cube")


def trainable(policy: LeRobotChunkPolicy) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in policy.policy.named_parameters() if p.requires_grad}


def test_the_per_sample_loss_is_smolvlas_and_a_zero_weight_removes_a_sample(smolvla_dir):
    policy = load(smolvla_dir).train()
    assert isinstance(policy, TrainablePolicy) and policy.cameras == CAMERAS and policy.chunk_size == CHUNK
    batch = fixed_batch()
    lerobot_batch = policy.preprocessor(policy._to_lerobot_batch(batch))
    assert (lerobot_batch["observation.language.tokens"] != 1).all()  # no <unk>: the instruction is in the vocab
    batch["action_is_pad"][:] = False  # SmolVLA averages over all valid steps: equal counts make it the mean
    randomness = policy.draw_training_randomness(6, torch.Generator().manual_seed(0))
    loss, per_sample = policy.compute_loss(batch, **randomness)
    torch.manual_seed(randomness["seed"])  # the flow noise and times, as compute_loss seeds them
    lerobot_loss, _ = policy.policy.forward(policy.preprocessor(policy._to_lerobot_batch(batch)))
    assert per_sample.shape == (6,) and torch.allclose(loss, lerobot_loss, rtol=1e-5)
    assert per_sample.std() > 0  # distinct samples, else dropping one proves nothing
    weights = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    weighted, again = policy.compute_loss(batch, weights, **randomness)
    assert torch.allclose(again, per_sample) and torch.allclose(weighted, per_sample[1:].mean())
    assert not torch.allclose(weighted, loss)


def test_one_rwr_update_changes_the_expert_weights_and_lowers_the_loss_on_a_fixed_batch(smolvla_dir):
    policy = load(smolvla_dir)
    trainer = Trainer(policy, filled_index(), trainer_config(smolvla_dir / "unused", lr=1e-3),
                      RWRConfig(failures="keep"))
    batch = fixed_batch()
    # The update's own flow noise and times (a copy of its generator): the loss it descends.
    generator = torch.Generator()
    generator.set_state(trainer.algorithm.generator.get_state())
    randomness = policy.draw_training_randomness(6, generator)
    before_loss = float(policy.compute_loss(batch, **randomness)[0].detach())
    frozen = {k: v.clone() for k, v in policy.state_dict().items()}
    before = trainable(policy)
    assert 0 < len(before) < len(frozen)  # train_expert_only: the VLM is frozen
    metrics = trainer.algorithm.update(batch)
    assert metrics["skipped"] == 0.0
    assert metrics["loss"] == pytest.approx(before_loss, rel=1e-5)  # that loss it was (every weight is 1 here)
    changed = [k for k, v in trainable(policy).items() if not torch.equal(before[k], v)]
    assert len(changed) > len(before) // 2
    vlm = [k for k in frozen if k.startswith("model.vlm_with_expert.vlm.")]
    assert vlm and not set(vlm) & set(before)  # the VLM is frozen, so it is not among the trainable ones
    assert all(torch.equal(frozen[k], policy.state_dict()[k]) for k in vlm)
    assert float(policy.compute_loss(batch, **randomness)[0].detach()) < before_loss


def test_the_learners_checkpoint_is_a_lerobot_smolvla_checkpoint_and_resumes(smolvla_dir, tmp_path):
    config = trainer_config(tmp_path / "ckpt", lr=3e-3)
    trainer = Trainer(load(smolvla_dir), filled_index(), config, BC)
    for _ in range(3):
        trainer.update_once()
    saved = trainer.checkpoint()
    images = {"front": np.full((IMG, IMG, 3), 90, np.uint8)}
    state = np.arange(6, dtype=np.float32)
    expected = seeded_chunk(trainer.deployed.eval(), images, state)
    # LeRobot's own class loads it: the weights are the learner's, not the start's.
    reloaded = SmolVLAPolicy.from_pretrained(str(saved))
    assert same_weights(reloaded, trainer.policy) and not same_weights(reloaded, load(smolvla_dir))
    np.testing.assert_allclose(seeded_chunk(LeRobotChunkPolicy.from_pretrained(saved), images, state),
                               expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(seeded_chunk(load(smolvla_dir), images, state), expected)
    resumed = Trainer(load(smolvla_dir), filled_index(), config, BC)
    resumed.resume()
    assert resumed.step == 3 and same_weights(resumed.policy, trainer.policy)


def test_a_published_smolvla_policy_is_swapped_into_a_running_edge_node(smolvla_dir, tmp_path):
    running = load(smolvla_dir).eval()
    trainer = Trainer(load(smolvla_dir), filled_index(), trainer_config(tmp_path / "ckpt", lr=3e-3), BC)
    for _ in range(5):
        trainer.update_once()
    before = seeded_chunk(running, ZERO_IMAGES, ZERO_STATE)
    node, data = swap_in_mid_episode(running, trainer.deployed, tmp_path / "spool", "edge-smolvla")
    assert same_weights(node.running_policy, trainer.deployed)  # the frozen VLM is the same checkpoint's
    # After the node closed: no inference thread shares the RNG of the seeded chunk.
    assert not np.allclose(seeded_chunk(node.running_policy, ZERO_IMAGES, ZERO_STATE), before)
    assert node.stats.swap_failures == 0
    # Only what trains travels: the action expert and projections, not the frozen VLM.
    published = trainer.deployed.published_state_dict()
    assert published and not any(".vlm." in key for key in published)
    assert len(data) < sum(v.nbytes for v in trainer.deployed.state_dict().values()) / 2


def test_real_time_chunking_guides_the_first_actions_onto_what_the_queue_executes(smolvla_dir):
    policy = load(smolvla_dir)
    images, state = {"front": np.full((IMG, IMG, 3), 80, np.uint8)}, np.full(JOINTS, 3.0, np.float32)
    free = seeded_chunk(policy, images, state)
    prefix = free + 4.0  # an executing plan the free sample does not agree with (0.8 std off everywhere)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same flow noise as the free sample: only the guidance differs
        guided = policy.predict_chunk_guided(images, state, "pick the cube", prefix, delay=2)
    assert guided.shape == free.shape and np.isfinite(guided).all()
    # The frozen steps move onto the prefix; guidance fades after the delay, so they move most.
    assert np.abs(guided[:2] - prefix[:2]).mean() < 0.5 * np.abs(free[:2] - prefix[:2]).mean()


def test_an_edge_node_with_real_time_chunking_sends_the_pending_plan_with_each_request(smolvla_dir):
    policy = load(smolvla_dir)
    calls = []
    original = policy.predict_chunk_guided

    def recording(images, state, instruction, prefix, delay):
        calls.append((len(prefix), delay))
        return original(images, state, instruction, prefix, delay)

    policy.predict_chunk_guided = recording
    config = EdgeConfig(fps=30, mode="async_naive", real_time_chunking=True, simulated_latency_ms=50,
                        inference_runner="virtual", request_threshold=2)
    with EdgeNode(CameraRobot(), policy, VirtualClock(), config, robot_id="edge-rtc") as node:
        node.reset_episode("pick the cube")
        for _ in range(12):
            node.tick()
    assert calls and all(0 < pending <= CHUNK and delay >= 1 for pending, delay in calls)
    with pytest.raises(ValueError, match="async_naive"):
        EdgeConfig(mode="async_rollforward", real_time_chunking=True)
    from robot_rl.policies.hold import HoldPolicy

    with pytest.raises(ValueError, match="takes a frozen prefix"):
        EdgeNode(CameraRobot(), HoldPolicy(), VirtualClock(), config, robot_id="edge-hold")


def test_rl_trains_smolvla_on_best_of_n_candidates_from_its_own_sampler_with_controlled_noise(smolvla_dir):
    from robot_rl.learner.algorithms.config import RLConfig

    trainer = Trainer(load(smolvla_dir), filled_index(), trainer_config(smolvla_dir / "unused-rl", lr=1e-3),
                      RLConfig(critic_hidden=16, num_candidates=2, warmup_updates=0))
    algorithm = trainer.algorithm
    inputs = algorithm.encoder(fixed_batch(4))
    noise = torch.randn((8, *algorithm.candidates.noise_shape), generator=torch.Generator().manual_seed(1))
    first = algorithm.candidates(inputs, noise, next_observation=False)
    assert first.shape == (8, CHUNK, JOINTS)
    torch.testing.assert_close(algorithm.candidates(inputs, noise, next_observation=False), first)  # noise decides
    assert not torch.allclose(algorithm.candidates(inputs, noise.flip(0), next_observation=False), first)
    assert not torch.allclose(algorithm.candidates(inputs, noise, next_observation=True), first)  # the next state's
    before = trainable(trainer.policy)
    metrics = [trainer.update_once() for _ in range(3)]
    assert all(np.isfinite(m["loss"]) and np.isfinite(m["critic_loss"]) and m["distilling"] == 1.0 for m in metrics)
    assert metrics[0]["critic_loss"] != metrics[-1]["critic_loss"]
    after = trainable(trainer.policy)
    assert any(not torch.equal(after[k], before[k]) for k in before)  # best-of-N distilled into the expert
