"""Read a LeRobotDataset v3 (ours or any LeRobot one) into per-episode numpy arrays.

Training on CPU wants whole episodes in memory as arrays (the state-offset
augmentation indexes across time), so this reads columns in bulk through the
dataset's Arrow table rather than frame by frame.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

IMAGE_PREFIX = "observation.images."


def load_episode_arrays(
    root: str | Path | None,
    repo_id: str = "local/robot_rl",
    episodes: list[int] | None = None,
) -> list[dict]:
    """One dict per episode: ``images.<cam>`` [T,H,W,3] uint8, ``state``, ``action`` [T,D],
    ``instruction``, ``episode_index``, and every other stored column as a [T] array."""
    return list(iter_episode_arrays(root, repo_id, episodes))


UnreadableEpisode = Callable[[int, Path, Exception], None]  # (episode index, the file, what went wrong)


def iter_episode_arrays(
    root: str | Path | None,
    repo_id: str = "local/robot_rl",
    episodes: list[int] | None = None,
    on_unreadable: UnreadableEpisode | None = None,
) -> Iterator[dict]:
    """``load_episode_arrays`` one episode at a time: a reader that keeps less (the learner's index,
    at the policy's input size) never holds every camera-size frame at once.

    ``on_unreadable``: an episode whose rows or frames cannot be decoded (damaged image bytes, a
    garbled video) is reported to it and skipped, and the others are read on; without it, it raises."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset(repo_id, root=root, episodes=episodes, video_backend="pyav")
    table = dataset.hf_dataset.with_format("numpy")
    task_table = dataset.meta.tasks
    tasks = {int(idx): name for name, idx in zip(task_table.index, task_table["task_index"], strict=True)}
    episode_index = np.asarray(table["episode_index"])
    for ep in dict.fromkeys(episode_index.tolist()):
        rows = np.flatnonzero(episode_index == ep)
        file = Path(dataset.root) / dataset.meta.get_data_file_path(int(ep))
        try:
            chunk = table[int(rows[0]) : int(rows[-1]) + 1]  # decodes a PNG-stored camera's images
            if dataset.meta.video_keys:
                chunk.update(_decode_episode_videos(dataset, int(ep), np.asarray(chunk["timestamp"])))
        except Exception as exc:  # PIL, Arrow, PyAV and torchcodec each report damage in classes of their own
            if on_unreadable is None:
                raise
            on_unreadable(int(ep), exc.path if isinstance(exc, UnreadableVideoError) else file, exc)
            continue
        yield _episode_dict(chunk, tasks)


def vector_names(feature: dict) -> tuple[str, ...]:
    """The names of a vector feature's entries (LeRobot stores a list, or ``{"motors": [...]}``); empty
    when it names none."""
    names = feature.get("names")
    if isinstance(names, dict):
        names = next((v for v in names.values() if isinstance(v, list)), None)
    return tuple(str(n) for n in names or ())


def recorded_joint_names(root: str | Path) -> tuple[str, ...]:
    """The joints a dataset's ``observation.state`` names, in its order."""
    features = json.loads((Path(root) / "meta" / "info.json").read_text())["features"]
    return vector_names(features.get("observation.state", {}))


def recorded_tasks(root: str | Path) -> tuple[str, ...]:
    """The tasks (instructions) a dataset's episodes were recorded with (``meta/tasks.parquet``)."""
    tasks = Path(root) / "meta" / "tasks.parquet"
    return tuple(pq.read_table(tasks, columns=["task"]).column("task").to_pylist()) if tasks.exists() else ()


def _episode_dict(columns: dict, tasks: dict[int, str]) -> dict:
    episode: dict = {}
    for key, values in columns.items():
        values = np.asarray(values)
        if key.startswith(IMAGE_PREFIX):
            episode["images." + key[len(IMAGE_PREFIX) :]] = _as_hwc_uint8(values)
        elif key == "observation.state":
            episode["state"] = values.astype(np.float32)
        elif key == "action":
            episode["action"] = values.astype(np.float32)
        else:
            episode[key] = values
    episode["instruction"] = tasks.get(int(np.asarray(columns["task_index"])[0]), "")
    episode["episode_index"] = int(np.asarray(columns["episode_index"])[0])
    return episode


def _as_hwc_uint8(images: np.ndarray) -> np.ndarray:
    if images.ndim == 4 and images.shape[1] == 3 and images.shape[-1] != 3:
        images = images.transpose(0, 2, 3, 1)
    if images.dtype != np.uint8:
        images = np.clip(images * (255.0 if images.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    return images


def _decode_episode_videos(dataset, episode_index: int, timestamps: np.ndarray) -> dict[str, np.ndarray]:
    """Every camera's frames of one episode, [T,3,H,W] uint8, decoded in one sequential pass per
    camera by LeRobot's own decoder (one seek, then frame after frame: hundreds of 640x480 frames/s
    on one core, where looking frames up one by one seeks for each)."""
    from lerobot.datasets.video_utils import decode_video_frames

    episode = dataset.meta.episodes[episode_index]
    out = {}
    for key in dataset.meta.video_keys:
        start = float(episode[f"videos/{key}/from_timestamp"])
        path = dataset.root / dataset.meta.get_video_file_path(episode_index, key)
        try:
            frames = decode_video_frames(path, [start + float(t) for t in timestamps], dataset.tolerance_s,
                                         backend="pyav", return_uint8=True)
        except Exception as exc:  # PyAV reports damage in classes of its own; which file failed goes with it
            raise UnreadableVideoError(path, exc) from exc
        out[key] = frames.numpy()
    return out


class UnreadableVideoError(RuntimeError):
    """A video file whose frames of an episode do not decode."""

    def __init__(self, path: Path, cause: Exception) -> None:
        self.path = Path(path)
        super().__init__(f"{type(cause).__name__}: {cause}")
