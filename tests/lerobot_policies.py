"""Tiny LeRobot policies built from scratch (no download) and saved in LeRobot's own layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

from robot_rl.bench.lerobot_checkpoint import tiny_act_dir as tiny_act_dir  # the tests' import path
from tests.learner_helpers import IMG, JOINTS


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matrices gain nothing from a second intra-op thread, and on a shared CPU its barrier
    waits make each call of a small LeRobot policy a hundred times slower (seconds, not tens of ms).
    Autouse in every module that imports it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_diffusion_dir(directory: Path, *, cameras: tuple[str, ...] = ("front",), image_size: int = 16,
                       joints: int = 6, chunk_size: int = 4, horizon: int = 8, n_obs_steps: int = 1,
                       seed: int = 0) -> Path:
    """A randomly initialised Diffusion Policy: a 2-level U-Net (32, 64 channels), a ResNet-18 image
    encoder without pretrained weights and no random crop (the frames are smaller than its default
    84), 4 denoising steps at inference, ``n_obs_steps`` observations (LeRobot's default is 2), and
    a horizon twice the executed chunk; group norm instead of batch norm (the paper's choice without
    pretrained weights; batch norm cannot even size a 16x16 frame's 1x1 features from one sample)."""
    torch.manual_seed(seed)
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (joints,))}
    inputs.update({f"observation.images.{cam}": PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size))
                   for cam in cameras})
    config = make_policy_config(
        "diffusion", input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (joints,))},
        n_obs_steps=n_obs_steps, horizon=horizon, n_action_steps=chunk_size, down_dims=(32, 64), kernel_size=3,
        diffusion_step_embed_dim=32, spatial_softmax_num_keypoints=8, crop_shape=None, pretrained_backbone_weights=None,
        num_train_timesteps=20, num_inference_steps=4, drop_n_last_frames=horizon - chunk_size - n_obs_steps + 1,
        use_group_norm=True,
        device="cpu",
    )
    policy = get_policy_class("diffusion")(config)
    image_stats = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25),
                   "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
    joint_stats = {"mean": torch.full((joints,), 5.0), "std": torch.full((joints,), 5.0),
                   "min": torch.zeros(joints), "max": torch.full((joints,), 13.0)}
    stats = {"observation.state": dict(joint_stats), "action": dict(joint_stats),
             **{f"observation.images.{cam}": image_stats for cam in cameras}}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, preprocessor, postprocessor):
        part.save_pretrained(directory)
    return directory


def swap_in_mid_episode(running: Any, published: Any, spool: Path, robot_id: str) -> tuple[Any, bytes]:
    """Hand ``published`` (the learner's deployed policy) to an EdgeStreamer as the link would, while
    an EdgeNode runs ``running`` mid-episode; tick until it swaps. Returns (the node, closed; the bytes
    that travelled)."""
    from robot_rl.core.clock import VirtualClock
    from robot_rl.edge.config import EdgeConfig
    from robot_rl.edge.learner_link import EdgeStreamer
    from robot_rl.edge.node import EdgeNode
    from robot_rl.learner.publisher import snapshot
    from tests.learner_helpers import client_config, wait_for
    from tests.test_stream_swap import CameraRobot

    class Nowhere:  # the link never connects
        router_endpoint, pub_endpoint = "tcp://127.0.0.1:9", None

    streamer = EdgeStreamer(client_config(robot_id, Nowhere, spool, policy_version=0,
                                          config_hash=running.config_hash()), running)
    node = EdgeNode(CameraRobot(), running, VirtualClock(), EdgeConfig(fps=30, simulated_latency_ms=40),
                    robot_id=robot_id, policy_version=0)
    node.step_sink = None  # only the weights path is under test here
    streamer.node = node
    streamer.start()
    try:
        node.reset_episode("pick the cube")
        for _ in range(6):
            node.tick()  # mid-episode: chunks are being executed when the weights arrive
        blob = snapshot(published, 1, published.config_hash())
        streamer._on_weights(blob.announce(), bytearray(blob.data))
        wait_for(lambda: node.tick().policy_version == 1, what="swap to v1")
    finally:
        streamer.stop()
        node.close()
    return node, blob.data


# What the swap tests ask a policy before and after (the test robots' camera and joints).
ZERO_IMAGES, ZERO_STATE = {"front": np.zeros((IMG, IMG, 3), np.uint8)}, np.zeros(len(JOINTS), np.float32)
