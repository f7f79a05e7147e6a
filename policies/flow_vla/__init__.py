"""The project's flow-matching VLA: ``FlowVLA`` (model + TrainablePolicy) and its config. Module
map: config, encoders, normalization, model, checkpoint. Its training loop, batch sampler and
state-offset augmentation serve every trainable policy: ``robot_rl.policies.training``,
``.episodes`` and ``.augment``."""

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.policies.flow_vla.checkpoint import CheckpointError
    from robot_rl.policies.flow_vla.config import FlowVLAConfig, FlowVLAPolicyConfig
    from robot_rl.policies.flow_vla.model import FlowVLA

# Exported lazily, so that reading a config that names this policy (flow_vla.config) imports no torch.
_EXPORTS = {
    "CheckpointError": "checkpoint",
    "FlowVLAConfig": "config",
    "FlowVLAPolicyConfig": "config",
    "FlowVLA": "model",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["CheckpointError", "FlowVLA", "FlowVLAConfig", "FlowVLAPolicyConfig"]
