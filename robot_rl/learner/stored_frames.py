"""Frames of stored episodes read back by frame number: what the sampling index let go of.

Why by frame: a training batch needs one or two frames of each episode it samples (the observation
and the next chunk boundary's), so reading whole episodes back would decode ~hundreds of frames
for two. A video-stored camera (LeRobot's MP4, one file holding many episodes) is decoded at the
frames' numbers by torchcodec (LeRobot's video decoder); a PNG-stored one (inside the parquet) has the rows'
PNG bytes read and decoded. Frames come back at the policy's input size (``InputFrames``), the
size the index kept them at before it let them go: a lossless (PNG) frame read back equals the
one that was kept, bit for bit.

``FrameReader`` runs the reads on worker processes: decoding holds the interpreter, which the
trainer and the store's serving thread need. A worker imports torch and torchcodec, not
``lerobot.datasets`` (~370 MB more of each worker); the workers are started ahead of the first read
(``start``: the index calls it halfway to its memory budget), so their start (seconds) never stalls a
batch and their memory is there from early on, not growing mid-run. Frames that do not decode (a damaged PNG, a garbled
video) are ``UnreadableFramesError`` naming the episode and the file: the sampling index leaves that
episode out of training, where a bare decoder error would stop the trainer for good.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_rl.core.ctrl_c import ignore_ctrl_c
from robot_rl.core.errors import CorruptFileError
from robot_rl.core.heap import map_big_blocks, release_free_heap
from robot_rl.core.parent_watch import exit_when_parent_dies
from robot_rl.data.reader import IMAGE_PREFIX
from robot_rl.policies.trainable import InputFrames


@dataclass(frozen=True)
class StoredEpisode:
    """Where an episode's frames are on disk: a LeRobotDataset v3 and the episode's index in it."""

    root: str
    repo_id: str
    episode_index: int


log = logging.getLogger(__name__)

FrameRequest = Mapping[str, Sequence[int]]  # camera -> frame numbers within the episode
LEFT_OUT = "the episode is left out of training (the rest trains on); restore the file from a backup"


class UnreadableFramesError(RuntimeError):
    """Frames of ``episode`` that do not decode; ``cause`` names the file and what is wrong."""

    def __init__(self, episode: StoredEpisode, cause: CorruptFileError) -> None:
        self.episode = episode
        self.cause = cause
        super().__init__(f"episode {episode.episode_index} of {episode.root}: {cause}")

OPEN_VIDEO_FILES = 16  # per process: video files whose decoders stay open (~3 MB each at 640x480)
_DATASETS: dict[str, _DatasetFiles] = {}  # per process: each dataset's file layout, reread when it grew
_DECODERS: dict[str, tuple[tuple[int, int], Any]] = {}  # path -> (its size and mtime, its open decoder)
_EPISODE_COLUMNS = ("episode_index", "dataset_from_index", "data/chunk_index", "data/file_index")


@dataclass
class _DatasetFiles:
    """Where a LeRobotDataset v3 keeps each episode's frames: its ``meta/info.json`` path templates and
    the rows of ``meta/episodes`` (which file, from which row or timestamp).

    Read here with pyarrow rather than through LeRobot's ``LeRobotDatasetMetadata``: importing
    ``lerobot.datasets`` brings in transformers and torchvision's models, ~370 MB of every reader
    process (and seconds to start one), to look up a few numbers per episode.
    """

    fps: int
    data_path: str
    video_path: str | None
    video_keys: tuple[str, ...]
    episodes: dict[int, dict[str, Any]]

    @classmethod
    def read(cls, root: Path) -> _DatasetFiles:
        import pyarrow.parquet as pq  # pyarrow: LeRobot's parquet dependency

        info = json.loads((root / "meta" / "info.json").read_text())
        video_keys = tuple(k for k, f in info["features"].items() if f.get("dtype") == "video")
        columns = [*_EPISODE_COLUMNS, *(f"videos/{k}/{c}" for k in video_keys
                                        for c in ("chunk_index", "file_index", "from_timestamp"))]
        episodes = {}
        for path in sorted((root / "meta" / "episodes").glob("*/*.parquet")):
            for row in pq.read_table(path, columns=columns).to_pylist():
                episodes[int(row["episode_index"])] = row
        return cls(int(info["fps"]), info["data_path"], info.get("video_path"), video_keys, episodes)

    def episode(self, root: str, index: int) -> dict[str, Any]:
        if index not in self.episodes:
            raise LookupError(f"dataset {root} holds {len(self.episodes)} episodes, not episode {index}")
        return self.episodes[index]


def _dataset_files(episode: StoredEpisode) -> _DatasetFiles:
    files = _DATASETS.get(episode.root)
    if files is None or episode.episode_index not in files.episodes:
        files = _DATASETS[episode.root] = _DatasetFiles.read(Path(episode.root))
    return files


def read_stored_frames(episode: StoredEpisode, wanted: FrameRequest,
                       fits: Mapping[str, InputFrames]) -> dict[str, np.ndarray]:
    """uint8 [len(wanted[cam]),h,w,3] per camera: the episode's frames by number, fitted to ``fits``."""
    files = _dataset_files(episode)
    row = files.episode(episode.root, episode.episode_index)
    out = {}
    for cam, frames in wanted.items():
        key = f"{IMAGE_PREFIX}{cam}"
        numbers = [int(i) for i in frames]
        video = key in files.video_keys and files.video_path is not None
        if video:
            path = Path(episode.root) / str(files.video_path).format(
                video_key=key, chunk_index=row[f"videos/{key}/chunk_index"],
                file_index=row[f"videos/{key}/file_index"])
        else:
            path = Path(episode.root) / files.data_path.format(chunk_index=row["data/chunk_index"],
                                                               file_index=row["data/file_index"])
        try:
            if video:
                images = _decode_video(path, files.fps, float(row[f"videos/{key}/from_timestamp"]), numbers)
            else:
                images = _decode_png_rows(path, key, int(row["dataset_from_index"]), numbers)
        except Exception as exc:  # PIL, Arrow and torchcodec each report damage in classes of their own
            raise CorruptFileError(path, f"frames of episode {episode.episode_index} ({cam}) do not decode "
                                   f"({type(exc).__name__}: {exc})", LEFT_OUT) from exc
        fit = fits.get(cam)
        out[cam] = fit.apply(images) if fit is not None else images
    return out


def _decode_video(path: Path, fps: int, start_s: float, numbers: list[int]) -> np.ndarray:
    """The frames by number, through torchcodec (LeRobot's video decoder): it seeks to each frame, where
    decoding from the first frame asked to the last would be hundreds of 640x480 frames for two. A frame
    is looked up by its number in the file, as LeRobot's ``decode_video_frames_torchcodec`` does, and
    must play within half a frame period of the time asked. The decoder of a file stays open between
    reads until the file changes (the store rewrites the file it appends episodes to; the others never
    change)."""
    unique = sorted(set(numbers))  # once each, in order
    stamps = torch.tensor([start_s + i / fps for i in unique], dtype=torch.float64)
    decoder = _decoder_for(path)
    batch = decoder.get_frames_at(indices=[round(float(t) * decoder.metadata.average_fps) for t in stamps])
    off = (batch.pts_seconds.to(torch.float64) - stamps).abs()
    if bool((off >= 0.5 / fps).any()):
        worst = int(off.argmax())
        raise ValueError(f"frame {unique[worst]} plays at {float(batch.pts_seconds[worst]):.4f} s, not at "
                         f"{float(stamps[worst]):.4f} s: the file's timestamps do not match the dataset's")
    frames = batch.data.numpy()  # [N, H, W, 3]: the decoder writes NHWC
    where = {n: i for i, n in enumerate(unique)}
    return np.ascontiguousarray(frames[[where[n] for n in numbers]])


def _decoder_for(path: Path) -> Any:
    """``path``'s open decoder while the file is unchanged (size and mtime), the least recently used of
    more than ``OPEN_VIDEO_FILES`` closed."""
    from torchcodec.decoders import VideoDecoder  # torchcodec: LeRobot's video dependency (its dataset extra)

    stat = path.stat()
    signature = (stat.st_mtime_ns, stat.st_size)
    known = _DECODERS.pop(str(path), None)
    if known is None or known[0] != signature:
        known = (signature, VideoDecoder(str(path), dimension_order="NHWC", seek_mode="approximate"))
    _DECODERS[str(path)] = known  # most recently used last
    while len(_DECODERS) > OPEN_VIDEO_FILES:
        _DECODERS.pop(next(iter(_DECODERS)))
    return known[1]


def _decode_png_rows(path: Path, key: str, first_row: int, numbers: list[int]) -> np.ndarray:
    import pyarrow.compute as pc  # pyarrow: LeRobot's parquet dependency
    import pyarrow.parquet as pq
    from PIL import Image  # pillow: LeRobot's image dependency

    rows = [first_row + i for i in numbers]
    table = pq.read_table(path, columns=["index", key], filters=[("index", "in", sorted(set(rows)))])
    by_row = dict(zip(pc.cast(table["index"], "int64").to_pylist(), table[key].to_pylist(), strict=True))
    return np.stack([np.asarray(Image.open(io.BytesIO(by_row[r]["bytes"])).convert("RGB")) for r in rows])


class FrameReader:
    """Reads the frames of several stored episodes side by side on ``workers`` processes (0: in the
    calling thread). Workers are started by ``spawn``: the learner's process runs threads, which a
    forked child would inherit mid-lock."""

    def __init__(self, fits: Mapping[str, InputFrames], workers: int) -> None:
        if workers < 0:
            raise ValueError(f"FrameReader: workers must be >= 0, got {workers}")
        self.fits = dict(fits)
        self.workers = workers
        self._pool = self._new_pool()
        self._started = False

    def _new_pool(self) -> ProcessPoolExecutor | None:
        if self.workers == 0:
            return None
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker)

    def start(self) -> None:
        """Start the worker processes and their imports now, without waiting for them (idempotent)."""
        if self._pool is None or self._started:
            return
        self._started = True
        for _ in range(self.workers):  # each submit finds no idle worker yet, so each starts one
            self._pool.submit(_ready)

    def read(self, requests: Mapping[StoredEpisode, FrameRequest]) -> dict[StoredEpisode, dict[str, np.ndarray]]:
        """Each episode's frames; ``UnreadableFramesError`` for the first whose frames do not decode."""
        if self._pool is None:
            return {episode: _result(episode, functools.partial(read_stored_frames, episode, wanted, self.fits))
                    for episode, wanted in requests.items()}
        try:
            return self._read_on_workers(self._pool, requests)
        except BrokenProcessPool:
            # A worker died (killed for memory, or by hand): the pool takes no more work, and training would
            # stop for good. New workers read the batch again; a second death in a row is the error.
            log.error("a frame reader process died; starting new ones and reading the batch again")
            broken, self._pool = self._pool, self._new_pool()
            broken.shutdown(wait=False, cancel_futures=True)
            return self._read_on_workers(self._pool, requests)

    def _read_on_workers(self, pool: ProcessPoolExecutor | None,
                         requests: Mapping[StoredEpisode, FrameRequest]) -> dict[StoredEpisode, dict[str, np.ndarray]]:
        assert pool is not None
        futures = {episode: pool.submit(_read_on_worker, episode, wanted, self.fits)
                   for episode, wanted in requests.items()}
        return {episode: _result(episode, future.result) for episode, future in futures.items()}

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (their memory is the learner's too: ``robot-rl bench soak``)."""
        return [] if self._pool is None else [p.pid for p in getattr(self._pool, "_processes", {}).values()
                                              if p.pid is not None]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# A worker hands its heap's free memory back to the system every this many reads. Decoding allocates
# and frees 640x480 frames by the hundred; glibc keeps what was freed, fragmented, and a worker's
# memory grew by ~1 GB in 20 minutes of training without it (flat with it: `robot-rl bench soak`).
# Every read would cost a heap walk each (~10 ms); every 20th costs under a millisecond a read.
TRIM_EVERY_READS = 20
_reads = 0  # per worker process


def _read_on_worker(episode: StoredEpisode, wanted: FrameRequest,
                    fits: Mapping[str, InputFrames]) -> dict[str, np.ndarray]:
    global _reads
    try:
        return read_stored_frames(episode, wanted, fits)
    finally:
        _reads += 1
        if _reads % TRIM_EVERY_READS == 0:
            release_free_heap()


def _start_worker() -> None:
    """A worker's first act: it ends with the learner, and leaves a terminal's Ctrl-C to it."""
    ignore_ctrl_c()
    exit_when_parent_dies("frame reader")


def _ready() -> int:
    """A worker's first job: the imports its reads need, before a batch waits on them."""
    import pyarrow.parquet  # noqa: F401 - pyarrow: LeRobot's parquet dependency
    import torchcodec.decoders  # noqa: F401 - torchcodec: LeRobot's video dependency
    from PIL import Image  # noqa: F401 - pillow: LeRobot's image dependency

    map_big_blocks()  # the decoded 640x480 frames
    return os.getpid()


def _result(episode: StoredEpisode, read: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    try:
        return read()
    except CorruptFileError as exc:
        raise UnreadableFramesError(episode, exc) from exc
