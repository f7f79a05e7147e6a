"""The LeRobotDataset feature spec of a robot_rl recording.

Standard LeRobot keys (``observation.state``, ``action``, ``observation.images.<cam>``,
``next.reward``, ``next.done``) keep LeRobot's tools working; the extra columns carry
what async control and online learning need per step (which chunk and policy version
produced the action, the delay used, whether a human was driving).
"""

from __future__ import annotations

# column -> (dtype, width): every extra column is a short vector per step.
EXTRA_COLUMNS: dict[str, tuple[str, int]] = {
    "next.success": ("bool", 1),
    "is_intervention": ("bool", 1),
    "policy_version": ("int64", 1),
    "chunk_id": ("int64", 1),
    "chunk_index": ("int64", 1),
    "delay_ticks": ("int64", 1),
    "stall": ("bool", 1),
    "lateness_s": ("float32", 1),
    # The sim seed that re-creates the episode's scene on replay (-1: unknown, e.g. a real robot).
    "episode_seed": ("int64", 1),
}
# Who judged the episode and how sure: carried on every step like ``next.success``, the last step's is
# the episode's. ``next.success_source`` is a code into ``robot_rl.core.types.SUCCESS_SOURCES``
# (0 nobody, 1 operator, 2 task, 3 detector). A dataset recorded before them has neither: it is
# appended to without them, its episodes' verdicts read as the task's.
VERDICT_COLUMNS: dict[str, tuple[str, int]] = {
    "next.success_source": ("int64", 1),
    "next.success_confidence": ("float32", 1),
}


def dataset_features(
    joint_names: tuple[str, ...],
    cameras: dict[str, tuple[int, int]],
    use_videos: bool = False,
) -> dict[str, dict]:
    """Feature dict for ``LeRobotDataset.create`` given joints and cameras (name -> (H, W))."""
    names = [f"{j}.pos" for j in joint_names]
    dim = len(joint_names)
    features: dict[str, dict] = {
        "observation.state": {"dtype": "float32", "shape": (dim,), "names": names},
        "action": {"dtype": "float32", "shape": (dim,), "names": names},
        "policy_action": {"dtype": "float32", "shape": (dim,), "names": names},
        "rolled_state": {"dtype": "float32", "shape": (dim,), "names": names},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    for cam, (h, w) in cameras.items():
        features[f"observation.images.{cam}"] = {
            "dtype": "video" if use_videos else "image",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        }
    for column, (dtype, width) in {**EXTRA_COLUMNS, **VERDICT_COLUMNS}.items():
        features[column] = {"dtype": dtype, "shape": (width,), "names": None}
    return features
