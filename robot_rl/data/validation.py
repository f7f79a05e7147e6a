"""Check a LeRobotDataset v3's files before anything opens it, so a damaged one is one clear error.

Why before: LeRobot reads ``meta/info.json``, ``meta/tasks.parquet`` and ``meta/stats.json`` when a
dataset opens and its data files when episodes load (the learner reads its store into the sampling
index on a thread, behind a serving learner); a garbled byte in any of them surfaces there as a
bare ``UnicodeDecodeError`` or an Arrow error naming no file, or as a trainer that waits forever.
``check_dataset`` reads each file the way those readers will and raises ``CorruptFileError`` naming
the first that fails, what is wrong and what to do. It only reads: nothing is moved or rewritten.

What it lets through: a crash of a writer before its ``finalize`` leaves the newest data and
episodes files without their parquet footer; ``robot_rl.data.repair`` rolls those back when the
dataset opens. Such files are always the newest of their kind (each writing session starts new
files), so an unreadable file is damage only when a readable one of its kind comes after it.

What it reads: every metadata file whole; every data file's footer and its columns except the
images (numbers only, a small fraction of the bytes: the check costs little however large the
store); every video file's container (its header and index, not its frames). The frames are not
decoded here (they are most of the bytes): a damaged PNG or a garbled stretch of video surfaces when
its episode loads, and that episode is left out of training (``robot_rl.data.reader``'s
``on_unreadable``, the sampling index's quarantine), never the whole store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robot_rl.core.errors import CorruptFileError

INFO = Path("meta/info.json")
STATS = Path("meta/stats.json")
TASKS = Path("meta/tasks.parquet")
EPISODES_GLOB = "meta/episodes/chunk-*/file-*.parquet"
DATA_GLOB = "data/chunk-*/file-*.parquet"
VIDEO_GLOB = "videos/{key}/chunk-*/file-*.mp4"
FINITE_COLUMNS = ("observation.state", "action")  # what a policy trains on: NaN/inf there is damage
# The dataset's files are what the configuration points at; nothing else holds its episodes.
RESTORE = "restore it from a backup (nothing in the dataset was changed)"


def check_dataset(root: str | Path) -> None:
    """Raise ``CorruptFileError`` for the first file of the dataset at ``root`` that cannot be read
    as LeRobot will read it; a dataset not created yet (no ``meta/info.json``) passes."""
    root = Path(root)
    if not (root / INFO).is_file():
        return
    info = _check_info(root / INFO)
    _check_stats(root / STATS)
    if info.get("total_tasks", 0) > 0:  # LeRobot reads tasks.parquet only then
        _check_tasks(root / TASKS)
    image_columns = {key for key, feature in info["features"].items() if feature.get("dtype") == "image"}
    _check_parquet_files(sorted(root.glob(EPISODES_GLOB)), skip_columns=set())
    _check_parquet_files(sorted(root.glob(DATA_GLOB)), skip_columns=image_columns)
    for key in (key for key, feature in info["features"].items() if feature.get("dtype") == "video"):
        _check_newest_last(sorted(root.glob(VIDEO_GLOB.format(key=key))), _video_problem, "video")


def _check_newest_last(paths: list[Path], problem_of: Callable[[Path], str | None], kind: str) -> None:
    """An unreadable file passes only behind every readable one of its kind: the newest file of a
    writer killed mid-episode (opening the dataset rolls it back); before a readable one, it is damage."""
    unreadable: tuple[Path, str] | None = None
    for path in paths:
        problem = problem_of(path)
        if problem is None and unreadable is not None:
            torn, what = unreadable
            raise CorruptFileError(torn, f"not a readable {kind} file ({what}), but {path.name} after it is: a "
                                   "damaged file, not a write cut short",
                                   f"the episodes it holds cannot be read without it: {RESTORE}")
        if problem is not None:
            unreadable = unreadable or (path, problem)


def _video_problem(path: Path) -> str | None:
    """None: the container opens and holds a video stream; else what is wrong."""
    import av  # PyAV: LeRobot's video dependency, present wherever a dataset stores video

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return "it holds no video stream"
    except Exception as exc:  # noqa: BLE001 - FFmpeg reports damage in many classes; all mean unreadable
        return f"{type(exc).__name__}: {exc}"
    return None


def _read_json(path: Path, remedy: str) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorruptFileError(path, f"not UTF-8 text ({exc})", remedy) from exc
    except json.JSONDecodeError as exc:
        raise CorruptFileError(path, f"not valid JSON ({exc})", remedy) from exc


# The keys and bounds LeRobot's ``DatasetInfo`` enforces when a dataset opens (lerobot/datasets/utils.py).
# Checked here without importing ``lerobot.datasets``: that import brings in transformers and
# torch._dynamo (~5 s on a robot PC's CPU), which a restarting learner would pay before it serves;
# the store's writer and its index loader import it anyway, off the serving path.
REQUIRED_INFO = {"codebase_version": str, "fps": int, "features": dict}
POSITIVE_INFO = ("fps", "chunks_size", "data_files_size_in_mb", "video_files_size_in_mb")


def _check_info(path: Path) -> dict[str, Any]:
    """``info.json`` with what LeRobot's ``DatasetInfo`` requires: fps, features, version and sizes."""
    remedy = f"LeRobot cannot open the dataset without it: {RESTORE}"
    info = _read_json(path, remedy)
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise CorruptFileError(path, "holds no features (it is not a LeRobot dataset's info.json)", remedy)
    for key, kind in REQUIRED_INFO.items():
        if not isinstance(info.get(key), kind):
            raise CorruptFileError(path, f"{key!r} is {info.get(key)!r}, not a {kind.__name__}", remedy)
    if not all(isinstance(feature, dict) for feature in info["features"].values()):
        raise CorruptFileError(path, "'features' holds an entry that is not a dictionary", remedy)
    for key in POSITIVE_INFO:
        value = info.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CorruptFileError(path, f"{key!r} is {value!r}, not a positive integer", remedy)
    return info


def _check_stats(path: Path) -> None:
    if not path.is_file():
        return  # LeRobot opens a dataset without statistics
    remedy = (f"move it aside (the dataset opens without it; LeRobot aggregates the statistics of the episodes "
              f"written next) or {RESTORE}")
    if not isinstance(_read_json(path, remedy), dict):
        raise CorruptFileError(path, "not a dictionary of feature statistics", remedy)


def _check_tasks(path: Path) -> None:
    remedy = f"every episode's instruction is read from it: {RESTORE}"
    if not path.is_file():
        raise CorruptFileError(path, "missing, but info.json counts tasks", remedy)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # Arrow reports damage in several classes; all mean unreadable
        raise CorruptFileError(path, f"not a readable parquet file ({type(exc).__name__}: {exc})", remedy) from exc
    if "task_index" not in table.column_names:
        raise CorruptFileError(path, f"has no task_index column (columns {table.column_names})", remedy)


def _check_parquet_files(paths: list[Path], skip_columns: set[str]) -> None:
    """Each file whole but ``skip_columns``; an unreadable one passes only behind every readable one
    (the newest files of a writer cut short, which opening the dataset rolls back)."""
    unreadable: tuple[Path, Exception] | None = None
    for path in paths:
        problem = _parquet_problem(path, skip_columns)
        if problem is None and unreadable is not None:
            torn, exc = unreadable
            raise CorruptFileError(torn, f"not a readable parquet file ({type(exc).__name__}: {exc}), but "
                                   f"{path.name} after it is: a damaged file, not a write cut short",
                                   f"the episodes it holds cannot be read without it: {RESTORE}")
        if problem is None:
            continue
        if isinstance(problem, str):  # its footer is there: the writer finished it, the damage came later
            raise CorruptFileError(path, problem, f"the episodes it holds cannot be read without it: {RESTORE}")
        unreadable = unreadable or (path, problem)


def _parquet_problem(path: Path, skip_columns: set[str]) -> str | Exception | None:
    """None: readable. An exception: no readable footer (torn, or damaged). A string: the footer
    reads, but a column does not, or holds NaN/inf where a policy trains."""
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - a footer-less file from a killed writer, or damage
        return exc
    columns = [name for name in parquet.schema_arrow.names if name not in skip_columns]
    try:
        table = parquet.read(columns=columns)
    except Exception as exc:  # noqa: BLE001 - a garbled page: Arrow reports it in several classes
        return f"a column cannot be read ({type(exc).__name__}: {exc})"
    for name in FINITE_COLUMNS:
        if name in table.column_names and table.num_rows:
            column = table.column(name).combine_chunks()
            values = np.asarray(column.flatten() if pa.types.is_nested(column.type) else column, np.float64)
            finite = np.isfinite(values.reshape(table.num_rows, -1)).all(axis=1)
            if not finite.all():
                return f"column {name} holds NaN/inf (row {int(np.flatnonzero(~finite)[0])}), which no stored step does"
    return None
