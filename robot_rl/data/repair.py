"""Bring a LeRobotDataset v3 directory back to its last finalized state after a crash.

Why this is needed: LeRobot's ``save_episode`` rewrites ``meta/info.json`` (the episode
count) at once, but the episode's rows reach disk only through parquet writers that get
their footer at ``finalize()``. A process killed in between leaves ``info.json`` counting
episodes whose data and metadata files are unreadable, and LeRobot then refuses to load
*any* episode of the dataset. Writers here (``EpisodeRecorder``) only ever finalize whole
sessions, and each session writes new data and metadata files, so the torn part is always
the tail: the episodes after the last finalize.

``repair_interrupted_write`` keeps the episodes whose metadata and data files are readable,
moves the torn files aside (``<root>.interrupted/<time>/``, never deleted) and rewrites the
counts in ``info.json``. Whoever still holds the torn episodes (the learner's staging log)
writes them again. ``stats.json`` and ``tasks.parquet`` may still include the torn
episodes' values; both are aggregates and LeRobot loads them either way. In a video dataset the
torn episodes' MP4 files are moved aside too (see ``repair_interrupted_write``).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

log = logging.getLogger(__name__)

EPISODE_COLUMNS = ["episode_index", "length", "data/chunk_index", "data/file_index"]


class DatasetRepairError(RuntimeError):
    """The dataset is damaged in a way a crash of our writers cannot explain; nothing was changed."""


@dataclass
class RepairReport:
    """What ``repair_interrupted_write`` found and did."""

    episodes_kept: int
    episodes_dropped: int  # counted by info.json but not readable: written again by their owner
    moved: list[str] = field(default_factory=list)  # files moved aside, relative to the dataset root
    moved_to: Path | None = None


def repair_interrupted_write(root: str | Path) -> RepairReport:
    """Roll ``root`` back to its readable episodes if a write was interrupted; a no-op otherwise."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    counted = int(info["total_episodes"])
    video_keys = [key for key, ft in info.get("features", {}).items() if ft.get("dtype") == "video"]
    readable, torn_meta = _readable_episodes(root, video_keys)
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    good_data = {path for path in data_files if _parquet_readable(path)}
    kept = _longest_intact_prefix(info, root, readable, good_data)
    intact_after = [row["episode_index"] for row in readable[len(kept):] if _data_path(root, info, row) in good_data]
    if intact_after:
        # A killed writer leaves only unreadable rows after the first torn one; intact ones mean
        # older damage (a truncated or edited file), which rolling back would hide.
        raise DatasetRepairError(f"{root}: episode {len(kept)} is unreadable but later episodes {intact_after[:5]} "
                                 "are intact; this is not a write cut short, so nothing was changed: restore the "
                                 "damaged file from a backup, or record into a new directory")
    referenced = {_data_path(root, info, row) for row in kept}
    stray_data = [path for path in data_files if path not in referenced]
    # Each open of a dataset starts new video files, so the torn episodes' frames are only in files no
    # kept episode references; the next open would reuse those names and overwrite them, so they are
    # moved aside with the torn parquet: kept, not lost.
    referenced_videos = {_video_path(info, key, row) for row in kept for key in video_keys}
    stray_data += [path for path in sorted((root / "videos").glob("*/chunk-*/file-*.mp4"))
                   if path.relative_to(root).as_posix() not in referenced_videos]
    dropped_meta = torn_meta + _meta_files_of(root, readable[len(kept):])
    if len(kept) == counted and not stray_data and not dropped_meta:
        return RepairReport(episodes_kept=counted, episodes_dropped=0)
    shared = set(dropped_meta) & set(_meta_files_of(root, kept))
    if shared:
        raise DatasetRepairError(f"{root}: metadata file(s) {sorted(map(str, shared))} hold both intact and torn "
                                 "episodes; this is not a torn tail, so nothing was changed: restore the file from a "
                                 "backup, or record into a new directory")
    moved_to = root.parent / f"{root.name}.interrupted" / time.strftime("%Y%m%d-%H%M%S")
    moved = [_move_aside(path, root, moved_to) for path in sorted(set(dropped_meta)) + stray_data]
    info["total_episodes"] = len(kept)
    info["total_frames"] = int(sum(row["length"] for row in kept))
    info["splits"] = {"train": f"0:{len(kept)}"}
    tmp = info_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=4))
    tmp.replace(info_path)
    report = RepairReport(episodes_kept=len(kept), episodes_dropped=counted - len(kept), moved=moved,
                          moved_to=moved_to if moved else None)
    log.warning("%s: a write was interrupted (crash before finalize); kept %d episodes, rolled back %d, moved %d "
                "torn file(s) to %s", root, report.episodes_kept, report.episodes_dropped, len(moved), moved_to)
    return report


def _readable_episodes(root: Path, video_keys: list[str]) -> tuple[list[dict], list[Path]]:
    """Episode rows of every readable metadata file (sorted by index), and the unreadable files."""
    rows: list[dict] = []
    torn: list[Path] = []
    columns = EPISODE_COLUMNS + [f"videos/{key}/{part}" for key in video_keys for part in ("chunk_index", "file_index")]
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        try:
            table = pq.read_table(path, columns=columns)
        except Exception:  # noqa: BLE001 - a footer-less file from a killed writer
            torn.append(path)
            continue
        for row in table.to_pylist():
            rows.append({**row, "meta_file": path})
    rows.sort(key=lambda r: r["episode_index"])
    return rows, torn


def _longest_intact_prefix(info: dict, root: Path, rows: list[dict], good_data: set[Path]) -> list[dict]:
    """Episodes 0..k-1 with contiguous indices whose data file is readable."""
    kept: list[dict] = []
    for expected, row in enumerate(rows):
        if row["episode_index"] != expected or _data_path(root, info, row) not in good_data:
            break
        kept.append(row)
    return kept


def _meta_files_of(root: Path, rows: list[dict]) -> list[Path]:
    return sorted({row["meta_file"] for row in rows})


def _data_path(root: Path, info: dict, row: dict) -> Path:
    return root / info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])


def _video_path(info: dict, key: str, row: dict) -> str:
    return info["video_path"].format(video_key=key, chunk_index=row[f"videos/{key}/chunk_index"],
                                     file_index=row[f"videos/{key}/file_index"])


def _parquet_readable(path: Path) -> bool:
    try:
        pq.read_metadata(path)
        return True
    except Exception:  # noqa: BLE001 - no footer: the writer never closed it
        return False


def _move_aside(path: Path, root: Path, moved_to: Path) -> str:
    relative = path.relative_to(root)
    target = moved_to / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(target))
    return str(relative)
