"""FlowVLAConfig: every knob of the flow-matching VLA; FlowVLAPolicyConfig: ``policy=flow_vla``.

Fields are split into two kinds, marked in their metadata:
- *architecture* fields decide tensor shapes; they enter ``config_hash`` so the wire
  protocol refuses weights from an incompatible model;
- all other fields (dropout, integration steps, augmentation) can change without
  invalidating a checkpoint.

The defaults are the model that ``robot-rl train-bc`` trains and that ships in
``checkpoints/bc_push``. A checkpoint carries its own config (``from_checkpoint``): fields it
predates take the value that means "that feature off", never today's default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from robot_rl.core.registry import POLICIES

_ARCH = {"architecture": True}


def _arch(default: Any) -> Any:
    return field(default=default, metadata=_ARCH)


@dataclass
class FlowVLAConfig:
    # --- inputs and outputs (architecture) ---
    cameras: tuple[str, ...] = _arch(("front", "wrist"))
    # Images are resized to image_size x image_size: 64 trains 2.4x faster than 96 on a CPU.
    image_size: int = _arch(64)
    state_dim: int = _arch(6)
    action_dim: int = _arch(6)
    chunk_size: int = _arch(20)  # H, actions per predicted chunk: 0.67 s at 30 Hz
    text_dim: int = _arch(384)  # sentence-embedding size (all-MiniLM-L6-v2)
    # Standardise instruction embeddings over the training instructions (normalization.py): task
    # words differ by ~1 % of the raw vector, too little for the network to see.
    normalize_instruction: bool = _arch(True)

    # --- network size (architecture) ---
    cnn_channels: tuple[int, ...] = _arch((16, 32, 64, 64))
    image_grid: int = _arch(4)  # each camera becomes image_grid**2 tokens
    keypoints: int = _arch(32)  # spatial-softmax keypoints per camera, as one extra token (where the cube is); 0 = none
    film_instruction: bool = _arch(True)  # the instruction modulates the CNN features (FiLM): which cube to look at
    d_model: int = _arch(128)
    n_heads: int = _arch(4)
    n_layers: int = _arch(3)  # context transformer (images + instruction + state)
    n_expert_layers: int = _arch(3)  # action expert (self-attn over H tokens + cross-attn to context)
    ffn_mult: int = _arch(4)

    # --- training / inference behaviour (not architecture) ---
    dropout: float = 0.0
    image_shift_pixels: int = 0  # training-time random shift of every image (DrQ); 0 = off
    # Training-time Gaussian noise on the normalised state, so the policy leans on the images; 0 = off.
    # Cloned on pick, 0.5 made the first chunk follow the colour named, 0.1 did not
    # (docs/history/benchmarks.md, "train-bc"); alone on the three-family start it scored lower.
    state_noise_std: float = 0.1
    num_integration_steps: int = 10  # Euler steps from noise to actions at inference
    flow_time_sampling: str = "uniform"  # "uniform" or "beta" (more samples near the noise end)
    inference_seed: int | None = None  # fixed noise seed for deterministic chunks; None = fresh noise
    # State-offset augmentation: offsets 0..max_state_offset ticks (roll-forward up to ~170 ms).
    max_state_offset: int = 5
    offset_weights: tuple[float, ...] | None = None  # relative probability per offset; None = uniform
    # Instruction augmentation (policies/wordings.py): a training sample reads another wording of its
    # instruction with probability instruction_augmentation. "sim": the sim's training wordings; a
    # YAML file {instruction: [wording, ...]}; or "module:function" (instruction -> wordings); None = off.
    instruction_variants: str | None = None
    instruction_augmentation: float = 0.5

    def __post_init__(self) -> None:
        self.cameras = tuple(self.cameras)
        self.cnn_channels = tuple(self.cnn_channels)
        if self.offset_weights is not None:
            self.offset_weights = tuple(float(w) for w in self.offset_weights)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field, before any tensor is built."""
        problems = []
        if not self.cameras:
            problems.append("cameras must name at least one camera")
        if len(set(self.cameras)) != len(self.cameras):
            problems.append(f"cameras has duplicates: {self.cameras}")
        for name in ("image_size", "state_dim", "action_dim", "chunk_size", "text_dim", "image_grid",
                     "d_model", "n_heads", "n_layers", "n_expert_layers", "ffn_mult", "num_integration_steps"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % max(self.n_heads, 1):
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not self.cnn_channels:
            problems.append("cnn_channels must list at least one conv layer width")
        if self.flow_time_sampling not in ("uniform", "beta"):
            problems.append(f"flow_time_sampling must be 'uniform' or 'beta', got {self.flow_time_sampling!r}")
        if self.max_state_offset < 0:
            problems.append(f"max_state_offset must be >= 0, got {self.max_state_offset}")
        if self.offset_weights is not None:
            if len(self.offset_weights) != self.max_state_offset + 1:
                problems.append(
                    f"offset_weights needs one weight per offset 0..{self.max_state_offset} "
                    f"({self.max_state_offset + 1} values), got {len(self.offset_weights)}"
                )
            elif min(self.offset_weights) < 0 or sum(self.offset_weights) <= 0:
                problems.append("offset_weights must be non-negative with a positive sum")
        if not 0.0 <= self.instruction_augmentation <= 1.0:
            problems.append(f"instruction_augmentation must be in [0, 1], got {self.instruction_augmentation}")
        if self.keypoints < 0:
            problems.append(f"keypoints must be >= 0, got {self.keypoints}")
        if not 0.0 <= self.state_noise_std < 10.0:
            problems.append(f"state_noise_std must be in [0, 10), got {self.state_noise_std}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if problems:
            raise ValueError("invalid FlowVLAConfig: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_checkpoint(cls, data: dict[str, Any]) -> FlowVLAConfig:
        """The config a checkpoint's ``config.json`` describes (inverse of ``to_dict``).

        Unknown keys are an error (a newer or a corrupt checkpoint). A field the checkpoint
        predates takes ``FEATURE_OFF``'s value, what the checkpoint was trained with, so a
        change of default never changes a saved model.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown FlowVLAConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**{**FEATURE_OFF, **data})

    def architecture_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name))
                for f in dataclasses.fields(self) if f.metadata.get("architecture")}

    def config_hash(self) -> str:
        """sha256 of the shape-defining fields: equal hashes mean state_dicts are interchangeable."""
        blob = json.dumps({"policy_type": "flow_vla", **self.architecture_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


# Architecture features added after the first checkpoints were written, as those checkpoints lack them.
FEATURE_OFF: dict[str, Any] = {"normalize_instruction": False, "keypoints": 0, "film_instruction": False}


@POLICIES.register("flow_vla", builder="robot_rl.policies.flow_vla.model:FlowVLA.from_policy_config")
@dataclass
class FlowVLAPolicyConfig:
    """``policy=flow_vla``: the project's flow-matching VLA.

    ``path`` is a checkpoint (a local directory or a Hugging Face Hub id), whose own config
    decides the architecture; with none, a command uses its default checkpoint (the BC start)
    or, where one starts from scratch (train-bc, a learner without a checkpoint), a new model
    of ``model``'s architecture.
    """

    path: str | None = None
    device: str | None = None  # null: CUDA when present, else CPU
    model: FlowVLAConfig = field(default_factory=FlowVLAConfig)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
