"""Run any LeRobot policy (ACT, Diffusion, SmolVLA, pi0, ...) as a ``ChunkPolicy``.

Loading goes entirely through LeRobot's own machinery, so a checkpoint trained with
``lerobot-train`` behaves here exactly as in LeRobot: the policy class is resolved from
the saved config (``lerobot.policies.factory.get_policy_class``), weights load with
``PreTrainedPolicy.from_pretrained``, and the saved pre/post-processor pipelines
(normalisation, tokenisation, device placement) with ``make_pre_post_processors``.

The adapter only translates between the two worlds:
    our camera name "front"      -> "observation.images.front" (or a renamed key, see camera_map)
    our state vector             -> "observation.state"
    our instruction              -> "task"
and returns the *whole* predicted chunk (``predict_action_chunk``), not one action at a
time, because the edge runtime does its own chunk scheduling and roll-forward.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.policies.utils import prepare_observation_for_inference
from lerobot.utils.constants import (
    ACTION,
    OBS_IMAGES,
    OBS_STATE,
    POLICY_POSTPROCESSOR_DEFAULT_NAME,
    POLICY_PREPROCESSOR_DEFAULT_NAME,
)

from robot_rl.policies.base import validate_chunk
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig

# Config fields that say where/how a policy runs, not what it computes.
_RUNTIME_FIELDS = {"device", "use_amp", "push_to_hub", "repo_id", "private", "tags", "license", "pretrained_path"}


class LeRobotChunkPolicy:
    """A LeRobot ``PreTrainedPolicy`` plus its processors, behind the ChunkPolicy protocol.

    ``camera_map`` maps our camera names to LeRobot's (``{"wrist": "gripper"}`` feeds our
    "wrist" image to ``observation.images.gripper``); unmapped cameras keep their name.
    """

    def __init__(self, policy: PreTrainedPolicy, preprocessor: Any, postprocessor: Any,
                 camera_map: dict[str, str] | None = None, chunk_size: int | None = None):
        self.policy = policy.eval()
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.camera_map = dict(camera_map or {})
        config = policy.config
        if ACTION not in config.output_features:
            raise ValueError(f"LeRobot policy {config.type!r} has no {ACTION!r} output feature")
        self.action_dim: int = int(config.output_features[ACTION].shape[0])
        self.chunk_size: int = chunk_size or _native_chunk_size(config)
        self.state_dim: int | None = (int(config.input_features[OBS_STATE].shape[0])
                                      if OBS_STATE in config.input_features else None)
        self.image_keys: list[str] = list(config.image_features)
        self.policy.reset()

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_policy_config(cls, config: LeRobotPolicyConfig) -> LeRobotChunkPolicy:
        """``policy=lerobot``: the LeRobot checkpoint at ``config.path``."""
        if not config.path:
            raise ValueError("policy=lerobot needs policy.path=DIR_OR_HUB_ID (a LeRobot policy checkpoint)")
        return cls.from_pretrained(config.path, device=config.device, camera_map=config.camera_map or None)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, device: str | torch.device | None = None,
                        camera_map: dict[str, str] | None = None, chunk_size: int | None = None,
                        revision: str | None = None) -> LeRobotChunkPolicy:
        """Load policy and processors from a local directory or a Hugging Face Hub repo id."""
        source = str(name_or_path)
        local = Path(source).expanduser()
        if source.startswith((".", "/", "~")) and not local.is_dir():
            raise FileNotFoundError(f"LeRobot checkpoint directory {local} does not exist")
        if local.is_dir():
            source = str(local)
            missing = [n for n in ("config.json", "model.safetensors", f"{POLICY_PREPROCESSOR_DEFAULT_NAME}.json",
                                   f"{POLICY_POSTPROCESSOR_DEFAULT_NAME}.json") if not (local / n).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{local} is not a complete LeRobot policy checkpoint: missing {missing}. Save the policy "
                    "with policy.save_pretrained(dir) and its processors with preprocessor.save_pretrained(dir) "
                    "and postprocessor.save_pretrained(dir)."
                )
        config = PreTrainedConfig.from_pretrained(source, revision=revision)
        if device is not None:
            config.device = str(device)
        policy = get_policy_class(config.type).from_pretrained(source, config=config, revision=revision)
        preprocessor, postprocessor = make_pre_post_processors(
            config,
            pretrained_path=source,
            pretrained_revision=revision,
            preprocessor_overrides={"device_processor": {"device": str(config.device)}},
        )
        return cls(policy, preprocessor, postprocessor, camera_map=camera_map, chunk_size=chunk_size)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write policy and processors in LeRobot's layout (loadable by LeRobot and by this adapter)."""
        directory = Path(directory)
        self.policy.save_pretrained(directory)
        self.preprocessor.save_pretrained(directory)
        self.postprocessor.save_pretrained(directory)

    def config_hash(self) -> str:
        """sha256 of the policy config minus run-time fields: equal hashes mean compatible weights."""
        fields = {k: v for k, v in dataclasses.asdict(self.policy.config).items() if k not in _RUNTIME_FIELDS}
        blob = json.dumps({"type": self.policy.config.type, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    # ------------------------------------------------------------------ inference
    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray:
        """Images by camera (uint8 HxWx3), state, instruction -> float32[chunk_size, action_dim] in robot units."""
        frame = self._to_lerobot_frame(observation, state)
        device = torch.device(str(self.policy.config.device))
        with torch.no_grad():
            batch = self.preprocessor(prepare_observation_for_inference(frame, device, task=instruction))
            actions = self.policy.predict_action_chunk(batch)
            if actions.ndim == 2:  # some policies drop the batch dimension
                actions = actions[None]
            actions = self.postprocessor(actions)
        chunk = actions[0, : self.chunk_size].float().cpu().numpy()
        return validate_chunk(chunk, self.chunk_size, self.action_dim)

    def _to_lerobot_frame(self, observation: dict[str, np.ndarray], state: np.ndarray) -> dict[str, np.ndarray]:
        """Rename our inputs to LeRobot's feature keys, checking that every expected image is there."""
        frame: dict[str, np.ndarray] = {}
        for ours, image in observation.items():
            frame[f"{OBS_IMAGES}.{self.camera_map.get(ours, ours)}"] = np.ascontiguousarray(image)
        absent = [k for k in self.image_keys if k not in frame]
        if absent:
            raise KeyError(f"the LeRobot policy needs images {absent}; got cameras {sorted(observation)} "
                           f"(camera_map={self.camera_map}). Pass camera_map to rename cameras.")
        frame = {k: v for k, v in frame.items() if k in self.image_keys}
        if self.state_dim is not None:
            state = np.asarray(state, dtype=np.float32).reshape(-1)
            if state.shape != (self.state_dim,):
                raise ValueError(f"state has {state.size} values, the LeRobot policy expects {self.state_dim}")
            frame[OBS_STATE] = state
        return frame


def _native_chunk_size(config: PreTrainedConfig) -> int:
    """How many actions ``predict_action_chunk`` returns for this policy type."""
    if config.type == "diffusion":  # diffusion returns the n_action_steps executable actions of its horizon
        return int(config.n_action_steps)
    for name in ("chunk_size", "n_action_steps", "horizon"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"cannot tell the chunk length of LeRobot policy type {config.type!r}; pass chunk_size=")
