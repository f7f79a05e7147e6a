"""A saved trainable policy, whichever kind saved it: the main job's processes get a checkpoint
directory, not the configuration that made it, and tell the kind from the files it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from robot_rl.policies.flow_vla.model import FlowVLA
from robot_rl.policies.trainable import TrainablePolicy


def load_trainable(directory: str | Path, device: str = "cpu", **options: Any) -> TrainablePolicy:
    """The trainable policy saved in ``directory``, by its layout: a LeRobot checkpoint (it has
    LeRobot's processor files) or a FlowVLA one. For the processes of the main job that get a
    checkpoint directory, not the configuration that made it; ``options`` are the saving policy's
    ``loading_options()`` (how it is bound to the robot)."""
    directory = Path(directory)
    if (directory / "policy_preprocessor.json").is_file():
        # LeRobot's policy stack (the edge and learner extras): seconds to import, for its checkpoints only
        from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy

        return LeRobotChunkPolicy.from_pretrained(directory, device=device, **options)
    if options:
        raise TypeError(f"a FlowVLA checkpoint ({directory}) takes no loading options, got {sorted(options)}")
    return FlowVLA.from_pretrained(directory, device=device)
