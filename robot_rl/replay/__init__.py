"""Logged datasets in the sim: open-loop replay and counterfactual replay (closed-loop evaluation
of policies on a dataset's scenes is ``robot_rl.app.evaluation``).

Module map: ``dataset`` (read any LeRobotDataset v3 through lerobot), ``joint_mapping``
(another robot's joints and units -> the sim's), ``scenes`` (where an episode starts),
``open_loop`` (replay actions, measure tracking error), ``counterfactual`` (policy vs
logged actions), ``video`` (side-by-side MP4), ``report`` (plots, tables, JSON), ``run`` (one replay run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.replay.config import ReplayConfig
    from robot_rl.replay.counterfactual import CounterfactualResult, counterfactual_replay
    from robot_rl.replay.dataset import DatasetError, LoggedDataset, LoggedEpisode, load_logged_dataset
    from robot_rl.replay.joint_mapping import JointMapper, JointMapping, JointMappingError, build_mapper
    from robot_rl.replay.open_loop import TrackingResult, replay_open_loop
    from robot_rl.replay.run import EpisodeReplay, ReplayRun, replay_dataset
    from robot_rl.replay.scenes import Scene, apply_scene, place_arm

# Exported lazily: the root configuration reads ReplayConfig and JointMapping, and must not wait
# for the dataset, video and parquet code to import.
_EXPORTS = {
    "CounterfactualResult": "counterfactual",
    "counterfactual_replay": "counterfactual",
    "DatasetError": "dataset",
    "LoggedDataset": "dataset",
    "LoggedEpisode": "dataset",
    "load_logged_dataset": "dataset",
    "JointMapper": "joint_mapping",
    "JointMapping": "joint_mapping",
    "JointMappingError": "joint_mapping",
    "build_mapper": "joint_mapping",
    "TrackingResult": "open_loop",
    "replay_open_loop": "open_loop",
    "EpisodeReplay": "run",
    "ReplayConfig": "config",
    "ReplayRun": "run",
    "replay_dataset": "run",
    "Scene": "scenes",
    "apply_scene": "scenes",
    "place_arm": "scenes",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "CounterfactualResult",
    "DatasetError",
    "EpisodeReplay",
    "JointMapper",
    "JointMapping",
    "JointMappingError",
    "LoggedDataset",
    "LoggedEpisode",
    "ReplayConfig",
    "ReplayRun",
    "Scene",
    "TrackingResult",
    "apply_scene",
    "build_mapper",
    "counterfactual_replay",
    "load_logged_dataset",
    "place_arm",
    "replay_dataset",
    "replay_open_loop",
]
