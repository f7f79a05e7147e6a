"""``ReplayConfig``: what ``robot-rl replay`` does (kept apart from ``replay.run`` so that reading the
configuration imports no dataset or video code)."""

from __future__ import annotations

from dataclasses import dataclass, field

from robot_rl.replay.joint_mapping import JointMapping


@dataclass
class ReplayConfig:
    """What ``robot-rl replay`` does (the ``replay`` group; preset ``replay=radians_6dof``)."""

    dataset: str | None = None  # a LeRobotDataset v3 directory or a Hugging Face Hub id (owner/name)
    episode_indices: list[int] | None = None  # which of its episodes, e.g. [0,2]; null = every one
    realtime: bool = False  # pace the sim at the dataset's fps (to watch along); false = as fast as possible
    counterfactual: bool = False  # also ask policy.path what it would have done at every logged step
    video: bool = True  # one MP4 per episode: logged cameras | sim render, a timeline strip below
    plots: bool = True
    out_dir: str = "${output_dir}/replay"
    # Sim seeds of the chosen episodes, in order, to re-create their scenes when the dataset does not
    # carry them (an ``episode_seed`` column); null = start from the first logged state in a scene
    # drawn from ``fallback_seed``.
    seeds: list[int] | None = None
    fallback_seed: int = 0
    batch_size: int = 16  # counterfactual steps per policy call
    mapping: JointMapping = field(default_factory=JointMapping)  # the dataset's joints -> sim joints

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"replay.batch_size must be >= 1, got {self.batch_size}")
