"""Episodes on disk as LeRobotDataset v3 (written and read with ``lerobot``), with
robot_rl's extra per-step columns so LeRobot tools read our data and we read theirs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_rl.core.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what the lazy exports below are, for type checkers
    from robot_rl.data.features import EXTRA_COLUMNS, dataset_features
    from robot_rl.data.reader import load_episode_arrays
    from robot_rl.data.recorder import EpisodeRecorder

# Exported lazily: importing one module of the package (the reader) must not import the
# recorder's LeRobot and parquet code with it.
_EXPORTS = {
    "EXTRA_COLUMNS": "features",
    "dataset_features": "features",
    "load_episode_arrays": "reader",
    "EpisodeRecorder": "recorder",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["EXTRA_COLUMNS", "EpisodeRecorder", "dataset_features", "load_episode_arrays"]
