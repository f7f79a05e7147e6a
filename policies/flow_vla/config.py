"""FlowVLAConfig: every knob of the flow-matching VLA, as plain types a Hydra YAML can mirror.

Fields are split into two kinds, marked in their metadata:
- *architecture* fields decide tensor shapes; they enter ``config_hash`` so the wire
  protocol refuses weights from an incompatible model;
- all other fields (dropout, integration steps, augmentation) can change without
  invalidating a checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

_ARCH = {"architecture": True}


def _arch(default: Any) -> Any:
    return field(default=default, metadata=_ARCH)


@dataclass
class FlowVLAConfig:
    # --- inputs and outputs (architecture) ---
    cameras: tuple[str, ...] = _arch(("front", "wrist"))
    image_size: int = _arch(96)  # images are resized to image_size x image_size
    state_dim: int = _arch(6)
    action_dim: int = _arch(6)
    chunk_size: int = _arch(20)  # H, actions per predicted chunk
    text_dim: int = _arch(384)  # sentence-embedding size (all-MiniLM-L6-v2)
    # Standardise instruction embeddings over the training instructions (normalization.py);
    # False in the dataclass so checkpoints saved before it existed load unchanged.
    normalize_instruction: bool = _arch(False)

    # --- network size (architecture) ---
    cnn_channels: tuple[int, ...] = _arch((32, 64, 128, 128))
    image_grid: int = _arch(4)  # each camera becomes image_grid**2 tokens
    keypoints: int = _arch(0)  # spatial-softmax keypoints per camera, as one extra token; 0 = none
    film_instruction: bool = _arch(False)  # the instruction modulates the CNN features (FiLM)
    d_model: int = _arch(128)
    n_heads: int = _arch(4)
    n_layers: int = _arch(3)  # context transformer (images + instruction + state)
    n_expert_layers: int = _arch(3)  # action expert (self-attn over H tokens + cross-attn to context)
    ffn_mult: int = _arch(4)

    # --- training / inference behaviour (not architecture) ---
    dropout: float = 0.0
    image_shift_pixels: int = 0  # training-time random shift of every image (DrQ); 0 = off
    state_noise_std: float = 0.0  # training-time Gaussian noise on the normalised state; 0 = off
    num_integration_steps: int = 10  # Euler steps from noise to actions at inference
    flow_time_sampling: str = "uniform"  # "uniform" or "beta" (more samples near the noise end)
    inference_seed: int | None = None  # fixed noise seed for deterministic chunks; None = fresh noise
    max_state_offset: int = 5  # state-offset augmentation: offsets 0..max_state_offset ticks
    offset_weights: tuple[float, ...] | None = None  # relative probability per offset; None = uniform

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
    def from_dict(cls, data: dict[str, Any]) -> FlowVLAConfig:
        """Inverse of ``to_dict``; unknown keys are an error so typos in YAML/JSON do not pass silently."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown FlowVLAConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    def architecture_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata.get("architecture")}

    def config_hash(self) -> str:
        """sha256 of the shape-defining fields: equal hashes mean state_dicts are interchangeable."""
        blob = json.dumps({"policy_type": "flow_vla", **self.architecture_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
