"""The project's flow-matching VLA: ``FlowVLA`` (model + ChunkPolicy), its config, training loop
and state-offset augmentation. Module map: config, encoders, normalization, model, checkpoint,
augment (offset samples), data (batch sampler), training (fit)."""

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.policies.flow_vla.checkpoint import CheckpointError
    from robot_rl.policies.flow_vla.config import FlowVLAConfig, FlowVLAPolicyConfig
    from robot_rl.policies.flow_vla.model import FlowVLA
    from robot_rl.policies.flow_vla.training import auto_device, fit

# Exported lazily, so that reading a config that names this policy (flow_vla.config) imports no torch.
_EXPORTS = {
    "CheckpointError": "checkpoint",
    "FlowVLAConfig": "config",
    "FlowVLAPolicyConfig": "config",
    "FlowVLA": "model",
    "auto_device": "training",
    "fit": "training",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["CheckpointError", "FlowVLA", "FlowVLAConfig", "FlowVLAPolicyConfig", "auto_device", "fit"]
