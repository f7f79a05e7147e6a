"""Episodes on disk as LeRobotDataset v3 (written and read with ``lerobot``), with
robot_rl's extra per-step columns so LeRobot tools read our data and we read theirs."""

from robot_rl.data.features import EXTRA_COLUMNS, dataset_features
from robot_rl.data.reader import load_episode_arrays
from robot_rl.data.recorder import EpisodeRecorder

__all__ = ["EXTRA_COLUMNS", "EpisodeRecorder", "dataset_features", "load_episode_arrays"]
