"""LeRobotChunkPolicy: a randomly initialised ACT saved with its processors, loaded through the adapter."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded in tests

import numpy as np
import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors
from lerobot.policies.utils import prepare_observation_for_inference

from robot_rl.policies.base import ChunkPolicy
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

H, A, SIZE = 8, 6, 64


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory) -> str:
    """A tiny ACT (no pretrained backbone, no download) saved in LeRobot's layout with normalisation stats."""
    torch.manual_seed(0)
    config = make_policy_config(
        "act",
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, (A,)),
            "observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)),
            "observation.images.gripper": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (A,))},
        chunk_size=H, n_action_steps=H, dim_model=32, n_heads=2, dim_feedforward=64,
        n_encoder_layers=1, n_decoder_layers=1, use_vae=False, pretrained_backbone_weights=None, device="cpu",
    )
    policy = get_policy_class("act")(config)
    image_stats = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
    stats = {
        "observation.state": {"mean": torch.full((A,), 40.0), "std": torch.full((A,), 20.0)},
        "observation.images.front": image_stats,
        "observation.images.gripper": image_stats,
        "action": {"mean": torch.full((A,), 50.0), "std": torch.full((A,), 10.0)},
    }
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    directory = tmp_path_factory.mktemp("act")
    policy.save_pretrained(directory)
    preprocessor.save_pretrained(directory)
    postprocessor.save_pretrained(directory)
    return str(directory)


def inputs(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    rng = np.random.default_rng(seed)
    images = {cam: rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for cam in ("front", "wrist")}
    return images, rng.normal(40, 20, A).astype(np.float32), "pick up the cube"


def test_act_checkpoint_runs_as_a_chunk_policy(act_dir):
    adapter = LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", camera_map={"wrist": "gripper"})
    assert isinstance(adapter, ChunkPolicy)
    assert (adapter.chunk_size, adapter.action_dim) == (H, A)

    chunk = adapter.predict_chunk(*inputs())
    assert chunk.shape == (H, A) and chunk.dtype == np.float32 and np.isfinite(chunk).all()

    # Same numbers as LeRobot's own pipeline on LeRobot's own keys (i.e. un-normalised, robot units).
    images, state, task = inputs()
    frame = {"observation.images.front": images["front"], "observation.images.gripper": images["wrist"],
             "observation.state": state}
    with torch.no_grad():
        batch = adapter.preprocessor(prepare_observation_for_inference(frame, torch.device("cpu"), task=task))
        expected = adapter.postprocessor(adapter.policy.predict_action_chunk(batch))[0].numpy()
    np.testing.assert_allclose(chunk, expected, rtol=1e-5, atol=1e-5)
    assert abs(float(chunk.mean()) - 50.0) < 40.0  # unnormalised around the action mean, not around 0


def test_adapter_save_and_reload_predicts_the_same_chunk(act_dir, tmp_path):
    adapter = LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu", camera_map={"wrist": "gripper"})
    adapter.save_pretrained(tmp_path)
    again = LeRobotChunkPolicy.from_pretrained(tmp_path, device="cpu", camera_map={"wrist": "gripper"})
    np.testing.assert_array_equal(adapter.predict_chunk(*inputs(1)), again.predict_chunk(*inputs(1)))
    assert adapter.config_hash() == again.config_hash()


def test_clear_errors_for_bad_inputs_and_checkpoints(act_dir, tmp_path):
    adapter = LeRobotChunkPolicy.from_pretrained(act_dir, device="cpu")  # no camera_map: "wrist" is not "gripper"
    images, state, task = inputs()
    with pytest.raises(KeyError, match="observation.images.gripper"):
        adapter.predict_chunk(images, state, task)
    adapter.camera_map = {"wrist": "gripper"}
    with pytest.raises(ValueError, match="expects 6"):
        adapter.predict_chunk(images, state[:4], task)
    with pytest.raises(FileNotFoundError, match="missing"):
        LeRobotChunkPolicy.from_pretrained(tmp_path)  # empty directory
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LeRobotChunkPolicy.from_pretrained(tmp_path / "nope")
