"""The project's flow-matching VLA: ``FlowVLA`` (model + ChunkPolicy), its config, training loop
and state-offset augmentation. Module map: config, encoders, normalization, model, checkpoint,
augment (offset samples), data (batch sampler), training (fit)."""

from robot_rl.policies.flow_vla.checkpoint import CheckpointError
from robot_rl.policies.flow_vla.config import FlowVLAConfig
from robot_rl.policies.flow_vla.model import FlowVLA
from robot_rl.policies.flow_vla.training import auto_device, fit

__all__ = ["CheckpointError", "FlowVLA", "FlowVLAConfig", "auto_device", "fit"]
