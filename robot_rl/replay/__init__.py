"""Logged datasets in the sim: open-loop replay, counterfactual replay, closed-loop eval.

Module map: ``dataset`` (read any LeRobotDataset v3 through lerobot), ``joint_mapping``
(another robot's joints and units -> the sim's), ``scenes`` (where an episode starts),
``open_loop`` (replay actions, measure tracking error), ``counterfactual`` (policy vs
logged actions), ``checkpoint_eval`` (closed-loop eval of checkpoints on shared scenes),
``video`` (side-by-side MP4), ``report`` (plots, tables, JSON), ``run`` (one replay run).
"""

from robot_rl.replay.checkpoint_eval import (
    PolicyEval,
    compare_policies,
    dataset_scenes,
    evaluate_on_scenes,
    run_scene_episode,
    seed_scenes,
)
from robot_rl.replay.counterfactual import CounterfactualResult, counterfactual_replay
from robot_rl.replay.dataset import DatasetError, LoggedDataset, LoggedEpisode, load_logged_dataset
from robot_rl.replay.joint_mapping import JointMapper, JointMapping, JointMappingError, build_mapper
from robot_rl.replay.open_loop import TrackingResult, replay_open_loop
from robot_rl.replay.run import EpisodeReplay, ReplayConfig, ReplayRun, replay_dataset
from robot_rl.replay.scenes import Scene, apply_scene, place_arm

__all__ = [
    "CounterfactualResult",
    "DatasetError",
    "EpisodeReplay",
    "JointMapper",
    "JointMapping",
    "JointMappingError",
    "LoggedDataset",
    "LoggedEpisode",
    "PolicyEval",
    "ReplayConfig",
    "ReplayRun",
    "Scene",
    "TrackingResult",
    "apply_scene",
    "build_mapper",
    "compare_policies",
    "counterfactual_replay",
    "dataset_scenes",
    "evaluate_on_scenes",
    "load_logged_dataset",
    "place_arm",
    "replay_dataset",
    "replay_open_loop",
    "run_scene_episode",
    "seed_scenes",
]
