"""Load a LeRobotDataset v3 (ours or any public one) as logged episodes to replay.

Reading always goes through ``lerobot`` (``LeRobotDatasetMetadata`` for names and fps,
``robot_rl.data.load_episode_arrays`` for the columns), so a Hub id takes LeRobot's
own download path and a local directory is read exactly as LeRobot reads it.

Columns only our recordings have (interventions, policy versions, seeds) are optional:
a public dataset without them replays with "no intervention, unknown version".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robot_rl.core.errors import ConfigError
from robot_rl.data.reader import IMAGE_PREFIX, load_episode_arrays, vector_names

LOCAL_REPO_ID = "local/robot_rl"
# A per-step column holding the sim seed an episode was reset with (-1 = unknown).
SEED_COLUMNS = ("episode_seed", "seed")


class DatasetError(ConfigError):
    """A dataset that cannot be replayed, with what to do about it (the CLI prints it as one line)."""


@dataclass
class LoggedEpisode:
    """One episode as logged, in the dataset's own joint order and units."""

    index: int
    instruction: str
    state: np.ndarray  # [T, D] measured joints before each action
    action: np.ndarray  # [T, D] executed actions
    images: dict[str, np.ndarray] = field(default_factory=dict)  # camera -> [T, H, W, 3] uint8
    is_intervention: np.ndarray | None = None  # [T] bool, None when not logged
    policy_version: np.ndarray | None = None  # [T] int, None when not logged
    seed: int | None = None

    @property
    def length(self) -> int:
        return int(self.state.shape[0])

    def interventions(self) -> np.ndarray:
        return np.zeros(self.length, bool) if self.is_intervention is None else self.is_intervention

    def versions(self) -> np.ndarray:
        return np.full(self.length, -1, np.int64) if self.policy_version is None else self.policy_version


@dataclass
class LoggedDataset:
    source: str
    fps: int
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    cameras: tuple[str, ...]
    episodes: list[LoggedEpisode]


def resolve_source(source: str) -> tuple[str, Path | None]:
    """(repo_id, root): an existing directory is local; ``owner/name`` otherwise is a Hub id."""
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "meta" / "info.json").is_file():
            raise DatasetError(f"{path} is not a LeRobotDataset (no meta/info.json); pass the dataset's root directory")
        return LOCAL_REPO_ID, path
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return source, None
    raise DatasetError(f"dataset {source!r} is neither an existing directory nor a Hugging Face Hub id (owner/name)")


def load_logged_dataset(source: str, episodes: list[int] | None = None) -> LoggedDataset:
    """Metadata and the chosen episodes (all when ``episodes`` is None) of a LeRobotDataset v3."""
    # LeRobot's dataset code (the edge and learner extras): seconds to import, for a dataset read only
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    repo_id, root = resolve_source(str(source))
    try:
        meta = LeRobotDatasetMetadata(repo_id, root=root)
    except Exception as exc:  # hub and file errors come in many classes; all mean "cannot read it"
        raise DatasetError(f"could not read dataset {source!r} with lerobot ({type(exc).__name__}: {exc})") from exc
    _check_episodes(episodes, meta.total_episodes, source)
    features = meta.features
    for key in ("observation.state", "action"):
        if key not in features:
            raise DatasetError(f"dataset {source!r} has no {key!r} column; replay needs joint states and actions")
    try:
        arrays = load_episode_arrays(root, repo_id=repo_id, episodes=episodes)
    except Exception as exc:  # a missing or damaged data file: lerobot and pyarrow raise many classes
        raise DatasetError(f"could not read the episodes of dataset {source!r} ({type(exc).__name__}: {exc})") from exc
    return LoggedDataset(
        source=str(source),
        fps=int(meta.fps),
        state_names=feature_names(features["observation.state"], "observation.state"),
        action_names=feature_names(features["action"], "action"),
        cameras=tuple(k[len(IMAGE_PREFIX) :] for k in features if k.startswith(IMAGE_PREFIX)),
        episodes=[logged_episode(a) for a in arrays],
    )


def feature_names(feature: dict, key: str) -> tuple[str, ...]:
    """Joint names of a vector feature; LeRobot stores a list, or a dict like {"motors": [...]}."""
    names = vector_names(feature)
    if not names:
        raise DatasetError(f"column {key!r} does not name its joints, so they cannot be mapped onto the sim robot")
    width = int(np.prod(feature.get("shape", (len(names),))))
    if len(names) != width:
        raise DatasetError(f"column {key!r} has {width} values but names {len(names)} joints: {names}")
    return names


def logged_episode(arrays: dict) -> LoggedEpisode:
    """Our reader's per-episode dict -> a LoggedEpisode (optional columns become None)."""
    images = {k[len("images.") :]: v for k, v in arrays.items() if k.startswith("images.")}
    return LoggedEpisode(
        index=int(arrays["episode_index"]),
        instruction=str(arrays.get("instruction", "")),
        state=np.asarray(arrays["state"], np.float32),
        action=np.asarray(arrays["action"], np.float32),
        images=images,
        is_intervention=_column(arrays, "is_intervention", bool),
        policy_version=_column(arrays, "policy_version", np.int64),
        seed=_seed(arrays),
    )


def _column(arrays: dict, key: str, dtype) -> np.ndarray | None:
    if key not in arrays:
        return None
    return np.asarray(arrays[key]).reshape(len(arrays["state"]), -1)[:, 0].astype(dtype)


def _seed(arrays: dict) -> int | None:
    for key in SEED_COLUMNS:
        if key in arrays:
            value = int(np.asarray(arrays[key]).reshape(-1)[0])
            return value if value >= 0 else None
    return None


def _check_episodes(episodes: list[int] | None, total: int, source: str) -> None:
    if episodes is None:
        return
    bad = [e for e in episodes if not 0 <= int(e) < total]
    if bad:
        raise DatasetError(f"episodes {bad} are not in {source!r}, which has episodes 0..{total - 1}")
