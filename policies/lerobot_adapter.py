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

The adapter is also a ``TrainablePolicy`` (``robot_rl.policies.trainable``), so the learner
fine-tunes a LeRobot policy with the same algorithms as FlowVLA: a training batch goes through
the policy's own preprocessor (normalisation, tokenisation) into its own ``forward``. Its
``state_dict`` is the LeRobot policy's, key for key, so what the learner publishes and
checkpoints is what ``PreTrainedPolicy.from_pretrained`` loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.policies.rtc import RTCConfig
from lerobot.policies.utils import populate_queues, prepare_observation_for_inference
from lerobot.processor import (
    DeviceProcessorStep,
    NormalizerProcessorStep,
    TokenizerProcessorStep,
    TransitionKey,
    UnnormalizerProcessorStep,
    create_transition,
)
from lerobot.utils.constants import (
    ACTION,
    OBS_IMAGES,
    OBS_STATE,
    POLICY_POSTPROCESSOR_DEFAULT_NAME,
    POLICY_PREPROCESSOR_DEFAULT_NAME,
)
from peft import PeftModel
from torch import nn

from robot_rl.core.errors import ConfigError
from robot_rl.policies.base import ObservationHistory, PastObservation, validate_chunk
from robot_rl.policies.checkpoint_files import check_checkpoint_files
from robot_rl.policies.joint_order import JointOrder
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
from robot_rl.policies.lerobot_lora import (
    ADAPTER_WEIGHTS,
    adapter_state_dict,
    is_lora_checkpoint,
    load_adapter_state,
    load_lora_checkpoint,
    lora_signature,
    save_lora_checkpoint,
    wrap_with_lora,
)
from robot_rl.policies.trainable import InputFrames, StateOffsets, TrainablePolicy, weighted_mean

# Config fields that say where/how a policy runs, not what it computes.
_RUNTIME_FIELDS = {"device", "use_amp", "push_to_hub", "repo_id", "private", "tags", "license", "pretrained_path"}


class LeRobotChunkPolicy(TrainablePolicy):
    """A LeRobot ``PreTrainedPolicy`` plus its processors, behind the TrainablePolicy protocol.

    ``camera_map`` maps our camera names to LeRobot's (``{"wrist": "gripper"}`` feeds our
    "wrist" image to ``observation.images.gripper``); unmapped cameras keep their name.
    ``state_offsets``: the roll-forward augmentation the learner trains it with. With ``lora``
    (``policy.lora_rank > 0``) only the adapters train, and they are the whole state dict.
    ``joint_names``: the checkpoint's joints in the order of its vectors; once ``bind_joints`` has
    the robot's, states and actions are matched by name (``policies.joint_order``).
    """

    def __init__(self, policy: PreTrainedPolicy, preprocessor: Any, postprocessor: Any,
                 camera_map: dict[str, str] | None = None, chunk_size: int | None = None,
                 state_offsets: StateOffsets | None = None, lora: PeftModel | None = None,
                 joint_names: Sequence[str] | None = None):
        super().__init__()
        self.policy = policy.eval()
        self.lora = lora  # the PEFT wrapper of ``policy`` when only its LoRA adapters train (lerobot_lora)
        self._state_offsets = state_offsets or StateOffsets()
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.camera_map = dict(camera_map or {})
        config = policy.config
        if ACTION not in config.output_features:
            raise ValueError(f"LeRobot policy {config.type!r} has no {ACTION!r} output feature")
        self._action_dim = int(config.output_features[ACTION].shape[0])
        self._chunk_size = chunk_size or _native_chunk_size(config)
        # Diffusion regresses a horizon that reaches past the chunk it executes.
        self._training_horizon = int(config.horizon) if config.type == "diffusion" else self._chunk_size
        self._history = _observation_history(config)
        # Diffusion's own modules want a time axis on the state even for one observation.
        self._state_time_axis = config.type == "diffusion"
        if OBS_STATE not in config.input_features:
            raise ValueError(f"LeRobot policy {config.type!r} reads no {OBS_STATE!r}; robot_rl feeds every policy "
                             "the joint state (roll-forward replaces it by the commanded target)")
        self._state_dim = int(config.input_features[OBS_STATE].shape[0])
        self.joint_names = tuple(joint_names) if joint_names else None
        if self.joint_names is not None and len(self.joint_names) != self._state_dim:
            raise ConfigError(f"policy.joint_names names {len(self.joint_names)} joints, the LeRobot checkpoint's "
                              f"state has {self._state_dim}")
        self.joint_order: JointOrder | None = None  # set by bind_joints
        self.image_keys: list[str] = list(config.image_features)
        ours = {theirs: mine for mine, theirs in self.camera_map.items()}
        self._cameras: tuple[str, ...] = tuple(
            ours.get(key.removeprefix(f"{OBS_IMAGES}."), key.removeprefix(f"{OBS_IMAGES}.")) for key in self.image_keys)
        self._input_frames = {ours: _input_frames(config, key) for ours, key in zip(self._cameras, self.image_keys,
                                                                                    strict=True)}
        self._loss_takes_reduction = "reduction" in inspect.signature(policy.forward).parameters
        self.policy.reset()

    # ------------------------------------------------------------------ features
    @property
    def cameras(self) -> tuple[str, ...]:
        return self._cameras

    @property
    def input_frames(self) -> dict[str, InputFrames]:
        return self._input_frames

    @property
    def observation_history(self) -> ObservationHistory:
        return self._history

    def bind_joints(self, robot_joints: Sequence[str]) -> None:
        if self.joint_names is not None:
            self.joint_order = JointOrder(self.joint_names, robot_joints)

    def loading_options(self) -> dict[str, Any]:
        """How a process that gets only a checkpoint directory loads it as this policy was loaded: the
        camera and joint binding, and the tokenizer its preprocessor loaded (a local copy in place of the
        Hub's name the checkpoint may hold)."""
        tokenizers = [step.tokenizer_name for step in self.preprocessor.steps
                      if isinstance(step, TokenizerProcessorStep) and step.tokenizer_name]
        return {"camera_map": dict(self.camera_map) or None,
                "joint_names": list(self.joint_names) if self.joint_names else None,
                "tokenizer": tokenizers[0] if tokenizers else None}

    def _to_policy_order[V: (np.ndarray, torch.Tensor)](self, vectors: V) -> V:
        return vectors if self.joint_order is None else self.joint_order.to_policy(vectors)

    def _to_robot_order[V: (np.ndarray, torch.Tensor)](self, vectors: V) -> V:
        return vectors if self.joint_order is None else self.joint_order.to_robot(vectors)

    @property
    def state_dim(self) -> int:
        return self._state_dim

    @property
    def action_dim(self) -> int:
        return self._action_dim

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    @property
    def training_horizon(self) -> int:
        return self._training_horizon

    @property
    def state_offsets(self) -> StateOffsets:
        return self._state_offsets

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_policy_config(cls, config: LeRobotPolicyConfig) -> LeRobotChunkPolicy:
        """``policy=lerobot``: the LeRobot checkpoint at ``config.path``."""
        if not config.path:
            raise ValueError("policy=lerobot needs policy.path=DIR_OR_HUB_ID (a LeRobot policy checkpoint)")
        return cls.from_pretrained(config.path, device=config.device, camera_map=config.camera_map or None,
                                   state_offsets=StateOffsets(config.max_state_offset, config.offset_weights),
                                   lora=config, joint_names=config.joint_names, tokenizer=config.tokenizer)

    @classmethod
    def from_scratch(cls, config: LeRobotPolicyConfig, episodes: Sequence[dict]) -> LeRobotChunkPolicy:
        """A new LeRobot policy of ``config.type`` (its config fields from ``config.options``), reading
        the episodes' cameras at their image sizes and their joints, normalising with their statistics.

        Nothing is downloaded: a vision backbone starts from random weights unless
        ``options.pretrained_backbone_weights`` names torchvision's (e.g. ResNet18_Weights.IMAGENET1K_V1)."""
        if not config.type:
            raise ConfigError("policy=lerobot needs policy.path=DIR_OR_HUB_ID (a checkpoint) or policy.type=NAME "
                              "(a new LeRobot policy: act, diffusion, smolvla, ...)")
        if not episodes:
            raise ValueError("a new LeRobot policy takes its features and statistics from episodes; got none")
        first = episodes[0]
        cameras = sorted(k.removeprefix("images.") for k in first if k.startswith("images."))
        joints = int(np.shape(first["state"])[1])
        features = {OBS_STATE: PolicyFeature(FeatureType.STATE, (joints,))}
        for cam in cameras:
            height, width = np.shape(first[f"images.{cam}"])[1:3]
            features[f"{OBS_IMAGES}.{config.camera_map.get(cam, cam)}"] = PolicyFeature(
                FeatureType.VISUAL, (3, int(height), int(width)))
        outputs = {ACTION: PolicyFeature(FeatureType.ACTION, (joints,))}
        policy_config = make_policy_config(
            config.type, input_features=features, output_features=outputs,
            device=config.device or ("cuda" if torch.cuda.is_available() else "cpu"), **config.options)
        _observation_history(policy_config)  # a history it cannot be given is refused before a model is built
        backbone = "pretrained_backbone_weights"
        if hasattr(policy_config, backbone) and backbone not in config.options:
            setattr(policy_config, backbone, None)
        stats = episode_statistics(episodes, {f"images.{c}": f"{OBS_IMAGES}.{config.camera_map.get(c, c)}"
                                              for c in cameras})
        try:
            preprocessor, postprocessor = make_pre_post_processors(policy_config, dataset_stats=stats)
        except (OSError, ValueError) as error:
            unreachable = _unreachable_file(error)
            if unreachable is None:
                raise
            raise ConfigError(f"a new LeRobot {config.type} policy: its processor could not load its tokenizer "
                              f"({_first_line(unreachable)}); offline, put the tokenizer its processor names in "
                              "the Hub cache (HF_HUB_OFFLINE=1), or start from a checkpoint (policy.path) with "
                              "policy.tokenizer=DIR") from error
        return cls(get_policy_class(config.type)(policy_config), preprocessor, postprocessor,
                   camera_map=config.camera_map or None,
                   state_offsets=StateOffsets(config.max_state_offset, config.offset_weights))

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, device: str | torch.device | None = None,
                        camera_map: dict[str, str] | None = None, chunk_size: int | None = None,
                        revision: str | None = None, state_offsets: StateOffsets | None = None,
                        lora: LeRobotPolicyConfig | None = None, joint_names: Sequence[str] | None = None,
                        tokenizer: str | None = None) -> LeRobotChunkPolicy:
        """Load policy and processors from a local directory or a Hugging Face Hub repo id; a directory
        of LoRA adapters comes with its base. ``lora`` (a config with ``lora_rank > 0``) adds new
        adapters to a full checkpoint. ``tokenizer``: where the preprocessor's tokenizer step loads its
        tokenizer, in place of the name saved with it (a local copy of pi0's Hub tokenizer)."""
        source = str(name_or_path)
        local = Path(source).expanduser()
        if source.startswith((".", "/", "~")) and not local.is_dir():
            raise FileNotFoundError(f"LeRobot checkpoint directory {local} does not exist")
        if local.is_dir():
            source = str(local)
            weights = ADAPTER_WEIGHTS if is_lora_checkpoint(local) else "model.safetensors"
            missing = [n for n in ("config.json", weights, f"{POLICY_PREPROCESSOR_DEFAULT_NAME}.json",
                                   f"{POLICY_POSTPROCESSOR_DEFAULT_NAME}.json") if not (local / n).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{local} is not a complete LeRobot policy checkpoint: missing {missing}. Save the policy "
                    "with policy.save_pretrained(dir) and its processors with preprocessor.save_pretrained(dir) "
                    "and postprocessor.save_pretrained(dir)."
                )
            check_checkpoint_files(local)
        config = PreTrainedConfig.from_pretrained(source, revision=revision)
        _observation_history(config)  # refused before the weights load
        if device is not None:
            config.device = str(device)
        # Before the weights: a tokenizer that cannot be found is refused in seconds, not after a 4 B model is built.
        overrides: dict[str, dict[str, Any]] = {"device_processor": {"device": str(config.device)}}
        if tokenizer:
            overrides["tokenizer_processor"] = {"tokenizer_name": tokenizer}
        try:
            preprocessor, postprocessor = make_pre_post_processors(
                config, pretrained_path=source, pretrained_revision=revision, preprocessor_overrides=overrides)
        except (OSError, ValueError) as error:
            unreachable = _unreachable_file(error)
            named = tokenizer or (_saved_tokenizer(local) if local.is_dir() else None)
            if unreachable is None or named is None:  # not a tokenizer's file that is missing
                raise
            raise ConfigError(f"{source}: the processor could not load its tokenizer {named} "
                              f"({_first_line(unreachable)}); give policy.tokenizer=DIR, a local copy (saved on a "
                              "machine with Internet: `hf download NAME --local-dir DIR`)") from error
        policy_class = get_policy_class(config.type)
        peft_model = None
        if local.is_dir() and is_lora_checkpoint(local):
            config.use_peft = False  # the base is a full checkpoint; the adapters come on top of it
            peft_model = load_lora_checkpoint(local, policy_class, config=config)
            policy = peft_model.get_base_model()
        else:
            policy = policy_class.from_pretrained(source, config=config, revision=revision)
            if lora is not None and lora.lora_rank > 0:
                base = str(local.resolve()) if local.is_dir() else source
                peft_model = wrap_with_lora(policy, base, lora.lora_rank, lora.lora_alpha, lora.lora_targets,
                                            lora.lora_full_training)
        return cls(policy, preprocessor, postprocessor, camera_map=camera_map, chunk_size=chunk_size,
                   state_offsets=state_offsets, lora=peft_model, joint_names=joint_names)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write policy and processors in LeRobot's layout (loadable by LeRobot and by this adapter);
        with LoRA, LeRobot's PEFT layout (the adapters, naming their base checkpoint)."""
        directory = Path(directory)
        if self.lora is not None:
            save_lora_checkpoint(self.lora, self.policy, directory)
        else:
            self.policy.save_pretrained(directory)
        self.preprocessor.save_pretrained(directory)
        self.postprocessor.save_pretrained(directory)

    def config_hash(self) -> str:
        """sha256 of the policy config minus run-time fields: equal hashes mean compatible weights."""
        fields = {k: v for k, v in dataclasses.asdict(self.policy.config).items() if k not in _RUNTIME_FIELDS}
        if self.lora is not None:
            fields["lora"] = lora_signature(self.lora)
        fields.pop("use_peft", None)  # set by saving adapters; what they are is in "lora"
        blob = json.dumps({"type": self.policy.config.type, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    # ------------------------------------------------------------------ what the learner needs
    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]  # LeRobot's keys
        """The LeRobot policy's own state dict (its key names), what its checkpoints and the wire hold;
        with LoRA only the adapters (PEFT's names): the frozen base never travels."""
        if self.lora is not None:
            return adapter_state_dict(self.lora)
        return self.policy.state_dict(*args, **kwargs)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """With LoRA the adapters; else the trainable parameters and the buffers. A frozen part (SmolVLA's
        VLM under ``train_expert_only``, 0.9 GB) never changes, and robots load it with the checkpoint."""
        if self.lora is not None:
            return adapter_state_dict(self.lora)
        trained = {name for name, p in self.policy.named_parameters() if p.requires_grad}
        trained |= {name for name, _ in self.policy.named_buffers()}
        return {k: v for k, v in self.policy.state_dict().items() if k in trained}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        if self.lora is not None:
            return load_adapter_state(self.lora, state_dict)
        return self.policy.load_state_dict(state_dict, strict=strict, assign=assign)

    def _follow_device(self) -> torch.device:
        """Point the preprocessor's device step (where batches go) at the weights' device: ``to``,
        ``cpu`` and ``cuda`` move only the module."""
        device = self.device
        self.policy.config.device = str(device)
        for step in self.preprocessor.steps:
            if isinstance(step, DeviceProcessorStep) and step.device != str(device):
                step.device = str(device)
                step.__post_init__()
        return device

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.policy.parameters() if p.requires_grad)

    def needs_statistics(self) -> bool:
        """True when the processors hold no state or action statistics (a policy built without data)."""
        return not all(_has_stats(self.preprocessor, NormalizerProcessorStep, key) for key in (OBS_STATE, ACTION))

    def fit_statistics(self, states: np.ndarray, actions: np.ndarray, instructions: Sequence[str]) -> None:
        """Refused: a LeRobot policy's statistics live in its processors, which the wire does not carry,
        so robots would normalise with other numbers than the learner. They come with the checkpoint."""
        raise ConfigError(f"the LeRobot policy {self.policy.config.type!r} has no state/action normalisation "
                          "statistics; start the learner from a checkpoint that has them (`robot-rl train-bc "
                          "policy=lerobot ...` writes one from the demonstrations' statistics)")

    def draw_training_randomness(self, batch_size: int, generator: torch.Generator) -> dict[str, int]:
        """One seed for torch's RNG during the loss: LeRobot policies draw their noise (flow noise, a
        VAE's latent) from it, and the seed from the algorithm's generator makes that reproducible."""
        del batch_size
        return {"seed": int(torch.randint(0, 2**62, (1,), generator=generator))}

    def compute_loss(self, batch: dict[str, Any], weights: torch.Tensor | None = None, *,
                     seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's own training loss per sample, weighted: (sum w l / sum w, l [B])."""
        device = self._follow_device()
        lerobot_batch = self._with_time_axis(self.preprocessor(self._to_lerobot_batch(batch)))
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            per_sample = self._per_sample_loss(lerobot_batch)
        return weighted_mean(per_sample, weights), per_sample

    def _per_sample_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """[B] losses. SmolVLA, pi0 and pi0.5 give them (``forward(reduction="none")``); ACT's and
        Diffusion's forward return only the batch mean, so their terms are formed per sample from
        their models' outputs, as their ``forward`` forms the mean."""
        policy = self.policy
        if self._loss_takes_reduction:
            loss, _ = policy.forward(batch, reduction="none")
            return loss.reshape(loss.shape[0], -1).mean(dim=1) if loss.ndim > 1 else loss
        if policy.config.type == "act":
            return _act_per_sample_loss(policy, batch)
        if policy.config.type == "diffusion":
            return _diffusion_per_sample_loss(policy, batch)
        raise ConfigError(f"LeRobot policy {policy.config.type!r} gives no per-sample loss (its forward takes no "
                          "reduction=); the learner trains act, diffusion, smolvla, pi0 and pi05")

    def _with_time_axis(self, batch: dict[str, Any]) -> dict[str, Any]:
        """[B, S] -> [B, 1, S] states for policies that stack observation history (one observation here)."""
        if self._state_time_axis and batch[OBS_STATE].ndim == 2:
            batch = {**batch, OBS_STATE: batch[OBS_STATE].unsqueeze(1)}
        return batch

    def _observations_to_lerobot(self, batch: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """The observations of a training batch (uint8 HWC images by camera, state, instruction) under
        LeRobot's keys, images CHW in 0..1; ``prefix``: those of the next chunk (``next.``)."""
        stacked = self._history.steps > 1 and not prefix  # the next chunk's observation comes without its past
        out: dict[str, Any] = {}
        for ours, key in zip(self.cameras, self.image_keys, strict=True):
            if f"{prefix}images.{ours}" not in batch:
                raise KeyError(f"the training batch has no {prefix}images.{ours}; the LeRobot policy reads "
                               f"{self.image_keys}")
            frames = torch.as_tensor(batch[f"{prefix}images.{ours}"])
            if stacked:  # [B, steps, H, W, 3], the oldest first
                frames = torch.cat([torch.as_tensor(self._past(batch, f"images.{ours}")), frames[:, None]], dim=1)
            out[key] = frames.movedim(-1, -3).to(torch.float32).div_(255.0)
        state = torch.as_tensor(batch[f"{prefix}state"], dtype=torch.float32)
        if stacked:
            state = torch.cat([torch.as_tensor(self._past(batch, "state"), dtype=torch.float32), state[:, None]], dim=1)
        out[OBS_STATE] = self._to_policy_order(state)
        out["task"] = list(batch["instruction"])
        return out

    def _past(self, batch: dict[str, Any], name: str) -> Any:
        if f"past.{name}" not in batch:
            raise KeyError(f"the training batch has no past.{name}; LeRobot policy {self.policy.config.type!r} "
                           f"reads {self._history.steps} observations (n_obs_steps)")
        return batch[f"past.{name}"]

    def _to_lerobot_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Our training batch (observations and actions) under LeRobot's keys."""
        out = self._observations_to_lerobot(batch)
        actions = self._to_policy_order(torch.as_tensor(batch["actions"], dtype=torch.float32))
        if actions.ndim != 3 or actions.shape[1:] != (self.training_horizon, self.action_dim):
            raise ValueError(f"batch['actions'] must be [B, {self.training_horizon}, {self.action_dim}], "
                             f"got {tuple(actions.shape)}")
        out[ACTION] = actions
        pad = batch.get("action_is_pad")
        out["action_is_pad"] = (torch.zeros(actions.shape[:2], dtype=torch.bool) if pad is None
                                else torch.as_tensor(pad, dtype=torch.bool))
        return out

    # ------------------------------------------------------------------ flow sampling (rl's candidates)
    @property
    def has_flow_sampler(self) -> bool:
        """SmolVLA, pi0 and pi0.5 integrate a flow from noise their ``predict_action_chunk`` takes (``noise=``,
        passed on to their model's ``sample_actions``); ACT and Diffusion have no such sampler."""
        return (hasattr(getattr(self.policy, "model", None), "sample_actions")
                and hasattr(self.policy.config, "max_action_dim"))

    @property
    def flow_noise_shape(self) -> tuple[int, int]:
        """The noise one sample integrates from: [chunk_size, max_action_dim] (the model's padded actions)."""
        return int(self.policy.config.chunk_size), int(self.policy.config.max_action_dim)

    def sample_normalized_chunks(self, batch: dict[str, Any], noise: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """[B, training_horizon, action_dim] chunks for the batch's observations under ``prefix`` (``next.``: the
        next chunk's), drawn by the policy's own flow sampler from ``noise`` [B, *flow_noise_shape]: in the
        normalised action space, the robot's joint order. Best-of-N candidates (``learner=rl``) differ only
        by their noise, which the algorithm draws from its own generator."""
        device = self._follow_device()
        observations = self.preprocessor(self._observations_to_lerobot(batch, prefix))
        training = self.policy.training  # predict_action_chunk switches the policy to eval
        try:
            chunks = self.policy.predict_action_chunk(observations, noise=noise.to(device))
        finally:
            self.policy.train(training)
        return self._to_robot_order(chunks[:, : self.training_horizon, : self.action_dim])

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """[..., action_dim] robot units -> the policy's normalised action space (both in the robot's joint order)."""
        normalize = self.preprocessor_step(NormalizerProcessorStep)
        normalized = normalize(create_transition(action=self._to_policy_order(actions)))[TransitionKey.ACTION]
        return self._to_robot_order(normalized)

    def unnormalize_actions(self, chunks: torch.Tensor) -> torch.Tensor:
        """``normalize_actions`` undone, with the postprocessor's own unnormaliser."""
        unnormalize = next(step for step in self.postprocessor.steps if isinstance(step, UnnormalizerProcessorStep))
        actions = unnormalize(create_transition(action=self._to_policy_order(chunks)))[TransitionKey.ACTION]
        return self._to_robot_order(actions)

    # ------------------------------------------------------------------ inference
    def predict_chunk(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray:
        """Images by camera (uint8 HxWx3), state, instruction -> float32[chunk_size, action_dim] in robot units.
        A policy that reads past observations gets this one repeated, as at an episode's start."""
        return self._predict(observation, state, instruction)

    def predict_chunk_with_history(self, history: Sequence[PastObservation], observation: dict[str, np.ndarray],
                                   state: np.ndarray, instruction: str) -> np.ndarray:
        """``predict_chunk`` from the observations of the ticks before too (oldest first; those past
        ``observation_history.steps - 1`` are not read; fewer: the oldest is repeated)."""
        return self._predict(observation, state, instruction, history=history)

    def predict_chunk_guided(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                             prefix: np.ndarray, delay: int) -> np.ndarray:
        """A chunk starting now whose first ``delay`` actions are guided onto ``prefix`` (what the queue
        executes while this chunk is computed, robot units): LeRobot's real-time chunking
        (``lerobot.policies.rtc``), for flow policies that support it (SmolVLA, pi0, pi0.5)."""
        if not getattr(self.policy, "supports_rtc", lambda: False)():
            raise ConfigError(f"LeRobot policy {self.policy.config.type!r} has no real-time chunking "
                              "(edge.real_time_chunking is for SmolVLA, pi0 and pi0.5)")
        if self.policy.config.rtc_config is None:
            self.policy.config.rtc_config = RTCConfig(execution_horizon=self.chunk_size)
            self.policy.init_rtc_processor()
        device = self._follow_device()
        frozen = torch.as_tensor(self._to_policy_order(np.asarray(prefix, dtype=np.float32)[: self.chunk_size]),
                                 device=device)
        normalized = self.preprocessor_step(NormalizerProcessorStep)(create_transition(action=frozen))
        return self._predict(observation, state, instruction, inference_delay=int(min(delay, len(frozen))),
                             prev_chunk_left_over=normalized[TransitionKey.ACTION][None],
                             execution_horizon=self.chunk_size)

    def preprocessor_step(self, step_type: type) -> Any:
        for step in self.preprocessor.steps:
            if isinstance(step, step_type):
                return step
        raise LookupError(f"the preprocessor has no {step_type.__name__}")

    def _predict(self, observation: dict[str, np.ndarray], state: np.ndarray, instruction: str,
                 history: Sequence[PastObservation] = (), **chunk_kwargs: Any) -> np.ndarray:
        device = self._follow_device()
        read = list(history)[1 - self._history.steps:] if self._history.steps > 1 else []
        frames = [*(self._to_lerobot_frame(past.images, past.state) for past in read),
                  self._to_lerobot_frame(observation, state)]
        with torch.no_grad():
            observations = [self.preprocessor(prepare_observation_for_inference(frame, device, task=instruction))
                            for frame in frames]
            batch = (self._stack_observations(observations) if self._history.steps > 1
                     else self._with_time_axis(observations[0]))
            actions = self.policy.predict_action_chunk(batch, **chunk_kwargs)
            if actions.ndim == 2:  # some policies drop the batch dimension
                actions = actions[None]
            actions = self.postprocessor(actions)
        chunk = self._to_robot_order(actions[0, : self.chunk_size].float().cpu().numpy())
        return validate_chunk(chunk, self.chunk_size, self.action_dim)

    def _stack_observations(self, observations: list[dict[str, Any]]) -> dict[str, Any]:
        """Preprocessed observations, the oldest first -> one batch with a time axis [1, steps, ...]: LeRobot's
        own observation queues, filled by ``populate_queues`` as ``select_action`` fills them (the first
        observation repeated until the queue is full) and stacked as ``predict_action_chunk`` stacks them.
        Queues of this call's own, not the policy's: requests in flight together share the policy."""
        queues: dict[str, deque[torch.Tensor]] = {key: deque(maxlen=self._history.steps)
                                                   for key in (OBS_STATE, *self.image_keys)}
        for observation in observations:
            populate_queues(queues, observation)
        return {**observations[-1], **{key: torch.stack(list(queue), dim=1) for key, queue in queues.items()}}

    def _to_lerobot_frame(self, observation: dict[str, np.ndarray], state: np.ndarray) -> dict[str, np.ndarray]:
        """Rename our inputs to LeRobot's feature keys, checking that every expected image is there."""
        frame: dict[str, np.ndarray] = {}
        for ours, image in observation.items():
            fit = self._input_frames.get(ours)  # the size training keeps: the same pixels here as in a batch
            image = fit.apply(np.asarray(image)[None])[0] if fit is not None else image
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
            frame[OBS_STATE] = self._to_policy_order(state)
        return frame


def _saved_tokenizer(directory: Path) -> str | None:
    """The tokenizer a checkpoint's saved preprocessor loads (its tokenizer step's ``tokenizer_name``), if any."""
    saved = json.loads((directory / f"{POLICY_PREPROCESSOR_DEFAULT_NAME}.json").read_text())
    names = [step.get("config", {}).get("tokenizer_name") for step in saved.get("steps", [])
             if step.get("registry_name") == "tokenizer_processor"]
    return names[0] if names else None


def _unreachable_file(error: BaseException) -> OSError | None:
    """The OSError (transformers' answer for files neither local, cached nor downloadable) behind
    ``error``: LeRobot's pipeline loader re-raises a step's failure as a ValueError caused by it."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__  # type: ignore[assignment]
    return error


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _observation_history(config: PreTrainedConfig) -> ObservationHistory:
    """The observations a LeRobot policy reads (``n_obs_steps``, one tick apart: its
    ``observation_delta_indices``) and where its training target starts (``action_delta_indices``:
    Diffusion's begins at its oldest observation). Diffusion's own modules take a stacked batch
    without its queues; another type that reads more than the current observation is refused."""
    steps = int(getattr(config, "n_obs_steps", 1))
    if steps > 1 and config.type != "diffusion":
        raise ConfigError(f"LeRobot policy {config.type!r} reads n_obs_steps={steps} observations; robot_rl stacks "
                          "observation history for diffusion only (policy.options.n_obs_steps=1)")
    deltas = config.action_delta_indices or [0]
    return ObservationHistory(steps, past_actions=max(0, -int(deltas[0])))


def _input_frames(config: PreTrainedConfig, image_key: str) -> InputFrames:
    """The frame size a LeRobot policy reads from ``image_key``, with its own resize: SmolVLA pads to
    ``resize_imgs_with_padding`` (width, height), the pi0 family to ``image_resolution``, Diffusion
    resizes to ``resize_shape``; otherwise (ACT, Diffusion without one) the config's image feature
    shape is the size it is fed."""
    padded = getattr(config, "resize_imgs_with_padding", None)
    if padded is not None:
        return InputFrames(int(padded[1]), int(padded[0]), "pad_top_left")
    resolution = getattr(config, "image_resolution", None)
    if resolution is not None:
        return InputFrames(int(resolution[0]), int(resolution[1]), "pad_center")
    resized = getattr(config, "resize_shape", None)
    if resized is not None:
        return InputFrames(int(resized[0]), int(resized[1]))
    _, height, width = config.image_features[image_key].shape
    return InputFrames(int(height), int(width))


def episode_statistics(episodes: Sequence[dict], image_keys: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's dataset statistics of in-memory episodes: per joint for state and action (mean/std,
    min/max and the quantiles pi0.5 normalises with), per colour channel for images (0..1, as
    LeRobot feeds them), under LeRobot's keys (``image_keys``: ours -> theirs)."""
    stats = {OBS_STATE: _array_stats(np.concatenate([ep["state"] for ep in episodes])),
             ACTION: _array_stats(np.concatenate([ep["action"] for ep in episodes]))}
    for ours, theirs in image_keys.items():
        # Every 10th frame: channel statistics of neighbouring frames barely differ.
        pixels = np.concatenate([ep[ours][::10].reshape(-1, 3) for ep in episodes]).astype(np.float32) / 255.0
        stats[theirs] = {k: v.reshape(3, 1, 1) for k, v in _array_stats(pixels).items() if k != "count"}
    return stats


def _array_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    values = np.asarray(values, dtype=np.float64)
    stats = {"mean": values.mean(0), "std": np.maximum(values.std(0), 1e-6), "min": values.min(0),
             "max": values.max(0), "count": np.array([len(values)])}
    for q in (1, 10, 50, 90, 99):
        stats[f"q{q:02d}"] = np.quantile(values, q / 100.0, axis=0)
    return {k: v.astype(np.float32) for k, v in stats.items()}


def _has_stats(pipeline: Any, step_type: type[NormalizerProcessorStep], key: str) -> bool:
    return any(isinstance(step, step_type) and key in (step.stats or {}) for step in pipeline.steps)


def _act_per_sample_loss(policy: PreTrainedPolicy, batch: dict[str, Any]) -> torch.Tensor:
    """ACT's loss (``ACTPolicy.forward``: L1 over the valid steps plus kl_weight times the latent's KL
    divergence), per sample instead of over the batch."""
    config = policy.config
    batch = dict(batch)
    if config.image_features:
        batch[OBS_IMAGES] = [batch[key] for key in config.image_features]
    actions_hat, (mu, log_sigma_x2) = policy.model(batch)
    valid = (~batch["action_is_pad"]).unsqueeze(-1).to(actions_hat.dtype)
    abs_err = (batch[ACTION] - actions_hat).abs() * valid
    loss = abs_err.sum(dim=(1, 2)) / (valid.sum(dim=(1, 2)) * actions_hat.shape[-1]).clamp_min(1.0)
    if config.use_vae and log_sigma_x2 is not None:
        kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1)
        loss = loss + config.kl_weight * kld
    return loss


def _diffusion_per_sample_loss(policy: PreTrainedPolicy, batch: dict[str, Any]) -> torch.Tensor:
    """Diffusion Policy's loss (``DiffusionModel.compute_loss``: noise a horizon of actions at a random
    diffusion step, regress the noise or the sample, mask the padded steps), per sample."""
    config, model = policy.config, policy.diffusion
    batch = dict(batch)
    images = [batch[key] if batch[key].ndim == 5 else batch[key].unsqueeze(1) for key in config.image_features]
    batch[OBS_IMAGES] = torch.stack(images, dim=-4)
    cond = model._prepare_global_conditioning(batch)  # noqa: SLF001 - compute_loss's own encoder; no public one
    trajectory = batch[ACTION]
    eps = torch.randn(trajectory.shape, device=trajectory.device)
    steps = torch.randint(0, model.noise_scheduler.config.num_train_timesteps, (trajectory.shape[0],),
                          device=trajectory.device).long()
    pred = model.unet(model.noise_scheduler.add_noise(trajectory, eps, steps), steps, global_cond=cond)
    target = eps if config.prediction_type == "epsilon" else trajectory
    valid = (~batch["action_is_pad"]).unsqueeze(-1).to(pred.dtype)
    if not config.do_mask_loss_for_padding:
        valid = torch.ones_like(valid)
    squared = (pred - target).pow(2) * valid
    return squared.sum(dim=(1, 2)) / (valid.sum(dim=(1, 2)) * pred.shape[-1]).clamp_min(1.0)


def _native_chunk_size(config: PreTrainedConfig) -> int:
    """How many actions ``predict_action_chunk`` returns for this policy type."""
    if config.type == "diffusion":  # diffusion returns the n_action_steps executable actions of its horizon
        return int(config.n_action_steps)
    for name in ("chunk_size", "n_action_steps", "horizon"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"cannot tell the chunk length of LeRobot policy type {config.type!r}; pass chunk_size=")
