"""LeRobot's pi0 and pi0.5 (their PaliGemma at the bench's tiny stand-in size, built offline) trained by
the learner, hot-swapped on the edge and sampled by ``rl``, as SmolVLA is (tests/test_lerobot_smolvla.py).

What must hold: the learner's per-sample loss is the policy's own (``forward(reduction="none")``) and
an update changes its weights; the learner's checkpoint loads in LeRobot's own class; a publish lands
in a running edge node mid-episode and changes its chunks; ``rl`` draws candidates from the policy's
own flow sampler, decided by the algorithm's noise. A checkpoint whose processor names the Hub's
PaliGemma tokenizer (as every pi0 checkpoint does) is refused offline in one line that names
``policy.tokenizer``, and runs with it pointed at a local copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.policies.factory import get_policy_class

from robot_rl.bench.paligemma import (
    PALIGEMMA_OPTIONS,
    paligemma_size,
    paligemma_tokenizer_directory,
    tokenizer_from,
)
from robot_rl.core.errors import ConfigError
from robot_rl.learner.algorithms.config import RLConfig
from robot_rl.learner.index import SampleSpec
from robot_rl.learner.trainer import Trainer
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
from robot_rl.policies.loading import load_trainable
from robot_rl.policies.trainable import StateOffsets
from tests.learner_helpers import BC, CAMERAS, IMG, trainer_config
from tests.lerobot_policies import (  # noqa: F401 - one_torch_thread: an autouse fixture
    ZERO_IMAGES,
    ZERO_STATE,
    one_torch_thread,
    swap_in_mid_episode,
)
from tests.test_learner_trainer import filled_index
from tests.test_stream_swap import same_weights

CHUNK = 4
JOINTS = 6
HUB_TOKENIZER = "google/paligemma-3b-pt-224"  # what LeRobot's pi0 and pi0.5 processors load


@pytest.fixture(scope="module", autouse=True)
def tiny_paligemma():
    """Every pi0 of this module, built or loaded, at the stand-in size (its config still says gemma_2b)."""
    with paligemma_size("tiny"):
        yield


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return paligemma_tokenizer_directory(tmp_path_factory.mktemp("paligemma-tokenizer"))


@pytest.fixture(scope="module", params=["pi0", "pi05"])
def checkpoint(request, tmp_path_factory, tokenizer_dir) -> Path:
    """A new pi0 (pi0.5) from the product's ``from_scratch`` with LeRobot's processors over the local
    tokenizer, saved in LeRobot's layout. The synthetic steps' joints lie in 0..12 (robot, episode, tick)."""
    rng = np.random.default_rng(0)
    episodes = [{"state": rng.uniform(0, 12, (20, JOINTS)).astype(np.float32),
                 "action": rng.uniform(0, 12, (20, JOINTS)).astype(np.float32), "instruction": "pick the cube",
                 "images.front": rng.integers(0, 256, (20, IMG, IMG, 3), dtype=np.uint8)}]
    options = {"chunk_size": CHUNK, "n_action_steps": CHUNK, **PALIGEMMA_OPTIONS["tiny"]}
    torch.manual_seed(0)
    with tokenizer_from(tokenizer_dir):
        policy = LeRobotChunkPolicy.from_scratch(LeRobotPolicyConfig(type=request.param, options=options,
                                                                     device="cpu"), episodes)
    directory = tmp_path_factory.mktemp(request.param)
    policy.save_pretrained(directory)
    return directory


def load(checkpoint: Path) -> LeRobotChunkPolicy:
    return LeRobotChunkPolicy.from_pretrained(checkpoint, device="cpu", state_offsets=StateOffsets(2))


def fixed_batch(size: int = 4) -> dict:
    return filled_index().sample(size, {"online": 1.0, "intervention": 1.0, "demonstration": 1.0},
                                 SampleSpec(CHUNK, CAMERAS, 2), np.random.default_rng(0))


def seeded_chunk(policy, images, state) -> np.ndarray:
    """A chunk from fixed flow noise (pi0 draws it from torch's global RNG): chunks differ only by weights."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return policy.predict_chunk(images, state, "pick the cube")


def trainable(policy: LeRobotChunkPolicy) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in policy.policy.named_parameters() if p.requires_grad}


def test_an_update_trains_on_the_policys_own_per_sample_loss_and_checkpoints_for_lerobot(checkpoint, tmp_path):
    policy = load(checkpoint)
    assert policy.cameras == CAMERAS and policy.chunk_size == CHUNK and policy.has_flow_sampler
    batch = fixed_batch()
    tokens = policy.preprocessor(policy._to_lerobot_batch(batch))["observation.language.tokens"]
    assert (tokens == 1).sum() < (tokens > 1).sum()  # the local tokenizer knows the prompt: few <unk> (id 1)
    randomness = policy.draw_training_randomness(4, torch.Generator().manual_seed(0))
    loss, per_sample = policy.compute_loss(batch, **randomness)
    torch.manual_seed(randomness["seed"])  # the flow noise and times, as compute_loss seeds them
    lerobot_loss, _ = policy.policy.forward(policy.preprocessor(policy._to_lerobot_batch(batch)), reduction="none")
    torch.testing.assert_close(per_sample, lerobot_loss)
    assert per_sample.std() > 0
    trainer = Trainer(policy, filled_index(), trainer_config(tmp_path / "ckpt", lr=1e-3), BC)
    before = trainable(policy)
    metrics = trainer.update_once()
    assert np.isfinite(metrics["loss"])
    changed = [k for k, v in trainable(policy).items() if not torch.equal(before[k], v)]
    assert len(changed) > len(before) // 2  # pi0 fine-tunes VLM and expert by default
    saved = trainer.checkpoint()
    reloaded = get_policy_class(policy.policy.config.type).from_pretrained(str(saved))  # LeRobot's own class
    assert same_weights(reloaded, trainer.policy) and not same_weights(reloaded, load(checkpoint))


def test_a_published_policy_is_swapped_into_a_running_edge_node(checkpoint, tmp_path):
    running = load(checkpoint).eval()
    trainer = Trainer(load(checkpoint), filled_index(), trainer_config(tmp_path / "ckpt", lr=3e-3), BC)
    for _ in range(2):
        trainer.update_once()
    before = seeded_chunk(running, ZERO_IMAGES, ZERO_STATE)
    node, data = swap_in_mid_episode(running, trainer.deployed, tmp_path / "spool", "edge-pi0")
    assert node.stats.swap_failures == 0 and same_weights(node.running_policy, trainer.deployed)
    assert len(data) > 0 and not np.allclose(seeded_chunk(node.running_policy, ZERO_IMAGES, ZERO_STATE), before)


def test_rl_draws_candidates_from_the_policys_own_sampler_with_controlled_noise(checkpoint):
    trainer = Trainer(load(checkpoint), filled_index(), trainer_config(checkpoint / "unused-rl", lr=1e-3),
                      RLConfig(critic_hidden=16, num_candidates=2, warmup_updates=0))
    algorithm = trainer.algorithm
    inputs = algorithm.encoder(fixed_batch(4))
    noise = torch.randn((8, *algorithm.candidates.noise_shape), generator=torch.Generator().manual_seed(1))
    first = algorithm.candidates(inputs, noise, next_observation=False)
    assert first.shape == (8, CHUNK, JOINTS)
    torch.testing.assert_close(algorithm.candidates(inputs, noise, next_observation=False), first)  # noise decides
    assert not torch.allclose(algorithm.candidates(inputs, noise.flip(0), next_observation=False), first)
    before = trainable(trainer.policy)
    metrics = trainer.update_once()
    assert np.isfinite(metrics["critic_loss"]) and metrics["distilling"] == 1.0
    assert any(not torch.equal(v, before[k]) for k, v in trainable(trainer.policy).items())


def test_a_checkpoint_naming_the_hub_tokenizer_is_refused_offline_in_one_line_and_runs_from_a_local_copy(
        checkpoint, tokenizer_dir, tmp_path):
    lab = shutil.copytree(checkpoint, tmp_path / "lab")
    processor = lab / "policy_preprocessor.json"
    saved = json.loads(processor.read_text())
    for step in saved["steps"]:
        if step["registry_name"] == "tokenizer_processor":
            step["config"]["tokenizer_name"] = HUB_TOKENIZER  # as LeRobot's factory writes it
    processor.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=f"tokenizer {HUB_TOKENIZER} .*policy.tokenizer=DIR") as refused:
        LeRobotChunkPolicy.from_policy_config(LeRobotPolicyConfig(path=str(lab)))
    assert "\n" not in str(refused.value)
    local = LeRobotChunkPolicy.from_policy_config(LeRobotPolicyConfig(path=str(lab), tokenizer=str(tokenizer_dir)))
    expected = seeded_chunk(load(checkpoint), ZERO_IMAGES, ZERO_STATE)
    np.testing.assert_allclose(seeded_chunk(local, ZERO_IMAGES, ZERO_STATE), expected, rtol=1e-5, atol=1e-5)
    # A process of the main job gets the directory and the loading policy's options, and loads it as it did.
    again = load_trainable(lab, **local.loading_options())
    np.testing.assert_allclose(seeded_chunk(again, ZERO_IMAGES, ZERO_STATE), expected, rtol=1e-5, atol=1e-5)
