"""A tiny LeRobot ACT built from scratch (no download) and saved in LeRobot's own layout.

``bench serve`` serves it from LeRobot's PolicyServer and from ours (the same weights from the same
directory), and the tests build it wherever they need a LeRobot checkpoint: nothing comes from the Hub.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors


def tiny_act_dir(directory: Path, *, cameras: tuple[str, ...] = ("front",), image_size: int = 16, joints: int = 6,
                 chunk_size: int = 4, use_vae: bool = True, seed: int = 0) -> Path:
    """A randomly initialised ACT (ResNet-18 backbone without pretrained weights) with normalisation
    statistics in its processors, written with ``save_pretrained`` as ``lerobot-train`` would."""
    torch.manual_seed(seed)
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (joints,))}
    inputs.update({f"observation.images.{cam}": PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size))
                   for cam in cameras})
    config = make_policy_config(
        "act", input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (joints,))},
        chunk_size=chunk_size, n_action_steps=chunk_size, dim_model=32, n_heads=2, dim_feedforward=64,
        n_encoder_layers=1, n_decoder_layers=1, latent_dim=8, use_vae=use_vae, pretrained_backbone_weights=None,
        device="cpu",
    )
    policy = get_policy_class("act")(config)
    image_stats = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
    stats = {"observation.state": {"mean": torch.full((joints,), 5.0), "std": torch.full((joints,), 5.0)},
             "action": {"mean": torch.full((joints,), 6.0), "std": torch.full((joints,), 5.0)},
             **{f"observation.images.{cam}": image_stats for cam in cameras}}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, preprocessor, postprocessor):
        part.save_pretrained(directory)
    return directory
